"""A lean HTTP/1.1 load generator for benchmarks: one keep-alive connection per worker, httptools' parser.

The protocol callbacks only note times and statuses (the first BODY byte's arrival, the response's end); the
worker task is woken once per response, never per chunk, so a generator streaming thousands of events a
second stays cheap next to what it measures. A request counts as an error when the status is not 200, the
body is empty, the connection is lost or the response is unparseable, or it takes longer than the per-request
timeout; the connection is then dropped and the worker opens a new one for its next request.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools

from gateway.rawclient import nodelay


@dataclass
class Measurement:
    """What one run of requests gave: per successful request latency and TTFB (seconds), errors, wall time."""

    latencies: list[float] = field(default_factory=list)
    ttfbs: list[float] = field(default_factory=list)
    errors: int = 0
    wall_s: float = 0.0


class ClientConnection(asyncio.Protocol):
    """One keep-alive connection; each exchange resolves ``done`` once, with whether it succeeded."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.keep_alive = True
        self.status = 0
        self.started = 0.0
        self.first_body = 0.0
        self.ended = 0.0
        self.done: asyncio.Future[bool] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = nodelay(transport)

    def send(self, request: bytes) -> asyncio.Future[bool]:
        assert self.transport is not None
        self.status, self.first_body, self.ended = 0, 0.0, 0.0
        self.done = asyncio.get_running_loop().create_future()
        self.started = time.perf_counter()
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._resolve(False)
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._resolve(False)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- parser callbacks -------------------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self.first_body:
            self.first_body = time.perf_counter()

    def on_message_complete(self) -> None:
        self.ended = time.perf_counter()
        self.keep_alive = self.parser.should_keep_alive()
        self._resolve(self.status == 200 and self.first_body > 0)

    def _resolve(self, ok: bool) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(ok)


class LeanClient:
    """Keep-alive connections to one server, kept across runs (so a warm-up opens them for the measurement)."""

    def __init__(self, url: str, timeout_s: float = 120.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"the lean client speaks plain http only, not {url}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.netloc = parts.netloc
        self.timeout_s = timeout_s
        self._connections: dict[int, ClientConnection] = {}

    def request(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        """The bytes of one POST, built once and sent as many times as a run needs."""
        lines = [f"POST {path} HTTP/1.1", f"Host: {self.netloc}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    async def run(
        self, request: bytes, requests: int, concurrency: int, stagger_s: float = 0.0, think_s: float = 0.0
    ) -> Measurement:
        """Send ``request`` ``requests`` times from ``concurrency`` workers, each on its own connection.

        ``stagger_s`` spreads the workers' first requests evenly over that many seconds; ``think_s`` waits a
        random 0..think_s before each later request, so arrivals don't lock to the moments responses end.
        """
        result = Measurement()
        remaining = requests
        pauses = random.Random(requests)  # seeded: runs are repeatable

        async def worker(index: int) -> None:
            nonlocal remaining
            if stagger_s:
                await asyncio.sleep(stagger_s * index / concurrency)
            while remaining > 0:
                remaining -= 1
                await self._exchange(index, request, result)
                if think_s and remaining > 0:
                    await asyncio.sleep(pauses.uniform(0, think_s))

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        result.wall_s = time.perf_counter() - started
        return result

    async def run_for(
        self,
        request: bytes,
        duration_s: float,
        concurrency: int,
        result: Measurement,
        stagger_s: float = 0.0,
        think_s: float = 0.0,
    ) -> None:
        """Like :meth:`run`, but each worker sends until ``duration_s`` has passed (no new request after it);
        ``result`` fills in as requests end, so a sampler can read it during the run."""
        pauses = random.Random(concurrency)  # seeded: runs are repeatable
        started = time.perf_counter()
        end = started + duration_s

        async def worker(index: int) -> None:
            if stagger_s:
                await asyncio.sleep(stagger_s * index / concurrency)
            while time.perf_counter() < end:
                await self._exchange(index, request, result)
                if think_s:
                    await asyncio.sleep(pauses.uniform(0, think_s))

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        result.wall_s = time.perf_counter() - started

    async def _exchange(self, index: int, request: bytes, result: Measurement) -> None:
        try:
            conn = await self._connection(index)
        except OSError:
            result.errors += 1
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                ok = await conn.send(request)
        except TimeoutError:
            ok = False
        if not ok:
            result.errors += 1
            conn.abort()
            return
        result.latencies.append(conn.ended - conn.started)
        result.ttfbs.append(conn.first_body - conn.started)
        if not conn.keep_alive:
            conn.abort()

    async def _connection(self, index: int) -> ClientConnection:
        conn = self._connections.get(index)
        if conn is None or conn.closed:
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(self.timeout_s):
                _, conn = await loop.create_connection(ClientConnection, self.host, self.port)
            self._connections[index] = conn
        return conn

    def close(self) -> None:
        for conn in self._connections.values():
            if conn.transport is not None:
                conn.transport.close()
        self._connections.clear()
