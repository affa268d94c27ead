"""The raw HTTP/1.1 upstream client against real servers on loopback: pooling, framing, failures, cancellation."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.bench.fake_upstream import FakeUpstream
from gateway.config import Settings
from gateway.errors import UpstreamConnectError
from gateway.rawclient import HIGH_WATER, RawClientError, RawUpstream
from gateway.servers import ThreadServer
from tests.conftest import dead_url

BIG = bytes(range(256)) * (3 * 1024 * 1024 // 256)  # 3 MiB, above the flow-control high-water mark


class Recorder:
    """An aiohttp upstream that records which connection each request came on."""

    def __init__(self) -> None:
        self.peers: list[Any] = []
        self.inflight = 0
        self.max_inflight = 0
        self.cancelled = 0

    def app(self) -> web.Application:
        @web.middleware
        async def record(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
            assert request.transport is not None
            self.peers.append(request.transport.get_extra_info("peername"))
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            try:
                return await handler(request)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            finally:
                self.inflight -= 1

        app = web.Application(middlewares=[record], client_max_size=8 * 1024 * 1024)
        app.router.add_post("/fixed", self._fixed)
        app.router.add_post("/chunked", self._chunked)
        app.router.add_post("/slow", self._slow)
        app.router.add_post("/echo", self._echo)
        app.router.add_get("/length", self._length)
        return app

    async def _length(self, request: web.Request) -> web.Response:
        return web.Response(body=request.headers.get("content-length", "none").encode())

    async def _fixed(self, request: web.Request) -> web.Response:
        return web.Response(body=b"fixed:" + request.headers.get("x-id", "").encode(), headers={"x-up": "1"})

    async def _chunked(self, request: web.Request) -> web.StreamResponse:
        size = int(request.headers.get("x-size", "0"))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        if size:
            for start in range(0, size, 65536):
                await response.write(BIG[start : min(size, start + 65536)])
        else:
            for index in range(5):
                await response.write(b"part%d;" % index)
        await response.write_eof()
        return response

    async def _slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.headers.get("x-delay", "0.05")))
        return web.Response(body=request.headers.get("x-id", "").encode())

    async def _echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        return web.Response(body=hashlib.sha256(body).hexdigest().encode())


@pytest.fixture
def recorder() -> Iterator[tuple[Recorder, str]]:
    rec = Recorder()
    with ThreadServer(rec.app()) as server:
        yield rec, server.url


@pytest.fixture
async def client() -> AsyncIterator[Callable[..., Awaitable[RawUpstream]]]:
    made: list[RawUpstream] = []

    async def make(**overrides: Any) -> RawUpstream:
        upstream = RawUpstream(Settings(_env_file=None, **overrides))  # type: ignore[call-arg]
        await upstream.start()
        made.append(upstream)
        return upstream

    yield make
    for upstream in made:
        await upstream.close()
    await asyncio.sleep(0.01)  # let the closed transports finish closing before the loop goes


async def test_keep_alive_reuses_one_connection_for_fixed_and_chunked_bodies(client: Any, recorder: Any) -> None:
    rec, url = recorder
    raw = await client()
    for index in range(10):
        r = await raw.send(f"{url}/fixed", b"{}", {"x-id": str(index)})
        assert r.status == 200 and await r.read() == b"fixed:%d" % index
        assert (b"x-up", b"1") in r.headers and not any(k == b"content-length" for k, _ in r.headers)
        r = await raw.send(f"{url}/chunked", b"{}", {})
        assert not any(k == b"transfer-encoding" for k, _ in r.headers)
        assert await r.read() == b"part0;part1;part2;part3;part4;"
    assert len(rec.peers) == 20 and len(set(rec.peers)) == 1


async def test_reader_returns_the_stream_then_empty(client: Any, recorder: Any) -> None:
    _, url = recorder
    r = await (await client()).send(f"{url}/chunked", b"{}", {})
    read = r.reader()
    parts = []
    while chunk := await read():
        parts.append(chunk)
    assert b"".join(parts) == b"part0;part1;part2;part3;part4;" and await read() == b""


async def test_concurrent_requests_and_the_connection_cap(client: Any, recorder: Any) -> None:
    rec, url = recorder
    raw = await client(max_connections=3)

    async def one(index: int) -> bytes:
        r = await raw.send(f"{url}/slow", b"{}", {"x-id": str(index), "x-delay": "0.02"})
        return await r.read()

    assert await asyncio.gather(*(one(i) for i in range(30))) == [str(i).encode() for i in range(30)]
    assert rec.max_inflight <= 3 and len(set(rec.peers)) <= 3
    unlimited = await client()
    responses = await asyncio.gather(*(unlimited.send(f"{url}/slow", b"{}", {"x-delay": "0.3"}) for _ in range(10)))
    assert [await r.read() for r in responses] == [b""] * 10
    assert rec.max_inflight == 10


async def test_large_bodies_both_ways_with_flow_control(client: Any, recorder: Any) -> None:
    _, url = recorder
    raw = await client()
    r = await raw.send(f"{url}/echo", BIG, {})
    assert await r.read() == hashlib.sha256(BIG).hexdigest().encode()
    r = await raw.send(f"{url}/chunked", b"{}", {"x-size": str(len(BIG))})
    read = r.reader()
    first = await read()
    await asyncio.sleep(0.3)  # the server keeps sending; the client must stop reading past the high-water mark
    assert not r._transport.is_reading()  # type: ignore[attr-defined]
    assert HIGH_WATER < r._size < len(BIG)  # type: ignore[attr-defined]
    rest = []
    while chunk := await read():
        rest.append(chunk)
    assert first + b"".join(rest) == BIG
    again = await raw.send(f"{url}/fixed", b"{}", {"x-id": "after"})  # the connection went back, reading again
    assert await again.read() == b"fixed:after"


async def test_connection_refused_is_a_connect_error(client: Any) -> None:
    with pytest.raises(UpstreamConnectError):
        await (await client()).send(dead_url() + "/v1/completions", b"{}", {})


class ScriptedServer:
    """A bare asyncio HTTP server: ``replies[n]`` answers the n-th request overall (None: close without a byte)."""

    def __init__(self, replies: list[bytes | None]) -> None:
        self.replies = replies
        self.requests = 0
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.lower().split(b"\r\n")
                length = next(int(line[15:]) for line in lines if line.startswith(b"content-length"))
                await reader.readexactly(length)
                reply = self.replies[min(self.requests, len(self.replies) - 1)]
                self.requests += 1
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
                if b"connection: close" in reply.lower() or b"content-length" not in reply.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


@pytest.fixture
async def scripted() -> AsyncIterator[Callable[[list[bytes | None]], Awaitable[tuple[ScriptedServer, str]]]]:
    servers: list[tuple[asyncio.Server, ScriptedServer]] = []

    async def start(replies: list[bytes | None]) -> tuple[ScriptedServer, str]:
        script = ScriptedServer(replies)
        server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
        servers.append((server, script))
        return script, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for server, script in servers:
        server.close()
        for writer in script.writers:  # connections the client still holds open in its pool
            writer.close()
        await server.wait_closed()
    await asyncio.sleep(0.01)  # let the closed transports finish closing before the loop goes


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def test_idle_connection_closed_by_the_server_is_retried_once(client: Any, scripted: Any) -> None:
    script, url = await scripted([OK, None, OK])  # the 2nd request meets the server closing its idle connection
    raw = await client()
    assert await (await raw.send(url + "/x", b"{}", {})).read() == b"ok"
    assert await (await raw.send(url + "/x", b"{}", {})).read() == b"ok"
    assert (script.requests, script.connections) == (3, 2)


async def test_the_retry_opens_a_new_connection_rather_than_another_idle_one(client: Any, scripted: Any) -> None:
    script, url = await scripted([OK, OK, None, OK])  # the 3rd request meets its reused connection closing
    raw = await client()
    first = await asyncio.gather(*(raw.send(url + "/x", b"{}", {}) for _ in range(2)))  # two idle connections
    assert [await r.read() for r in first] == [b"ok", b"ok"] and script.connections == 2
    assert await (await raw.send(url + "/x", b"{}", {})).read() == b"ok"
    assert (script.requests, script.connections) == (4, 3)  # not retried on the other idle connection


async def test_fresh_connection_lost_before_the_head_is_not_retried(client: Any, scripted: Any) -> None:
    script, url = await scripted([None])
    with pytest.raises(UpstreamConnectError):
        await (await client()).send(url + "/x", b"{}", {})
    assert script.requests == 1


async def test_body_until_eof_and_truncated_bodies(client: Any, scripted: Any) -> None:
    _, url = await scripted([b"HTTP/1.1 200 OK\r\n\r\nuntil the end"])
    raw = await client()
    assert await (await raw.send(url + "/x", b"{}", {})).read() == b"until the end"
    _, url = await scripted([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nabc"])
    r = await raw.send(url + "/x", b"{}", {})
    with pytest.raises(RawClientError, match="mid-body"):
        await r.read()
    _, url = await scripted([b"HTTP/1.1 200 OK\r\nContent-Length: zz\r\nConnection: close\r\n\r\n"])
    with pytest.raises(UpstreamConnectError, match="unparseable"):
        await raw.send(url + "/x", b"{}", {})


async def wait_until(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(250):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def test_cancelling_a_stream_mid_read_aborts_the_upstream_request(client: Any) -> None:
    fake = FakeUpstream()
    with ThreadServer(fake.app()) as server:
        raw = await client()
        body = orjson.dumps({"model": "fake-model", "stream": True, "messages": []})
        headers = {"x-fake-chunks": "500", "x-fake-interval": "0.02"}
        r = await raw.send(server.url + "/v1/chat/completions", body, headers)
        read = r.reader()
        assert (await read()).startswith(b"data: ")

        async def drain() -> None:
            while await read():
                pass

        task = asyncio.create_task(drain())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until(lambda: fake.cancelled == 1, "the upstream to see the stream cancelled")
        assert not any(pool.idle for pool in raw._pools.values())


async def test_cancelling_before_the_head_aborts_the_connection(client: Any, recorder: Any) -> None:
    rec, url = recorder
    raw = await client()
    task = asyncio.create_task(raw.send(f"{url}/slow", b"{}", {"x-delay": "5"}))
    await wait_until(lambda: rec.inflight == 1, "the request to arrive")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: rec.cancelled == 1, "the upstream handler to be cancelled")
    assert await (await raw.send(f"{url}/fixed", b"{}", {"x-id": "1"})).read() == b"fixed:1"
    assert len(set(rec.peers)) == 2  # the aborted connection was not reused


def test_works_on_uvloop(recorder: Any) -> None:
    """The gateway serves on uvloop, whose transports are not asyncio subclasses."""
    import uvloop

    rec, url = recorder

    async def scenario() -> list[bytes]:
        raw = RawUpstream(Settings(_env_file=None))  # type: ignore[call-arg]
        try:
            bodies = [await (await raw.send(f"{url}/fixed", b"{}", {"x-id": str(i)})).read() for i in range(3)]
            read = (await raw.send(f"{url}/chunked", b"{}", {})).reader()
            parts = []
            while chunk := await read():
                parts.append(chunk)
            return [*bodies, b"".join(parts)]
        finally:
            await raw.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(scenario()) == [b"fixed:0", b"fixed:1", b"fixed:2", b"part0;part1;part2;part3;part4;"]
    assert len(set(rec.peers)) == 1


async def test_pipe_relays_the_rest_of_the_body_through_the_sink(client: Any, recorder: Any) -> None:
    _, url = recorder
    r = await (await client()).send(f"{url}/chunked", b"{}", {})
    first = await r.reader()()
    pipe = r.piper()
    assert pipe is not None
    got: list[bytes] = []

    async def never_called() -> None:
        raise AssertionError("the sink never asked to wait")

    tail = await pipe(lambda chunk: got.append(chunk) is None, never_called)
    assert first + b"".join(got) + tail == b"part0;part1;part2;part3;part4;"


async def test_pipe_stops_reading_while_the_sink_waits_for_its_drain(client: Any, recorder: Any) -> None:
    _, url = recorder
    raw = await client()
    r = await raw.send(f"{url}/chunked", b"{}", {"x-size": str(len(BIG))})
    first = await r.reader()()
    pipe = r.piper()
    assert pipe is not None
    got: list[bytes] = []
    drained = asyncio.Event()
    drains = 0

    def sink(chunk: bytes) -> bool:
        got.append(chunk)
        return len(got) != 1  # the first chunk fills the "client": wait for its drain

    async def drain() -> None:
        nonlocal drains
        drains += 1
        await drained.wait()

    task = asyncio.create_task(pipe(sink, drain))
    await wait_until(lambda: drains == 1, "the pipe to wait for the drain")
    await asyncio.sleep(0.2)  # the server keeps sending, but nothing is read meanwhile
    assert len(got) == 1 and not r._transport.is_reading()  # type: ignore[attr-defined]
    drained.set()
    tail = await asyncio.wait_for(task, 10)
    assert first + b"".join(got) + tail == BIG and drains == 1
    again = await raw.send(f"{url}/fixed", b"{}", {"x-id": "after"})  # the connection went back, reading again
    assert await again.read() == b"fixed:after"


async def test_a_failing_sink_fails_the_pipe_and_drops_the_connection(client: Any, recorder: Any) -> None:
    rec, url = recorder
    raw = await client()
    r = await raw.send(f"{url}/chunked", b"{}", {"x-size": str(len(BIG))})
    await r.reader()()
    pipe = r.piper()
    assert pipe is not None

    def sink(chunk: bytes) -> bool:
        raise ValueError("boom")

    async def drain() -> None:
        return None

    with pytest.raises(RawClientError, match="relaying the body failed"):
        await asyncio.wait_for(pipe(sink, drain), 10)
    assert await (await raw.send(f"{url}/fixed", b"{}", {"x-id": "1"})).read() == b"fixed:1"
    assert len(set(rec.peers)) == 2  # the failed connection was not reused


async def test_a_request_on_a_kept_alive_connection_does_not_look_up_the_running_loop(
    client: Any, recorder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``asyncio.get_running_loop()`` makes a getpid() syscall (CPython checks the loop's process): the
    connection keeps its loop, so a request on it makes none (issue 30: three a request were 44 % of the
    gateway's syscalls)."""
    _, url = recorder
    raw = await client()
    r = await raw.send(f"{url}/fixed", b"{}", {"x-id": "0"})  # opens the connection: that may ask
    assert await r.read() == b"fixed:0"
    calls = []
    real = asyncio.get_running_loop

    def counting() -> asyncio.AbstractEventLoop:
        calls.append(1)
        return real()

    monkeypatch.setattr(asyncio, "get_running_loop", counting)
    for index in range(1, 4):
        r = await raw.send(f"{url}/fixed", b"{}", {"x-id": str(index)})
        assert await r.read() == b"fixed:%d" % index
    assert calls == []


async def test_a_get_without_content_sends_no_length_and_a_post_does(client: Any, recorder: Any) -> None:
    """RFC 9110 8.6: a client SHOULD NOT send Content-Length where the method anticipates no content (the health
    checks' and scrapes' GETs); a POST says its length, an empty one too."""
    _, url = recorder
    raw = await client()
    r = await raw.send(f"{url}/length", b"", {}, "GET")
    assert await r.read() == b"none"
    r = await raw.send(f"{url}/echo", b"", {})
    assert r.status == 200 and await r.read() == hashlib.sha256(b"").hexdigest().encode()
