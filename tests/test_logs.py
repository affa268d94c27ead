"""Request ids and the per-request JSON log line (``--log-format json``), through a real gateway."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.bench.loadgen import wait_http
from gateway.logs import REQUEST_LOGGER, JsonFormatter, RequestIds
from gateway.servers import free_port
from tests.conftest import Gateway, Upstreams, wait_for

SECRET = "the prompt text must never reach a log line"
CHAT: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": SECRET}], "max_tokens": 5}
REQUEST_FIELDS = {"request_id", "upstream_id", "path", "model", "pool", "reason", "task", "status", "ttft_s",
                  "total_s", "tokens", "retried"}  # fmt: skip


def _header(headers: dict[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name), None)


def request_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    formatter = JsonFormatter()
    records = [r for r in caplog.records if r.name == REQUEST_LOGGER]
    return [orjson.loads(formatter.format(r)) for r in records]


def test_request_ids_are_unique_short_and_unguessable() -> None:
    ids = RequestIds()
    made = [ids.make() for _ in range(10_000)]
    assert len(set(made)) == len(made)
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in made)
    # No part is shared or counted: over 2,000 ids every one of the 16 hex digits takes each of its 16 values
    # (a random digit misses one with probability about 16 * (15/16)**2000, 1e-55). A prefix and a counter,
    # which let one client guess the ids of the requests before and after its own, fail at the first digit.
    for position in range(16):
        assert len({i[position] for i in made[:2000]}) == 16, position
    assert not set(made) & {RequestIds().make() for _ in range(1000)}  # another instance: other ids


def test_a_request_id_is_made_returned_and_forwarded(gateway: Callable[..., Gateway], upstreams: Upstreams) -> None:
    gw = gateway()
    first = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT)
    second = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT)
    assert first.status_code == second.status_code == 200
    made = first.headers["x-request-id"]
    assert made and made != second.headers["x-request-id"]
    forwarded = [_header(u.last_headers, "x-request-id") for u in (upstreams.standard, upstreams.speculative)]
    assert second.headers["x-request-id"] in forwarded


@pytest.mark.parametrize("stream", [False, True])
def test_the_clients_request_id_is_kept(gateway: Callable[..., Gateway], upstreams: Upstreams, stream: bool) -> None:
    gw = gateway()
    body = {**CHAT, "stream": stream}
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers={"x-request-id": "client-id-42"})
    assert r.status_code == 200
    assert r.headers.get_list("x-request-id") == ["client-id-42"]  # once, even if the upstream echoes it
    pool = upstreams.standard if r.headers["x-specgate-pool"] == "standard" else upstreams.speculative
    assert _header(pool.last_headers, "x-request-id") not in (None, "client-id-42")  # the gateway's own upstream


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"], ids=["routed", "passthrough"])
def test_the_pool_gets_a_unique_id_whatever_the_client_sends(
    gateway: Callable[..., Gateway], upstreams: Upstreams, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """vLLM takes the forwarded x-request-id as its request id, which must be unique among the requests it runs:
    two requests with the same client id (two clients, or one client's retries) reach it with two ids. The
    client's id stays in the response and the log line, which names the id the pool got."""
    gw = gateway(log_format="json")
    body = CHAT if path != "/tokenize" else {"model": "fake-model", "prompt": SECRET}
    sent = []
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        for _ in range(2):
            r = httpx.post(f"{gw.url}{path}", json=body, headers={"x-request-id": "same-id"})
            assert r.status_code == 200 and r.headers.get_list("x-request-id") == ["same-id"]
            pool = upstreams.standard if r.headers["x-specgate-pool"] == "standard" else upstreams.speculative
            sent.append(r.json()["request_id"] if path == "/tokenize" else _header(pool.last_headers, "x-request-id"))
        wait_for(lambda: len(request_lines(caplog)) == 2, what="two request lines")
    assert len(set(sent)) == 2 and "same-id" not in sent and None not in sent
    lines = request_lines(caplog)
    assert [line["request_id"] for line in lines] == ["same-id", "same-id"]
    assert [line["upstream_id"] for line in lines] == sent


def test_a_made_id_is_the_one_the_pool_gets(gateway: Callable[..., Gateway], upstreams: Upstreams) -> None:
    gw = gateway()
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers={"x-request-id": ""})  # empty: none given
    made = r.headers["x-request-id"]
    pool = upstreams.standard if r.headers["x-specgate-pool"] == "standard" else upstreams.speculative
    assert len(made) == 16 and _header(pool.last_headers, "x-request-id") == made


