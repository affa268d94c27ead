"""Direct body writes: the server half of the streaming relay's fast path.

Relaying a stream through plain ASGI costs, per upstream chunk, a task wake-up (the upstream read's future)
and an ``await send(...)`` (a coroutine and a message dict). :class:`DirectBodyProtocol` is uvicorn's
httptools protocol plus one ASGI scope extension, ``specgate.direct_body``: a :class:`DirectBody` that
writes a body chunk to the client's connection with the same chunked framing uvicorn's ``send`` uses, as a
plain call. The relay hands it to the upstream client's protocol callback, so a chunk goes from the upstream
socket to the client socket without waking any task (see :meth:`gateway.rawclient._RawResponse.pipe`).

The response head, the first chunk and the end of the body still go through ASGI ``send``, so uvicorn keeps
its own bookkeeping (keep-alive, completion, access state). Flow control is kept: :meth:`DirectBody.write`
returns False once the client's transport is over its high-water mark, and the relay stops reading the
upstream until :meth:`DirectBody.drain` returns. Under any other server the extension is absent and the relay
uses plain ``send``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

DIRECT_BODY = "specgate.direct_body"


class DirectBody:
    """Writes body chunks of one chunked response straight to its connection."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle

    def usable(self) -> bool:
        """True while the response head went out chunked and the body is not complete."""
        cycle = self._cycle
        return cycle.response_started and not cycle.response_complete and cycle.chunked_encoding is True

    def write(self, body: bytes) -> bool:
        """Write one non-empty chunk; False asks the caller to wait for :meth:`drain` before writing more.

        After a client disconnect the bytes are dropped, as uvicorn's ``send`` drops them: the relay's
        disconnect watcher ends the request.
        """
        cycle = self._cycle
        if cycle.disconnected:
            return True
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return not cycle.flow.write_paused

    async def drain(self) -> None:
        await self._cycle.flow.drain()


class DirectBodyProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, offering :class:`DirectBody` to every request it starts."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        extensions: dict[str, Any] = cycle.scope.setdefault("extensions", {})
        extensions[DIRECT_BODY] = DirectBody(cycle)
        super()._start_asgi_task(cycle, app)


def direct_body(scope: Mapping[str, Any]) -> DirectBody | None:
    extensions = scope.get("extensions")
    if not extensions:
        return None
    writer = extensions.get(DIRECT_BODY)
    return writer if isinstance(writer, DirectBody) else None
