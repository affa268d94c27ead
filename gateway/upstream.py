"""The one seam to the upstream replicas.

``Upstream.send`` forwards a request and returns once the response headers are in; library errors are
mapped to the gateway's own (:class:`UpstreamConnectError`, :class:`UpstreamTimeout`) with ``raise ... from``.
Timeouts for the first byte and for idle streams are enforced by the caller's :class:`gateway.guard.Guard`,
which costs one float store per chunk instead of a timer per read.

Implementations: the lean httptools-based client in :mod:`gateway.rawclient` ("raw", plain HTTP only),
aiohttp (measured several times cheaper per request than httpx, see ``specgate bench overhead``), and httpx
(optionally with the httpx-aiohttp transport), kept for comparison. The default, "auto", uses the raw client
for ``http://`` replicas and aiohttp for ``https://`` ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from gateway.config import Settings
from gateway.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout

# Hop-by-hop and framing headers are never relayed (RFC 9110 7.6.1), nor those a Connection header names;
# the gateway frames its own messages. x-request-id: the gateway sends its own (the one it forwarded, which
# vLLM echoes when asked to). The client's credentials never reach a pool (a pool's own key is sent
# instead, see gateway.auth.upstream_headers).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-authenticate",
        "proxy-connection",
    }
)
_DROP_RESPONSE = frozenset(
    {name.encode() for name in HOP_BY_HOP} | {b"content-length", b"date", b"server", b"x-request-id"}
)
DROP_REQUEST = HOP_BY_HOP | {"host", "content-length", "expect", "authorization", "api-key", "x-api-key"}

RawHeaders = list[tuple[bytes, bytes]]
Sink = Callable[[bytes], bool]  # takes a body chunk; False: wait for the drain before the next one
Pipe = Callable[[Sink, Callable[[], Awaitable[None]]], Awaitable[bytes]]  # returns the body's unrelayed tail


class UpstreamResponse(Protocol):
    """A response whose head is in. ``reader()`` returns the library's own read-some-bytes coroutine
    function (``b""`` at the end), so relaying a chunk costs no wrapper; it raises ``read_errors``.

    ``piper()`` returns a pipe when the client can push the rest of the body into a synchronous sink from
    its protocol callbacks (the raw client can; aiohttp and httpx return None): ``await pipe(sink, drain)``
    ends with the body, returns the bytes that came with its end (for the caller to send with its own end)
    and raises ``read_errors``.
    """

    status: int
    headers: RawHeaders  # relayable headers, lower-case names
    read_errors: tuple[type[BaseException], ...]

    async def read(self) -> bytes: ...
    def reader(self) -> Callable[[], Awaitable[bytes]]: ...
    def piper(self) -> Pipe | None: ...
    async def close(self) -> None: ...


class Upstream(Protocol):
    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def send(self, url: str, body: bytes, headers: dict[str, str], method: str = "POST") -> UpstreamResponse: ...


def relayable(raw: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]) -> RawHeaders:
    headers: RawHeaders = []
    connection = b""
    for name, value in raw:
        name = name.lower()
        if name not in _DROP_RESPONSE:
            headers.append((name, value))
        elif name == b"connection":
            connection += b"," + value.lower()
    if not connection:  # the usual case: nothing more to drop
        return headers
    named = {token.strip() for token in connection.split(b",")} - {b"", b"close", b"keep-alive"}
    return [(k, v) for k, v in headers if k not in named] if named else headers


def forwardable(headers: dict[str, str]) -> dict[str, str]:
    """The client's headers a pool may see: no hop-by-hop ones, none the Connection header names."""
    drop = DROP_REQUEST
    connection = headers.get("connection")
    if connection is not None:
        drop = drop | {token.strip().lower() for token in connection.split(",")}
    return {k: v for k, v in headers.items() if k not in drop}


class _AiohttpResponse:
    __slots__ = ("_resp", "headers", "status")
    read_errors: tuple[type[BaseException], ...] = (aiohttp.ClientError,)

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = relayable(resp.raw_headers)

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"upstream broke off the response: {exc}") from exc

    def reader(self) -> Callable[[], Awaitable[bytes]]:
        return self._resp.content.readany

    def piper(self) -> Pipe | None:
        return None

    async def close(self) -> None:
        self._resp.close()


