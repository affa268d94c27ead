"""gateway/health.py: each verdict against real servers on loopback, and checks while the gateway's own loop
stalls (the soak's burst of 503s: a replica that is slow to answer ``/health`` but serves requests)."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway.bench.fake_upstream import FakeUpstream
from gateway.config import Settings
from gateway.health import HealthChecker
from gateway.looplag import LoopLagMonitor
from gateway.metrics import GatewayMetrics
from gateway.pools import PoolSet, Replica
from gateway.servers import ThreadServer
from gateway.upstream import fetcher, make_upstream
from tests.conftest import Gateway, Upstreams, dead_url

TIMEOUT_S = 0.2


class Replicas:
    """A replica on loopback (its own thread, so it answers while the test's loop is blocked) whose ``/health``
    can wait ``delay`` seconds, and block the checking loop for ``stall`` seconds when a check arrives."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.stall = 0.0
        self.loop: asyncio.AbstractEventLoop | None = None

    def app(self) -> web.Application:
        async def health(_: web.Request) -> web.Response:
            if self.stall and self.loop is not None:
                self.loop.call_soon_threadsafe(time.sleep, self.stall)  # the gateway's loop stalls
            await asyncio.sleep(self.delay)
            return web.json_response({})

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "fake-model"}]})

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        return app


@pytest.fixture
def replica() -> Iterator[tuple[Replicas, str]]:
    fake = Replicas()
    with ThreadServer(fake.app()) as server:
        yield fake, server.url


@pytest.fixture
async def monitor() -> AsyncIterator[LoopLagMonitor]:
    lag = LoopLagMonitor(GatewayMetrics(CollectorRegistry()).loop_lag, tick_s=0.01)
    task = asyncio.create_task(lag.run())
    await asyncio.sleep(0.02)
    yield lag
    task.cancel()


def one_replica(url: str) -> tuple[PoolSet, Replica]:
    pools = PoolSet(GatewayMetrics(CollectorRegistry()), random.Random(1))
    pools.configure({"standard": [url], "speculative": []})
    return pools, pools.replicas()[0]


async def check(pools: PoolSet, lag: LoopLagMonitor | None) -> float:
    checker = HealthChecker(pools, 60.0, TIMEOUT_S, lambda: None, lag)
    upstream = make_upstream(Settings(_env_file=None))  # type: ignore[call-arg]
    await upstream.start()
    try:
        started = time.perf_counter()
        await checker.check_all(fetcher(upstream))
        return time.perf_counter() - started
    finally:
        await upstream.close()


def verdicts(replica: Replica) -> dict[str, float]:
    return {v: checks(replica, v) for v in ("ok", "failed", "timeout", "late")}


def checks(replica: Replica, verdict: str) -> float:
    registry = replica.metrics.registry
    labels = {"pool": replica.pool, "replica": replica.url, "result": verdict}
    return registry.get_sample_value("specgate_health_checks_total", labels) or 0.0


async def test_a_stall_of_the_gateway_alone_does_not_fail_a_check(
    replica: tuple[Replicas, str], monitor: LoopLagMonitor
) -> None:
    # The hypothesis first: the loop blocked 2.5x the timeout while the answer arrives. httpx (anyio) cancels a
    # read at its deadline only if the read has not completed: after the stall the answer in the socket wins.
    fake, url = replica
    pools, r = one_replica(url)
    fake.loop, fake.stall = asyncio.get_running_loop(), 0.5
    assert await check(pools, None) >= 0.5  # the stall happened during the check
    assert r.healthy and checks(r, "ok") == 1


async def test_a_timeout_while_the_gateway_stalled_is_not_counted(
    replica: tuple[Replicas, str], monitor: LoopLagMonitor
) -> None:
    # A replica slow (0.8 s for a 0.2 s timeout) while the gateway's own loop stalls for 0.3 s: the
    # evidence is confounded (on one starved host both are late), so the replica keeps its state.
    fake, url = replica
    pools, r = one_replica(url)
    fake.loop, fake.stall, fake.delay = asyncio.get_running_loop(), 0.3, 0.8
    await check(pools, monitor)
    assert r.healthy and checks(r, "late") == 1 and checks(r, "timeout") == 0, verdicts(r)
    r.set_healthy(False, suspect=True)
    await check(pools, monitor)
    assert not r.healthy and r.suspect  # "late" says nothing either way: a down replica stays down


async def test_a_slow_replica_times_out_when_the_loop_kept_time(
    replica: tuple[Replicas, str], monitor: LoopLagMonitor
) -> None:
    fake, url = replica
    pools, r = one_replica(url)
    fake.delay = 0.5
    await check(pools, monitor)
    assert not r.healthy and r.suspect and checks(r, "timeout") == 1


async def test_a_hung_replica_is_taken_out_after_one_timeout(monitor: LoopLagMonitor) -> None:
    # SIGSTOP as the kernel shows it: the listening socket completes handshakes, nobody reads or answers.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        pools, r = one_replica(f"http://127.0.0.1:{hung.getsockname()[1]}")
        took = await check(pools, monitor)
    assert not r.healthy and r.suspect and checks(r, "timeout") == 1
    assert took < TIMEOUT_S + 0.5  # one timeout, as fast as before


async def test_a_refusal_is_down_not_suspect(monitor: LoopLagMonitor) -> None:
    pools, r = one_replica(dead_url())
    await check(pools, monitor)
    assert not r.healthy and not r.suspect and checks(r, "failed") == 1


async def test_an_error_status_is_down_not_suspect(monitor: LoopLagMonitor) -> None:
    fake = FakeUpstream()
    fake.healthy = False  # /health answers 503: the replica says so itself
    with ThreadServer(fake.app()) as server:
        pools, r = one_replica(server.url)
        await check(pools, monitor)
    assert not r.healthy and not r.suspect and checks(r, "failed") == 1


def test_replicas_slow_to_answer_health_still_serve_requests(
    gateway: Callable[..., Gateway], upstreams: Upstreams
) -> None:
    # The soak's burst: every replica's /health answered after the timeout (a starved host) and every request
    # got 503 no_healthy_backend. They are suspects now, and a suspect is tried before answering 503.
    upstreams.standard.health_delay = upstreams.speculative.health_delay = 1.0
    gw = gateway(health_timeout_s=0.3, health_interval_s=0.1)
    pools = gw.app.state.pools
    assert all(not r.healthy and r.suspect for r in pools.replicas())  # the first round timed out
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        responses = [client.post("/v1/chat/completions", json=body) for _ in range(4)]
    assert [r.status_code for r in responses] == [200] * 4
    assert all(not r.healthy and r.suspect for r in pools.replicas())
    dispatched = sum(gw.sample("specgate_suspect_dispatches_total", pool=p) for p in ("standard", "speculative"))
    assert dispatched == 4