def test_a_rejected_request_has_an_id_too(gateway: Callable[..., Gateway]) -> None:
    gw = gateway()
    r = httpx.post(f"{gw.url}/v1/chat/completions", content=b"{not json", headers={"x-request-id": "bad-1"})
    assert r.status_code == 400 and r.headers["x-request-id"] == "bad-1"


def test_no_request_log_by_default(gateway: Callable[..., Gateway], caplog: pytest.LogCaptureFixture) -> None:
    gw = gateway()
    assert gw.app.state.request_log is None
    with caplog.at_level(logging.INFO):
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT).status_code == 200
    assert request_lines(caplog) == []


def test_json_log_has_one_line_per_request_and_no_prompt_text(
    gateway: Callable[..., Gateway], caplog: pytest.LogCaptureFixture
) -> None:
    gw = gateway(log_format="json")
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        ok = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}, headers={"x-request-id": "s1"})
        failed = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers={"x-fake-status": "500"})
        rejected = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "fake-model", "messages": "nope"})
        wait_for(lambda: len(request_lines(caplog)) == 3, what="three request lines")
    assert (ok.status_code, failed.status_code, rejected.status_code) == (200, 500, 400)
    lines = {line["request_id"]: line for line in request_lines(caplog)}
    assert set(lines) == {"s1", failed.headers["x-request-id"], rejected.headers["x-request-id"]}
    streamed = lines["s1"]
    assert set(streamed) >= REQUEST_FIELDS
    assert streamed["pool"] == ok.headers["x-specgate-pool"] and streamed["reason"] == ok.headers["x-specgate-reason"]
    assert streamed["task"] == ok.headers["x-specgate-task"] and streamed["path"] == "/v1/chat/completions"
    assert streamed["status"] == 200 and streamed["tokens"] == 5 and not streamed["retried"]
    assert 0 < streamed["ttft_s"] <= streamed["total_s"]
    assert lines[failed.headers["x-request-id"]]["status"] == 500
    assert lines[rejected.headers["x-request-id"]] | {"total_s": 0} == {
        "ts": lines[rejected.headers["x-request-id"]]["ts"], "level": "info", "logger": REQUEST_LOGGER,
        "message": "request", "request_id": rejected.headers["x-request-id"], "path": "/v1/chat/completions",
        "pool": "none", "reason": "rejected", "status": 400, "error": "invalid_request_error", "total_s": 0,
    }  # fmt: skip
    assert SECRET not in caplog.text and all(SECRET not in orjson.dumps(line).decode() for line in lines.values())


def test_serve_writes_json_lines(upstreams: Upstreams, tmp_path: Path) -> None:
    """The real command: every stderr line is JSON, the start-up summary included, and requests are logged."""
    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--standard", upstreams.standard_url,
           "--speculative", upstreams.speculative_url, "--port", str(port), "--log-format", "json"]  # fmt: skip
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log, subprocess.Popen(cmd, stdout=log, stderr=log) as proc:
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(url + "/health", timeout_s=30)
            r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": "cli-1"})
            assert r.status_code == 200

            def logged() -> list[dict[str, Any]]:
                return [orjson.loads(line) for line in log_path.read_text().splitlines() if line.strip()]

            wait_for(lambda: any(e.get("request_id") == "cli-1" for e in logged()), 10, "the request's log line")
        finally:
            proc.terminate()
            proc.wait(10)
    entries = logged()
    assert any("start-up" in e["message"] for e in entries)
    (line,) = [e for e in entries if e.get("request_id") == "cli-1"]
    assert line["status"] == 200 and line["pool"] == r.headers["x-specgate-pool"]
    assert SECRET not in log_path.read_text()
