"""OpenTelemetry tracing (``SPECGATE_TRACING=otel``): spans read back from the SDK's in-memory exporter."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.cli import main
from tests.conftest import Gateway, Upstreams, wait_for

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "translate into english: 早上好"}],
        "max_tokens": 64}  # fmt: skip


@pytest.fixture
def traced(
    gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., tuple[Gateway, InMemorySpanExporter]]:
    def start(**overrides: object) -> tuple[Gateway, InMemorySpanExporter]:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")  # nothing to send to; spans go to memory only
        gw = gateway(tracing="otel", **overrides)
        exporter = InMemorySpanExporter()
        assert gw.app.state.tracer is not None
        gw.app.state.tracer.provider.add_span_processor(SimpleSpanProcessor(exporter))
        return gw, exporter

    return start


def finished(exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    wait_for(lambda: len(exporter.get_finished_spans()) >= count, what=f"{count} finished spans")
    return list(exporter.get_finished_spans())


def _header(headers: dict[str, str], name: str) -> str:
    return next(v for k, v in headers.items() if k.lower() == name)


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_span_with_the_decision_and_an_upstream_child(
    traced: Callable[..., tuple[Gateway, InMemorySpanExporter]], upstreams: Upstreams, stream: bool
) -> None:
    gw, exporter = traced()
    headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "x-request-id": "trace-1"}
    r = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": stream}, headers=headers)
    assert r.status_code == 200
    spans = {s.kind: s for s in finished(exporter, 2)}
    request, upstream = spans[SpanKind.SERVER], spans[SpanKind.CLIENT]
    assert request.name == "POST /v1/chat/completions" and upstream.name == "upstream"
    assert request.context is not None and upstream.context is not None and request.parent is not None
    assert f"{request.context.trace_id:032x}" == CLIENT_TRACE and f"{request.parent.span_id:016x}" == CLIENT_SPAN
    assert upstream.parent is not None and upstream.parent.span_id == request.context.span_id
    attrs = request.attributes or {}
    assert attrs["specgate.pool"] == r.headers["x-specgate-pool"] == "speculative"
    assert attrs["specgate.reason"] == r.headers["x-specgate-reason"]
    assert attrs["specgate.task"] == "translation" and attrs["specgate.rule"] == "draft-friendly-task"
    assert attrs["gen_ai.usage.output_tokens"] == 64 and attrs["http.response.status_code"] == 200
    assert attrs["specgate.request_id"] == "trace-1" and attrs["gen_ai.request.model"] == "fake-model"
    assert attrs["gen_ai.request.max_tokens"] == 64 and isinstance(attrs["specgate.ttft_s"], float)
    assert request.status.status_code is StatusCode.UNSET
    assert (upstream.attributes or {})["server.address"] == upstreams.speculative_url
    # The pool got the upstream span's context: its own spans would continue this trace.
    sent = _header(upstreams.speculative.last_headers, "traceparent")
    assert sent == f"00-{CLIENT_TRACE}-{upstream.context.span_id:016x}-01"


def test_a_retry_is_a_second_upstream_span(traced: Callable[..., tuple[Gateway, InMemorySpanExporter]]) -> None:
    gw, exporter = traced()
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers={"x-fake-reset": "1"})
    assert r.status_code == 502
    spans = finished(exporter, 3)
    request = next(s for s in spans if s.kind is SpanKind.SERVER)
    attempts = sorted((s for s in spans if s.kind is SpanKind.CLIENT), key=lambda s: s.start_time or 0)
    assert len(attempts) == 2
    assert [(s.attributes or {})["specgate.pool"] for s in attempts] == ["speculative", "standard"]
    assert all(s.status.status_code is StatusCode.ERROR for s in [*attempts, request])
    assert (request.attributes or {})["specgate.retried"] is True


def test_tracing_off_imports_no_opentelemetry() -> None:
    code = (
        "import sys, httpx\n"
        "from gateway.app import create_app\n"
        "from gateway.config import Settings\n"
        "app = create_app(Settings(standard_urls=['http://127.0.0.1:9']))\n"
        "assert app.state.tracer is None and app.state.request_log is None\n"
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk.trace', 'opentelemetry.exporter', "
        "'gateway.tracing'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    # Where OpenTelemetry is installed, FastAPI imports its API (fastapi.telemetry) and redis-py its metrics SDK
    # (redis.observability) on their own; the trace SDK, the exporter and gateway.tracing are what tracing adds.
    assert out.stdout.strip() == "[]"


def test_serve_names_the_extra_when_opentelemetry_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "gateway.tracing", None)  # what an install without the extra sees
    monkeypatch.setenv("SPECGATE_TRACING", "otel")
    code = main(["serve", "--standard", "http://127.0.0.1:9"])
    assert code == 2
    assert "pip install 'specgate[otel]'" in capsys.readouterr().err


def test_without_a_client_traceparent_the_request_span_is_a_root(
    traced: Callable[..., tuple[Gateway, InMemorySpanExporter]], upstreams: Upstreams
) -> None:
    gw, exporter = traced()
    assert httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT).status_code == 200
    spans = {s.kind: s for s in finished(exporter, 2)}
    request, upstream = spans[SpanKind.SERVER], spans[SpanKind.CLIENT]
    assert request.parent is None and request.context is not None and upstream.context is not None
    version, trace_id, parent_id, flags = _header(upstreams.speculative.last_headers, "traceparent").split("-")
    assert (version, trace_id) == ("00", f"{request.context.trace_id:032x}")
    assert parent_id == f"{upstream.context.span_id:016x}"
    assert int(flags, 16) & 1  # sampled (the SDK may also set W3C level 2's random-trace-id flag)
