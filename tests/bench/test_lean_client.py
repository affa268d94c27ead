"""The lean load generator measures TTFB before the end of a response and counts failures as errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from gateway.bench.fake_upstream import FakeUpstream
from gateway.bench.lean_client import LeanClient
from gateway.bench.lean_upstream import LeanUpstream

BODY = orjson.dumps({"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture
async def lean_url() -> AsyncIterator[str]:
    upstream = LeanUpstream()
    server = await upstream.start()
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    upstream.stop()
    server.close()
    await server.wait_closed()


@pytest.fixture
async def fake_url() -> AsyncIterator[str]:
    runner = web.AppRunner(FakeUpstream().app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_ttfb_comes_before_the_end_of_a_paced_stream(lean_url: str) -> None:
    client = LeanClient(lean_url)
    request = client.request("/v1/chat/completions", BODY, {"x-fake-chunks": "5", "x-fake-interval": "0.02"})
    run = await client.run(request, requests=6, concurrency=3)
    client.close()
    assert run.errors == 0
    assert len(run.latencies) == len(run.ttfbs) == 6
    for ttfb, total in zip(run.ttfbs, run.latencies, strict=True):
        assert 0 < ttfb < total
        assert total - ttfb >= 0.05  # four more events on ticks 20 ms apart followed the first
    assert run.wall_s >= max(run.latencies)


async def test_connections_are_kept_alive_across_runs(lean_url: str) -> None:
    client = LeanClient(lean_url)
    request = client.request("/v1/chat/completions", BODY, {"x-fake-chunks": "3"})
    await client.run(request, requests=4, concurrency=2)
    first = dict(client._connections)
    run = await client.run(request, requests=4, concurrency=2)
    assert run.errors == 0
    assert client._connections == first
    client.close()


@pytest.mark.parametrize(
    "headers",
    [{"x-fake-status": "500"}, {"x-fake-reset": "1"}, {"x-fake-stall-after": "2"}],
    ids=["status-500", "connection-closed", "stalled-past-timeout"],
)
async def test_failures_count_as_errors_without_hanging(fake_url: str, headers: dict[str, str]) -> None:
    client = LeanClient(fake_url, timeout_s=0.3)
    request = client.request("/v1/chat/completions", BODY, {"content-type": "application/json", **headers})
    run = await client.run(request, requests=4, concurrency=2)
    client.close()
    assert run.errors == 4
    assert run.latencies == [] and run.ttfbs == []


async def test_an_unreachable_server_counts_errors(lean_url: str) -> None:
    client = LeanClient("http://127.0.0.1:1")
    run = await client.run(client.request("/v1/completions", BODY, {}), requests=3, concurrency=1)
    assert run.errors == 3


async def test_stagger_delays_later_workers_first_requests(lean_url: str) -> None:
    client = LeanClient(lean_url)
    request = client.request("/v1/chat/completions", BODY, {"x-fake-chunks": "4", "x-fake-interval": "0.05"})
    run = await client.run(request, requests=2, concurrency=2, stagger_s=0.2)
    client.close()
    assert run.errors == 0 and len(run.latencies) == 2
    assert run.wall_s >= 0.1 + min(run.latencies)  # the second worker's stream began 0.1 s in


async def test_think_time_pauses_between_a_workers_requests(lean_url: str) -> None:
    client = LeanClient(lean_url)
    request = client.request("/v1/chat/completions", BODY, {"x-fake-chunks": "2"})
    run = await client.run(request, requests=4, concurrency=1, think_s=0.1)
    client.close()
    assert run.errors == 0
    assert run.wall_s >= 0.06 + sum(run.latencies)  # its three seeded pauses of 0..0.1 s sum to 0.074 s
