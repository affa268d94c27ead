"""A lean HTTP/1.1 upstream client: one asyncio Protocol per connection and httptools' parser.

It does only what the gateway's relay needs (POST, GET for the pass-through endpoints, plain HTTP, keep-alive),
so a request costs one ``transport.write`` and a few parser callbacks instead of aiohttp's per-request machinery.
Per (host, port) it keeps a LIFO list of idle connections (optionally capped by ``max_connections``, counting busy
ones).

A connection goes back to the pool only when its response is complete and the server allows keep-alive;
closing an unfinished response aborts the connection, which is how a client disconnect reaches the upstream.
A reused idle connection the server has already closed (connection lost before any response byte) is retried
once on a fresh connection: the keep-alive race every pooling client meets.

Errors: refused, unreachable or lost before the head -> :class:`UpstreamConnectError`; connect timeout ->
:class:`UpstreamTimeout`; lost mid-body or unparseable -> :class:`RawClientError` (the ``read_errors``).
Bodies delimited by the connection's end (no length, not chunked) are supported; TLS is not.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

from gateway.config import Settings
from gateway.errors import UpstreamConnectError, UpstreamTimeout, chained
from gateway.upstream import Pipe, RawHeaders, Sink, UpstreamResponse, relayable

HIGH_WATER = 1024 * 1024  # buffered body bytes at which a streamed response stops reading the socket
_TARGET_CACHE_LIMIT = 1024


_NO_CONTENT = frozenset({"GET", "HEAD"})  # methods whose semantics anticipate no request content


class RawClientError(Exception):
    """The upstream broke off or garbled a response after its head."""


def nodelay(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """A new connection's transport, with Nagle's algorithm off (small writes leave at once)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio subclasses


