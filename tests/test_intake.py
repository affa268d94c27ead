"""gateway/intake.py: request-head limit, read deadline, OpenAI-shaped refusals; slow clients starve nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import orjson

from tests.conftest import Gateway
from tests.fuzz.cases import Case, request, valid_request
from tests.fuzz.runner import close_all, send_case, slow_heads

StartGateway = Callable[..., Gateway]


def address(gw: Gateway) -> tuple[str, int]:
    url = urlsplit(gw.url)
    return url.hostname or "127.0.0.1", url.port or 80


def openai_error(body: bytes) -> dict[str, object]:
    error: dict[str, object] = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


async def test_hundreds_of_stalled_heads_do_not_starve_valid_requests(gateway: StartGateway) -> None:
    gw = gateway(client_read_timeout_s=60.0)
    host, port = address(gw)
    stalled = await slow_heads(host, port, 300)
    try:
        latencies = []
        for _ in range(30):
            started = time.monotonic()
            outcome = await send_case(host, port, Case("valid", valid_request()), 10.0)
            latencies.append(time.monotonic() - started)
            assert outcome.status == 200
        assert not any(w.transport.is_closing() for w in stalled)  # all 300 still connected meanwhile
        latencies.sort()
        assert latencies[len(latencies) // 2] < 0.5, latencies  # median; a loaded CI machine may stall one
    finally:
        close_all(stalled)


async def test_stalled_clients_are_answered_408_and_cut_at_the_read_deadline(gateway: StartGateway) -> None:
    gw = gateway(client_read_timeout_s=1.0)
    host, port = address(gw)
    head = valid_request()
    chunked_head = request(b"", headers=[("Transfer-Encoding", "chunked")]).replace(b"Content-Length: 0\r\n", b"")
    cases = [
        Case("idle", b"", mode="stall"),
        Case("half a head", head[:40], mode="stall"),
        Case("half a body", head[:-20], mode="stall"),
        Case("no last chunk", chunked_head + b'5\r\n{"a":\r\n', mode="stall"),
    ]
    started = time.monotonic()
    outcomes = await asyncio.gather(*(send_case(host, port, c, 10.0) for c in cases * 25))
    assert time.monotonic() - started < 6.0
    for outcome in outcomes:
        assert outcome.status == 408, (outcome.case.category, outcome.status)
        assert openai_error(outcome.body)["code"] == "request_timeout"
    assert (await send_case(host, port, Case("valid", head), 10.0)).status == 200


async def test_a_head_past_the_limit_is_refused_431(gateway: StartGateway) -> None:
    gw = gateway(client_max_head_bytes=8192)
    host, port = address(gw)
    fits = await send_case(host, port, Case("fits", request(b"{}", headers=[("x-pad", "a" * 7000)])), 10.0)
    assert fits.status == 400  # read, parsed, refused for its body
    for pad in (9000, 200_000):
        big = await send_case(host, port, Case("big", request(b"{}", headers=[("x-pad", "a" * pad)])), 10.0)
        assert big.status == 431
        assert openai_error(big.body)["code"] == "request_head_too_large"
    many = [(f"x-h{i}", "v") for i in range(2000)]
    assert (await send_case(host, port, Case("many", request(b"{}", headers=many)), 10.0)).status == 431


async def test_a_request_the_http_parser_refuses_gets_400_in_openai_shape(gateway: StartGateway) -> None:
    gw = gateway()
    host, port = address(gw)
    bad = await send_case(host, port, Case("bad", b"POST /v1/chat/completions HTTP/9\r\n\r\n"), 10.0)
    assert bad.status == 400 and openai_error(bad.body)["code"] == "invalid_http"
