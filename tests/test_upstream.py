"""The upstream seam's default: the raw client for http:// replicas, aiohttp for https:// ones; its GETs for the
health checks and the engine scrapes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import uvloop
from aiohttp import web

from gateway.config import Settings
from gateway.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.servers import ThreadServer, free_port
from gateway.upstream import AutoUpstream, Fetch, fetcher, make_upstream


def test_auto_is_the_default() -> None:
    assert isinstance(make_upstream(Settings(_env_file=None)), AutoUpstream)  # type: ignore[call-arg]


async def test_auto_sends_http_to_the_raw_client_and_https_to_aiohttp() -> None:
    upstream = AutoUpstream(Settings(_env_file=None, connect_timeout_s=2))  # type: ignore[call-arg]
    await upstream.start()
    try:
        port = free_port()
        with pytest.raises(UpstreamConnectError) as plain:
            await upstream.send(f"http://127.0.0.1:{port}/v1/completions", b"{}", {})
        with pytest.raises(UpstreamConnectError) as tls:
            await upstream.send(f"https://127.0.0.1:{port}/v1/completions", b"{}", {})
    finally:
        await upstream.close()
    assert plain.value.__cause__ is not None and type(plain.value.__cause__).__module__ != "aiohttp.client_exceptions"
    assert type(tls.value.__cause__).__module__.startswith("aiohttp")


class Answers:
    """A replica on loopback, in its own thread: ``/slow`` answers after ``delay`` s, ``/cut`` breaks off."""

    def __init__(self) -> None:
        self.delay = 0.0

    def app(self) -> web.Application:
        async def fast(_: web.Request) -> web.Response:
            return web.Response(body=b"vllm:num_requests_running 1\n")

        async def slow(_: web.Request) -> web.Response:
            await asyncio.sleep(self.delay)
            return web.Response(body=b"late")

        async def cut(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"content-length": "100"})
            await response.prepare(request)
            await response.write(b"x" * 10)
            assert request.transport is not None
            request.transport.close()
            return response

        app = web.Application()
        app.router.add_get("/metrics", fast)
        app.router.add_get("/slow", slow)
        app.router.add_get("/cut", cut)
        return app


@pytest.fixture
def answers() -> Iterator[tuple[Answers, str]]:
    replica = Answers()
    with ThreadServer(replica.app()) as server:
        yield replica, server.url


@pytest.fixture
async def fetch() -> AsyncIterator[Fetch]:
    upstream = make_upstream(Settings(_env_file=None, connect_timeout_s=2))  # type: ignore[call-arg]
    await upstream.start()
    yield fetcher(upstream)
    await upstream.close()


async def test_fetch_gets_status_and_body_or_names_the_failure(answers: tuple[Answers, str], fetch: Fetch) -> None:
    replica, url = answers
    for _ in range(2):  # the second on the kept-alive connection
        assert await fetch(f"{url}/metrics", 1.0) == (200, b"vllm:num_requests_running 1\n")
    status, _ = await fetch(f"{url}/missing", 1.0)
    assert status == 404
    replica.delay = 0.5
    started = time.perf_counter()
    with pytest.raises(UpstreamTimeout):
        await fetch(f"{url}/slow", 0.1)
    assert time.perf_counter() - started < 0.4
    with pytest.raises(UpstreamError) as cut:
        await fetch(f"{url}/cut", 1.0)
    assert not isinstance(cut.value, UpstreamTimeout)
    with pytest.raises(UpstreamConnectError):
        await fetch(f"http://127.0.0.1:{free_port()}/metrics", 1.0)
    assert await fetch(f"{url}/metrics", 1.0) == (200, b"vllm:num_requests_running 1\n")  # still serving


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_answer_that_came_while_the_loop_was_held_wins_over_the_deadline(
    answers: tuple[Answers, str], loop: str
) -> None:
    """The gateway's own loop is held (time.sleep) past the deadline while the answer arrives: the answer is
    read before the deadline is judged (a health check must not fail a replica for the gateway's stall)."""
    _, url = answers

    async def held() -> tuple[int, bytes]:
        upstream = make_upstream(Settings(_env_file=None))  # type: ignore[call-arg]
        await upstream.start()
        try:
            get = fetcher(upstream)
            await get(f"{url}/metrics", 1.0)  # the connection is open: the next GET is one write and one read
            running = asyncio.get_running_loop()
            running.call_soon(time.sleep, 0.3)  # held as soon as the request is written
            return await get(f"{url}/metrics", 0.1)
        finally:
            await upstream.close()

    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        assert runner.run(held()) == (200, b"vllm:num_requests_running 1\n")