class _Connection(asyncio.Protocol):
    """One TCP connection; hands the bytes it receives to the response being read, if any."""

    def __init__(self, pool: _HostPool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop  # its responses' futures' loop, kept: asyncio.get_running_loop() is a getpid() syscall
        self.transport: asyncio.Transport | None = None
        self.response: _RawResponse | None = None
        self.closed = False
        self.reused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = nodelay(transport)

    def data_received(self, data: bytes) -> None:
        if self.response is not None:
            self.response.feed(data)
        elif self.transport is not None:  # bytes nobody asked for: the connection can't be trusted
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.response is not None:
            self.response.connection_lost(exc)
        else:
            self.pool.forget(self)


class _HostPool:
    """Idle keep-alive connections to one (host, port), most recently used first."""

    def __init__(self, host: str, port: int, cap: int, connect_timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[_Connection] = []
        self.slots = asyncio.Semaphore(cap) if cap else None
        self.closing = False

    async def acquire(self, fresh: bool = False) -> _Connection:
        """An idle connection (most recently used first), or a new one; always a new one when ``fresh``."""
        if self.slots is not None:
            await self.slots.acquire()
        try:
            while self.idle and not fresh:
                conn = self.idle.pop()
                if not conn.closed:
                    conn.reused = True
                    return conn
            return await self._connect()
        except BaseException:
            if self.slots is not None:
                self.slots.release()
            raise

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        url = f"http://{self.host}:{self.port}"
        connecting = loop.create_connection(lambda: _Connection(self, loop), self.host, self.port)
        try:  # wait_for, not ``async with asyncio.timeout``: no await in a block that exits (compiled.py)
            _, conn = await asyncio.wait_for(connecting, self.connect_timeout_s)
        except TimeoutError as exc:
            raise chained(UpstreamTimeout(f"timed out connecting to {url}"), exc) from exc
        except OSError as exc:
            raise chained(UpstreamConnectError(f"cannot reach upstream {url}: {exc}"), exc) from exc
        return conn

    def release(self, conn: _Connection, keep: bool) -> None:
        """Give back a connection whose response ended (``keep``) or must not be reused."""
        conn.response = None
        if self.slots is not None:
            self.slots.release()
        if keep and not conn.closed and not self.closing:
            self.idle.append(conn)
        elif conn.transport is not None:
            conn.transport.abort()

    def forget(self, conn: _Connection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)

    def close(self) -> None:
        self.closing = True  # connections still busy are closed as their responses end
        idle, self.idle = self.idle, []
        for conn in idle:
            if conn.transport is not None:
                conn.transport.close()


class _RawResponse:
    """One response on one connection; also the parser's callback target."""

    read_errors: tuple[type[BaseException], ...] = (RawClientError,)

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
        assert conn.transport is not None
        self._transport = conn.transport
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._loop = conn.loop
        self.head: asyncio.Future[None] = self._loop.create_future()
        self.status = 0
        self.headers: RawHeaders = []
        self._raw: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._error: RawClientError | None = None
        self._streaming = False
        self._paused = False
        self._until_eof = False
        self._sink: Sink | None = None
        self._blocked = False  # the pipe's sink asked to wait for the downstream to drain
        self.got_bytes = False
        conn.response = self

    # -- fed by the connection ---------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        self.got_bytes = True
        parser = self._parser
        if parser is None:  # finished: the connection no longer feeds this response
            return
        try:
            parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(RawClientError(f"unparseable response from the upstream: {exc}"))
            self._transport.abort()
            return
        if self._sink is not None and self._chunks and not self._done:  # the tail waits for the pipe's end
            self._flush(self._sink)

    def _flush(self, sink: Sink) -> None:
        """Hand what one socket read carried to the pipe's sink; pause reading when it asks to wait."""
        chunks = self._chunks
        self._chunks = []
        self._size = 0
        try:
            more = sink(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        except Exception as exc:  # a bug in the sink must not escape into the event loop's protocol call
            self._fail(RawClientError(f"relaying the body failed: {exc!r}"))
            self._transport.abort()
            return
        if not more:
            self._blocked = True
            if self._conn is not None and not self._paused:
                self._transport.pause_reading()
                self._paused = True
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._done:
            return
        if self.head.done() and self._until_eof and exc is None:
            self.on_message_complete()  # the body was delimited by the connection's end
            return
        where = "mid-body" if self.head.done() else "before the response head"
        self._fail(RawClientError(f"upstream closed the connection {where}: {exc or 'EOF'}"))

    def _fail(self, error: RawClientError) -> None:
        if self._done or self._error is not None:
            return
        self._error = error
        if not self.head.done():
            self.head.set_exception(error)
        self._wake()
        self._finish(keep=False)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _finish(self, keep: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._parser = None  # it refers back to us: dropping it leaves no reference cycle behind
        if self._paused and keep:
            self._transport.resume_reading()
            self._paused = False
        conn.pool.release(conn, keep)

    # -- parser callbacks --------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._done:
            raise RawClientError("a second response arrived for one request")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None  # parser callbacks run only before the response finishes
        self.status = self._parser.get_status_code()
        self.headers = relayable(self._raw)
        names = {k.lower() for k, _ in self._raw}
        self._until_eof = b"content-length" not in names and b"transfer-encoding" not in names
        self._until_eof = self._until_eof and self.status not in (204, 304)
        self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._size += len(body)
        if self._sink is not None:
            return  # piping: feed() hands the bytes to the sink; the pipe wakes only to end, fail or drain
        if self._waiter is not None:
            self._wake()
        if self._streaming and self._size > HIGH_WATER and not self._paused:
            self._transport.pause_reading()
            self._paused = True

    def on_message_complete(self) -> None:
        self._done = True
        self._wake()
        keep = self._parser is not None and self._parser.should_keep_alive() and not self._until_eof
        self._finish(keep=keep)

    # -- the UpstreamResponse side -----------------------------------------------------------------
    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        except asyncio.CancelledError:
            self.abort()  # the reader went away: drop the connection so the upstream stops
            raise
        finally:
            self._waiter = None

    async def read(self) -> bytes:
        while not self._done:
            if self._error is not None:
                raise self._error
            await self._wait()
        chunks = self._chunks
        self._chunks = []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def reader(self) -> Callable[[], Awaitable[bytes]]:
        self._streaming = True
        return self._next_chunk

    async def _next_chunk(self) -> bytes:
        """Everything buffered so far, coalesced; waits when nothing is; ``b""`` at the end."""
        while True:
            chunks = self._chunks
            if chunks:
                self._chunks = []
                self._size = 0
                if self._paused:
                    self._paused = False
                    self._transport.resume_reading()
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            await self._wait()

    def piper(self) -> Pipe:
        self._streaming = True
        return self._pipe

    async def _pipe(self, sink: Sink, drain: Callable[[], Awaitable[None]]) -> bytes:
        """Relay the rest of the body through ``sink``, called from the protocol callback for each socket read.

        No task wakes per chunk: this coroutine wakes only when the body ends, fails, or the sink asked to
        wait (then it awaits ``drain`` and resumes reading the socket). The bytes that arrive together with
        the body's end are not given to the sink but returned, so the caller can send them with the end of
        its own response in one write.
        """
        self._sink = sink
        if self._chunks and not self._done:
            self._flush(sink)
        try:
            while self._error is None and not self._done:
                if self._blocked:
                    await drain()
                    self._blocked = False
                    continue  # the response may have ended or failed meanwhile
                if self._paused and self._conn is not None:
                    self._paused = False
                    self._transport.resume_reading()
                await self._wait()
            if self._error is not None:
                raise self._error
        except asyncio.CancelledError:
            self.abort()
            raise
        finally:
            self._sink = None
        tail, self._chunks = self._chunks, []
        return tail[0] if len(tail) == 1 else b"".join(tail)

    async def close(self) -> None:
        self._finish(keep=False)  # a no-op once the response completed and its connection went back

    def abort(self) -> None:
        if not self.head.done():
            self.head.cancel()
        self._finish(keep=False)


class RawUpstream:
    """The :class:`gateway.upstream.Upstream` seam over :class:`_HostPool` connections."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._pools: dict[tuple[str, int], _HostPool] = {}
        self._targets: dict[str, tuple[_HostPool, bytes]] = {}

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._targets.clear()

    async def send(self, url: str, body: bytes, headers: dict[str, str], method: str = "POST") -> UpstreamResponse:
        cached = self._targets.get(url) if method == "POST" else None
        pool, prefix = cached or self._target(url, method)
        extra = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
        # a GET or HEAD without content carries no length (RFC 9110 8.6: a client SHOULD NOT send one there)
        length = b"" if not body and method in _NO_CONTENT else b"Content-Length: %d\r\n" % len(body)
        request = b"".join([prefix, length, extra.encode("latin-1"), b"\r\n", body])
        for attempt in (1, 2):
            # the retry takes a new connection: the next idle one may have been closed by the same server
            conn = await pool.acquire(fresh=attempt == 2)
            response = _RawResponse(conn)
            assert conn.transport is not None
            conn.transport.write(request)
            try:
                await response.head
            except RawClientError as exc:
                if attempt == 1 and conn.reused and not response.got_bytes:
                    continue  # the server closed the idle connection as we reused it
                raise chained(UpstreamConnectError(f"upstream {url} failed before answering: {exc}"), exc) from exc
            except BaseException:
                response.abort()
                raise
            return response
        raise AssertionError("unreachable")

    def _target(self, url: str, method: str) -> tuple[_HostPool, bytes]:
        """The host's pool and the request line + Host header; cached for POST (the proxy's requests) only."""
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise UpstreamConnectError(f"the raw upstream client speaks plain http only, not {url}")
        port = parts.port or 80
        key = (parts.hostname, port)
        pool = self._pools.get(key)
        if pool is None:
            pool = _HostPool(parts.hostname, port, self._settings.max_connections, self._settings.connect_timeout_s)
            self._pools[key] = pool
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        prefix = f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n".encode("latin-1")
        if method != "POST":
            return pool, prefix
        if len(self._targets) >= _TARGET_CACHE_LIMIT:
            self._targets.clear()
        self._targets[url] = (pool, prefix)
        return pool, prefix