class AiohttpUpstream:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._settings.max_connections, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._settings.connect_timeout_s)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, url: str, body: bytes, headers: dict[str, str], method: str = "POST") -> UpstreamResponse:
        assert self._session is not None, "Upstream.start() was not awaited"
        try:
            resp = await self._session.request(method, url, data=body, headers=headers)
        except (aiohttp.ConnectionTimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeout(f"timed out connecting to {url}") from exc
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise UpstreamConnectError(f"cannot reach upstream {url}: {exc}") from exc
        return _AiohttpResponse(resp)


class _HttpxResponse:
    __slots__ = ("_next", "_resp", "headers", "status")
    read_errors: tuple[type[BaseException], ...] = (httpx.HTTPError,)

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self.status = resp.status_code
        self.headers = relayable(resp.headers.raw)

    async def read(self) -> bytes:
        try:
            return b"".join([chunk async for chunk in self._resp.aiter_raw()])
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream broke off the response: {exc}") from exc
        finally:
            await self._resp.aclose()

    def reader(self) -> Callable[[], Awaitable[bytes]]:
        raw = self._resp.aiter_raw()

        async def next_chunk() -> bytes:
            return await anext(raw, b"")

        return next_chunk

    def piper(self) -> Pipe | None:
        return None

    async def close(self) -> None:
        await self._resp.aclose()


class HttpxUpstream:
    def __init__(self, settings: Settings, *, aiohttp_transport: bool = False) -> None:
        self._settings = settings
        self._aiohttp_transport = aiohttp_transport
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        limits = httpx.Limits(max_connections=self._settings.max_connections or None, max_keepalive_connections=None)
        timeout = httpx.Timeout(None, connect=self._settings.connect_timeout_s)
        transport: httpx.AsyncBaseTransport | None = None
        if self._aiohttp_transport:
            transport = AiohttpTransport()
        self._client = httpx.AsyncClient(limits=limits, timeout=timeout, transport=transport)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def send(self, url: str, body: bytes, headers: dict[str, str], method: str = "POST") -> UpstreamResponse:
        assert self._client is not None, "Upstream.start() was not awaited"
        request = self._client.build_request(method, url, content=body, headers=headers)
        try:
            resp = await self._client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(f"timed out connecting to {url}") from exc
        except httpx.TransportError as exc:
            raise UpstreamConnectError(f"cannot reach upstream {url}: {exc}") from exc
        return _HttpxResponse(resp)


class AutoUpstream:
    """The default: the raw client for ``http://`` replicas (the cheapest, see ``specgate bench overhead``),
    aiohttp for ``https://`` ones (the raw client speaks no TLS)."""

    def __init__(self, settings: Settings) -> None:
        from gateway.rawclient import RawUpstream  # it builds on this module's types

        self._plain = RawUpstream(settings)
        self._tls = AiohttpUpstream(settings)

    async def start(self) -> None:
        await self._plain.start()
        await self._tls.start()

    async def close(self) -> None:
        await self._plain.close()
        await self._tls.close()

    def send(
        self, url: str, body: bytes, headers: dict[str, str], method: str = "POST"
    ) -> Coroutine[Any, Any, UpstreamResponse]:
        """The chosen client's own coroutine (no extra coroutine frame per request)."""
        client: Upstream = self._plain if url.startswith("http://") else self._tls
        return client.send(url, body, headers, method)


Fetch = Callable[[str, float], Awaitable[tuple[int, bytes]]]  # GET url within timeout_s: (status, body)


def fetcher(upstream: Upstream) -> Fetch:
    """GETs through the upstream seam, for the health checks and the engine scrapes: the raw client for
    ``http://`` replicas (with ``auto``), each GET ~0.1 ms of the loop against ~1.5 ms through httpx, which
    they used before (issue 30: the scrapes and checks were a third of an idle gateway's CPU). Give it an
    upstream of its own: a check must not wait for a connection the proxied requests hold.

    The GET raises :class:`UpstreamTimeout` when the whole exchange took longer than ``timeout_s``,
    :class:`UpstreamConnectError` when the replica could not be reached, :class:`UpstreamError` when it broke
    off its answer. The deadline is judged a turn of the loop after it passed (``reschedule`` to now queues the
    timeout behind what is ready), so that an answer which reached the socket while the gateway's own loop was
    held (a stall of the gateway's, not the replica's slowness) is read first and wins, where
    ``asyncio.timeout(timeout_s)`` would cancel it (tests/test_upstream.py, on asyncio's loop and uvloop)."""

    async def get(url: str, timeout_s: float) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        finished = False
        try:
            async with asyncio.timeout(None) as deadline:

                def expire() -> None:
                    if not finished:
                        deadline.reschedule(loop.time())

                handle = loop.call_at(loop.time() + timeout_s, expire)
                try:
                    response = await upstream.send(url, b"", {}, "GET")
                    try:
                        answer = response.status, await response.read()
                    except response.read_errors as exc:
                        raise UpstreamError(f"{url} broke off its answer: {exc}") from exc
                    finally:
                        await response.close()  # a no-op once the body was read; else the connection is dropped
                    finished = True
                    return answer
                finally:
                    handle.cancel()
        except TimeoutError as exc:
            raise UpstreamTimeout(f"no answer from {url} within {timeout_s:g} s") from exc

    return get


def make_upstream(settings: Settings) -> Upstream:
    if settings.upstream_client == "auto":
        return AutoUpstream(settings)
    if settings.upstream_client == "raw":
        from gateway.rawclient import RawUpstream  # it builds on this module's types

        return RawUpstream(settings)
    if settings.upstream_client == "httpx":
        return HttpxUpstream(settings)
    if settings.upstream_client == "httpx-aiohttp":
        return HttpxUpstream(settings, aiohttp_transport=True)
    return AiohttpUpstream(settings)
