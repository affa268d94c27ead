"""Graceful shutdown of a real ``specgate serve`` process with streams in flight (gateway/shutdown.py)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from gateway.config import Settings
from gateway.shutdown import GracefulServer
from gateway.state import GatewayState
from tests.conftest import Gateway, wait_for
from tests.faults.procs import Load, Proc, fake_replica, gateway_proc, running, summary, wait_ready

pytestmark = pytest.mark.slow

STREAM = {"x-fake-chunks": "50", "x-fake-interval": "0.1"}  # ~5 s per stream: longer than the drain delay


def refused(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def _sigterm_with_streams_in_flight(gw: Proc, drain_delay_s: float) -> tuple[Load, list[int], float, int]:
    """16 workers (half streams) run; SIGTERM once every stream has started; returns the load, the /ready
    statuses seen during the drain delay, when the listener was seen closed after SIGTERM, and how many
    streams were still running then."""
    load = Load(gw.url, workers=16, stream_headers=STREAM, plain_headers={"x-fake-delay": "1.0"}, timeout_s=60)
    task = asyncio.create_task(load.run())
    while sum(1 for o in load.outcomes if o.stream and o.head_at is not None) < 8:  # noqa: ASYNC110 (polls data)
        await asyncio.sleep(0.05)
    assert gw.proc is not None
    load.stop.set()  # each worker finishes the request it has in flight, and sends no other
    gw.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    statuses = []
    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() - sent < drain_delay_s / 2:
            statuses.append((await client.get(f"{gw.url}/ready")).status_code)
            await asyncio.sleep(0.05)
    while not refused(gw.port):
        assert time.monotonic() - sent < drain_delay_s + 20, "the listener never closed"
        await asyncio.sleep(0.05)
    closed_at = time.monotonic()
    await asyncio.wait_for(task, timeout=60)
    return load, statuses, closed_at - sent, sum(1 for o in load.outcomes if o.stream and o.ended > closed_at)


def test_sigterm_drains_in_flight_streams_then_exits_0(tmp_path: Path) -> None:
    replica = fake_replica(tmp_path, "A")
    gw = gateway_proc(tmp_path, [replica.url], [], shutdown_grace_s=30, drain_delay_s=2.0)
    with running(replica, gw):
        wait_ready(gw)
        load, statuses, closed_after, streaming = asyncio.run(_sigterm_with_streams_in_flight(gw, 2.0))
        assert gw.proc is not None
        code = gw.proc.wait(timeout=40)
    print(f"\nSIGTERM with {sum(o.stream for o in load.outcomes)} streams in flight: {summary(load.outcomes)};")
    print(f"  /ready during the drain delay: {set(statuses)}; listener closed after {closed_after:.1f} s,")
    print(f"  {streaming} streams still running then finished; exit {code}")
    assert streaming > 0, "streams must still be in flight once the listener closed"
    assert statuses and set(statuses) == {503}, "/ready answers 503 from the signal on"
    assert all(o.ok for o in load.outcomes), summary(load.outcomes)  # all were in flight at SIGTERM
    assert code == 0


def test_streams_longer_than_the_grace_period_end_with_an_error_event_and_the_process_exits_0(tmp_path: Path) -> None:
    replica = fake_replica(tmp_path, "A")
    gw = gateway_proc(tmp_path, [replica.url], [], shutdown_grace_s=1.0)
    with running(replica, gw):
        wait_ready(gw)
        long_stream = {"x-fake-chunks": "600", "x-fake-interval": "0.05"}  # 30 s

        async def one() -> tuple[float, str]:
            async with httpx.AsyncClient(timeout=60) as client:
                body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stream": True}
                async with client.stream("POST", f"{gw.url}/v1/chat/completions", json=body, headers=long_stream) as r:
                    assert gw.proc is not None
                    gw.proc.send_signal(signal.SIGTERM)
                    sent = time.monotonic()
                    last = ""
                    with contextlib.suppress(httpx.HTTPError):
                        async for line in r.aiter_lines():
                            last = line if line.startswith("data: ") else last
                    return time.monotonic() - sent, last

        ended_after, last = asyncio.run(one())
        assert gw.proc is not None
        code = gw.proc.wait(timeout=30)
    print(f"\ngrace 1 s, a 30 s stream: it ended {ended_after:.1f} s after SIGTERM with {last[:90]}; exit {code}")
    assert ended_after < 15  # the grace period, not the stream's length (generous for a loaded machine)
    assert last.startswith('data: {"error"') and '"shutting_down"' in last  # an error event, not a cut
    assert code == 0


def test_the_signal_handler_only_flags_ready_turns_503_and_drain_delay_zero_exits_at_once() -> None:
    state = GatewayState(Settings(_env_file=None), CollectorRegistry())  # type: ignore[call-arg]
    server = GracefulServer(uvicorn.Config(app=None), state, drain_delay_s=0, grace_s=1)  # type: ignore[arg-type]
    server.handle_exit(signal.SIGTERM, None)
    assert state.draining and server.should_exit
    assert not server._captured_signals  # not re-raised after the drain: the process exits 0
    delayed = GracefulServer(uvicorn.Config(app=None), state, drain_delay_s=60, grace_s=1)  # type: ignore[arg-type]
    delayed.handle_exit(signal.SIGTERM, None)
    assert not delayed.should_exit  # still accepting during the delay (/ready already 503)


def test_a_request_still_waiting_for_its_head_when_the_grace_period_ends_gets_a_503(
    gateway: Callable[..., Gateway],
) -> None:
    gw = gateway()
    sweeper = gw.app.state.sweeper
    with httpx.Client(base_url=gw.url, timeout=30) as client, ThreadPoolExecutor(1) as pool:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}
        waiting = pool.submit(client.post, "/v1/chat/completions", json=body, headers={"x-fake-delay": "20"})
        wait_for(lambda: len(sweeper) == 1, 10, "the request in flight")
        assert sweeper._loop is not None
        sweeper._loop.call_soon_threadsafe(sweeper.fire_all, "shutdown")  # what GracefulServer does at the end
        response = waiting.result(timeout=20)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "shutting_down"
