"""``specgate bench hooks``: the CPU per request of the optional request-path hooks, measured in-process.

The JSON request line (``--log-format json``: build, format, write to /dev/null), the request ids, and the
tracing hooks (``SPECGATE_TRACING=otel``: two spans and a ``traceparent``, through the SDK's batch processor to
an exporter that encodes each batch as OTLP protobuf and drops it, so the export thread's CPU counts), with
every span sampled and sampled at 10 %. The process CPU-time clock is read around ``n`` calls (best of
``repeat`` runs), so other processes' load counts far less than in wall time. ``specgate bench overhead
--targets specgate,specgate+json-logs,specgate+otel`` measures the same switches end to end.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from gateway.logs import JsonFormatter, RequestIds, RequestLog


def cpu_us(fn: Callable[[], object], n: int, repeat: int, flush: Callable[[], object] = lambda: None) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        for _ in range(n):
            fn()
        flush()
        best = min(best, (time.process_time() - started) / n)
    return best * 1e6


def finished_request() -> Any:
    """What the relay exposes when a request ends (the fields the hooks read)."""
    features = SimpleNamespace(task="translation", model="fake-model", prompt_tokens=12, max_tokens=64)
    return SimpleNamespace(
        request_id="4f1c2a9e0b7d-1", upstream_id="9a3e55d0c1b2f7e4", path="/v1/chat/completions", pool="speculative",
        status=200, ttft=0.01,
        reason="rule draft-friendly-task", tokens=64, retried=False, started=time.perf_counter(), features=features,
        decision=SimpleNamespace(rule="draft-friendly-task"), forward_headers={"content-type": "application/json"},
    )  # fmt: skip


def _tracing_rows(request: Any, n: int, repeat: int) -> list[tuple[str, float]]:
    try:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBasedTraceIdRatio, Sampler

        from gateway.tracing import RequestTracer
    except ImportError:
        print("tracing: skipped (pip install 'specgate[otel]')")
        return []

    class Encoding(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            encode_spans(spans).SerializeToString()
            return SpanExportResult.SUCCESS

    rows = []
    samplers: list[tuple[str, Sampler]] = [("all", ALWAYS_ON), ("10 %", ParentBasedTraceIdRatio(0.1))]
    for label, sampler in samplers:
        provider = TracerProvider(sampler=sampler)
        # A queue for every span of a run: with the default 2048 the SDK drops what the export thread has not
        # taken yet (its CPU would then go uncounted); a gateway at this rate needs sampling or OTEL_BSP_*.
        provider.add_span_processor(BatchSpanProcessor(Encoding(), max_queue_size=max(512, 2 * n)))
        tracer = RequestTracer(provider)

        def traced(tracer: RequestTracer = tracer) -> None:
            trace = tracer.begin(request)
            trace.upstream("speculative", "http://127.0.0.1:8000", request.forward_headers)
            trace.end(request)

        rows.append((f"tracing, sampled: {label}", cpu_us(traced, n, repeat, provider.force_flush)))
        provider.shutdown()
    return rows


def main(n: int, repeat: int) -> int:
    request = finished_request()
    ids = RequestIds()
    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 - closed below
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("specgate.bench.hooks")
    logger.propagate, logger.level = False, logging.INFO
    logger.addHandler(handler)
    try:
        log = RequestLog(logger)
        rows = [("request id (made)", cpu_us(ids.make, n, repeat)),
                ("JSON request line", cpu_us(lambda: log.finished(request), n, repeat))]  # fmt: skip
    finally:
        logger.removeHandler(handler)
        handler.stream.close()
    rows += _tracing_rows(request, n, repeat)
    print(f"CPU per request of the optional hooks (process CPU clock, best of {repeat} x {n} calls)")
    for name, value in rows:
        print(f"  {name:<28} {value:8.1f} us")
    return 0
