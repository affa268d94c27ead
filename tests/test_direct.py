"""The streaming relay's direct path (uvicorn protocol extension + the raw client's pipe), through a real gateway."""

from __future__ import annotations

import gc
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.direct import DirectBody
from tests.conftest import Gateway, Upstreams, wait_for

StartGateway = Callable[..., Gateway]


@pytest.fixture
def direct_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts DirectBody writes and drains (the gateway runs in this process, in a thread)."""
    calls = {"write": 0, "drain": 0}
    write, drain = DirectBody.write, DirectBody.drain

    def counting_write(self: DirectBody, body: bytes) -> bool:
        calls["write"] += 1
        return write(self, body)

    async def counting_drain(self: DirectBody) -> None:
        calls["drain"] += 1
        await drain(self)

    monkeypatch.setattr(DirectBody, "write", counting_write)
    monkeypatch.setattr(DirectBody, "drain", counting_drain)
    return calls


# Paced, so events arrive after the relay has started piping (a burst may come whole with the first read).
PACED = {"x-fake-chunks": "32", "x-fake-interval": "0.002"}


def stream_body(**extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "hi"}], **extra}


def event_indices(lines: list[str]) -> list[int]:
    events = [orjson.loads(line[6:]) for line in lines if line.startswith("data: {")]
    return [int(e["choices"][0]["delta"]["content"][1:].strip()) for e in events if e["choices"]]


def test_default_gateway_relays_streams_through_the_direct_writer(
    gateway: StartGateway, upstreams: Upstreams, direct_calls: dict[str, int]
) -> None:
    gw = gateway()
    body = stream_body(stream_options={"include_usage": True})
    with (
        httpx.Client(base_url=gw.url, timeout=10) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=PACED) as r,
    ):
        lines = [line for line in r.iter_lines() if line]
    assert r.status_code == 200 and r.headers["x-accel-buffering"] == "no"
    assert event_indices(lines) == list(range(32)) and lines[-1] == "data: [DONE]"
    assert direct_calls["write"] >= 1
    # the relay ended cleanly and counted tokens from the relayed bytes: TPOT observed once
    wait_for(lambda: gw.sample("specgate_tpot_seconds_count", pool="standard") == 1, what="request recorded")


def test_aiohttp_client_relays_through_plain_asgi_send(
    gateway: StartGateway, upstreams: Upstreams, direct_calls: dict[str, int]
) -> None:
    gw = gateway(upstream_client="aiohttp")
    with (
        httpx.Client(base_url=gw.url, timeout=10) as client,
        client.stream("POST", "/v1/chat/completions", json=stream_body(), headers={"x-fake-chunks": "16"}) as r,
    ):
        lines = [line for line in r.iter_lines() if line]
    assert event_indices(lines) == list(range(16)) and direct_calls["write"] == 0


def read_chunked_events(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything the socket sends until the gateway ends the chunked body (fails past ``timeout_s``)."""
    data = bytearray()
    deadline = time.monotonic() + timeout_s
    while not data.endswith(b"0\r\n\r\n"):
        assert time.monotonic() < deadline, f"only {len(data)} bytes after {timeout_s} s"
        part = sock.recv(1 << 20)
        if not part:
            break
        data += part
    return bytes(data)


def test_slow_client_pauses_the_relay_and_still_gets_every_event(
    gateway: StartGateway, upstreams: Upstreams, direct_calls: dict[str, int]
) -> None:
    gw = gateway()
    count = 20000  # about 3 MB of events: more than the loopback socket buffers hold
    host, port = gw.url.removeprefix("http://").split(":")
    payload = orjson.dumps(stream_body())
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"x-fake-chunks: {count}\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.sendall(request)
        deadline = time.monotonic() + 20
        while direct_calls["drain"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # read nothing until the gateway has had to wait for this client
        assert direct_calls["drain"] >= 1, "the relay never waited for the slow client"
        # read the rest quickly: a 4 KiB window would crawl on a loaded machine (delayed ACKs, GIL hand-offs)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.settimeout(20)
        raw = read_chunked_events(sock, timeout_s=60)
    head, _, chunked = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    body = decode_chunked(chunked)
    lines = [line for line in body.decode().split("\n") if line]
    assert event_indices(lines) == list(range(count)) and lines[-1] == "data: [DONE]"


def decode_chunked(data: bytes) -> bytes:
    out = bytearray()
    at = 0
    while True:
        end = data.index(b"\r\n", at)
        size = int(data[at:end], 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2 : end + 2 + size]
        at = end + 2 + size + 2


@pytest.fixture
def saved_garbage() -> Iterator[Callable[[], list[object]]]:
    """Collector off while the test runs; the callable returns what a collection then finds unreachable."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)

    def collect() -> list[object]:
        gc.collect()
        found = list(gc.garbage)
        gc.garbage.clear()
        return found

    try:
        yield collect
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_requests_leave_no_reference_cycles(
    gateway: StartGateway, upstreams: Upstreams, saved_garbage: Callable[[], list[object]]
) -> None:
    """Each request's objects die by reference counting, so the cyclic collector has nothing to chase under load."""
    gw = gateway()
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        client.post("/v1/chat/completions", json=stream_body(stream=False))  # warm: lazily built objects
        saved_garbage()
        for _ in range(20):
            assert client.post("/v1/chat/completions", json=stream_body(stream=False)).status_code == 200
            with client.stream("POST", "/v1/chat/completions", json=stream_body(), headers={"x-fake-chunks": "8"}) as r:
                assert len([line for line in r.iter_lines() if line]) == 9
        wait_for(lambda: gw.app.state.pools.total_booked() == 0, what="bookings released")
    per_request = ("gateway.", "uvicorn.protocols.", "httptools.")
    # the gateway's, not the test apparatus's (a fake upstream an earlier test left may be collected meanwhile)
    ours = [o for o in saved_garbage() if type(o).__module__.startswith(per_request)
            and not type(o).__module__.startswith("gateway.bench.")]  # fmt: skip
    assert not ours, sorted({type(o).__qualname__ for o in ours})


@pytest.mark.parametrize(
    ("missing", "internals"),
    [
        ("chunked_encoding_v2", "CYCLE_INTERNALS"),  # as if uvicorn renamed a cycle attribute
        ("write_paused_v2", "FLOW_INTERNALS"),  # or its flow control's
    ],
)
def test_missing_uvicorn_internals_fall_back_to_plain_send_with_one_log_line(
    gateway: StartGateway,
    direct_calls: dict[str, int],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    missing: str,
    internals: str,
) -> None:
    import gateway.direct as direct

    monkeypatch.setattr(direct, internals, (*getattr(direct, internals), missing))
    monkeypatch.setattr(direct.DirectBodyProtocol, "compatible", None)  # checked again at the next request
    gw = gateway()
    with caplog.at_level("WARNING", logger="specgate.direct"), httpx.Client(base_url=gw.url, timeout=10) as client:
        for _ in range(3):
            r = client.post("/v1/chat/completions", json=stream_body(), headers=PACED)
            assert r.status_code == 200
            assert event_indices(r.text.splitlines()) == list(range(32)) and r.text.endswith("data: [DONE]\n\n")
    assert direct_calls["write"] == 0  # every chunk went through ASGI send
    assert direct.DirectBodyProtocol.compatible is False
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "specgate.direct"]
    assert len(lines) == 1 and missing in lines[0] and "plain ASGI send" in lines[0]


def test_the_internals_the_fast_path_uses_are_all_there() -> None:
    """The pinned uvicorn has everything: a newer one that drops something fails here first."""
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    import gateway.direct as direct

    class FakeFlow:
        write_paused = False

        async def drain(self) -> None: ...

    cycle = object.__new__(RequestResponseCycle)
    for name in direct.CYCLE_INTERNALS:
        setattr(cycle, name, FakeFlow() if name == "flow" else None)
    assert direct.missing_internals(cycle) == []
    assert set(direct.CYCLE_INTERNALS) <= set(RequestResponseCycle.__init__.__code__.co_names)
