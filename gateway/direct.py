"""Direct body writes: the server half of the streaming relay's fast path.

Relaying a stream through plain ASGI costs, per upstream chunk, a task wake-up (the upstream read's future)
and an ``await send(...)`` (a coroutine and a message dict). :class:`DirectBodyProtocol` is uvicorn's
httptools protocol plus one ASGI scope extension, ``specgate.direct_body``: a :class:`DirectBody` that
writes a body chunk to the client's connection with the same chunked framing uvicorn's ``send`` uses, as a
plain call. The relay hands it to the upstream client's protocol callback, so a chunk goes from the upstream
socket to the client socket without waking any task (see :meth:`gateway.rawclient._RawResponse.piper`).

The response head, the first chunk and the end of the body still go through ASGI ``send``, so uvicorn keeps
its own bookkeeping (keep-alive, completion, access state); :meth:`DirectBody.cork` only makes the head and
the first chunk leave in one write. Flow control is kept: :meth:`DirectBody.write`
returns False once the client's transport is over its high-water mark, and the relay stops reading the
upstream until :meth:`DirectBody.drain` returns. Under any other server the extension is absent and the relay
uses plain ``send``.

All this leans on uvicorn internals (the attributes in ``CYCLE_INTERNALS``, ``_start_asgi_task``), so
pyproject pins the uvicorn range it was tested with, and the protocol checks them once, at the first
request: when one is missing it logs one line and offers no extension, so the relay falls back to ``send``.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

DIRECT_BODY = "specgate.direct_body"
# What DirectBody reads or writes on uvicorn's RequestResponseCycle (and its flow control).
CYCLE_INTERNALS = ("transport", "flow", "response_started", "response_complete", "chunked_encoding", "disconnected")
FLOW_INTERNALS = ("write_paused", "drain")

log = logging.getLogger("specgate.direct")


def missing_internals(cycle: object) -> list[str]:
    """The uvicorn internals the fast path uses that ``cycle`` lacks (empty: the fast path is safe)."""
    missing = [name for name in CYCLE_INTERNALS if not hasattr(cycle, name)]
    flow = getattr(cycle, "flow", None)
    if flow is not None:
        missing += [f"flow.{name}" for name in FLOW_INTERNALS if not hasattr(flow, name)]
    if not hasattr(HttpToolsProtocol, "_start_asgi_task"):
        missing.append("HttpToolsProtocol._start_asgi_task")
    return missing


class DirectBody:
    """Writes body chunks of one chunked response straight to its connection.

    It holds its request cycle weakly: the cycle's scope holds this object, and a strong reference back
    would make every request a reference cycle for the garbage collector to find.
    """

    __slots__ = ("_cycle", "_on_disconnect")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = weakref.ref(cycle)
        self._on_disconnect: Callable[[], None] | None = None

    def usable(self) -> bool:
        """True while the response head went out chunked and the body is not complete."""
        cycle = self._cycle()
        return (
            cycle is not None
            and cycle.response_started
            and not cycle.response_complete
            and cycle.chunked_encoding is True
        )

    def write(self, body: bytes) -> bool:
        """Write one non-empty chunk; False asks the caller to wait for :meth:`drain` before writing more.

        After a client disconnect the bytes are dropped, as uvicorn's ``send`` drops them: the
        disconnect callback ends the request.
        """
        cycle = self._cycle()
        if cycle is None or cycle.disconnected:
            return True
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return not cycle.flow.write_paused

    async def drain(self) -> None:
        cycle = self._cycle()
        if cycle is not None:
            await cycle.flow.drain()

    def cork(self) -> None:
        """Hold what uvicorn's ``send`` writes until :meth:`uncork`, so a response head and its first body
        chunk leave in one write (one syscall, one wake-up of the client) instead of two."""
        cycle = self._cycle()
        if cycle is not None and not isinstance(cycle.transport, _Corked):
            cycle.transport = _Corked(cycle.transport)

    def uncork(self) -> None:
        cycle = self._cycle()
        if cycle is not None and isinstance(cycle.transport, _Corked):
            corked, cycle.transport = cycle.transport, cycle.transport.inner
            corked.flush()

    def on_disconnect(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` once when the client goes away (at once if it already has); None unregisters.

        This replaces a task per request that would wait on ASGI ``receive`` for ``http.disconnect``.
        """
        self._on_disconnect = callback
        cycle = self._cycle()
        if callback is not None and (cycle is None or cycle.disconnected):
            self.disconnected()

    def disconnected(self) -> None:
        callback, self._on_disconnect = self._on_disconnect, None
        if callback is not None:
            callback()


class _Corked(asyncio.Transport):
    """Stands in for a request cycle's transport while corked: collects writes; closing flushes first."""

    def __init__(self, inner: asyncio.Transport) -> None:
        super().__init__()
        self.inner = inner
        self._parts: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._parts.append(bytes(data))

    def flush(self) -> None:
        if self._parts:
            data = b"".join(self._parts)
            self._parts = []
            if not self.inner.is_closing():
                self.inner.write(data)

    def close(self) -> None:
        self.flush()
        self.inner.close()

    def is_closing(self) -> bool:
        return self.inner.is_closing()


class DirectBodyProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, offering :class:`DirectBody` to every request it starts."""

    _direct: DirectBody | None = None  # the writer of the request being served
    # Whether this uvicorn has the internals DirectBody uses: checked at the first request of the process
    # (a property of the installed uvicorn, not of a connection). None: not checked yet.
    compatible: ClassVar[bool | None] = None

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        compatible = DirectBodyProtocol.compatible
        if compatible is None:
            compatible = DirectBodyProtocol.compatible = self._check(cycle)
        if compatible:
            extensions: dict[str, Any] = cycle.scope.setdefault("extensions", {})
            extensions[DIRECT_BODY] = self._direct = DirectBody(cycle)
        super()._start_asgi_task(cycle, app)

    @staticmethod
    def _check(cycle: RequestResponseCycle) -> bool:
        missing = missing_internals(cycle)
        if missing:
            log.warning(
                "uvicorn %s lacks %s: streams are relayed through plain ASGI send (slower; see pyproject's pin)",
                _uvicorn_version(),
                ", ".join(missing),
            )
        return not missing

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        writer, self._direct = self._direct, None
        if writer is not None:
            writer.disconnected()


def direct_body(scope: Mapping[str, Any]) -> DirectBody | None:
    extensions = scope.get("extensions")
    if not extensions:
        return None
    writer = extensions.get(DIRECT_BODY)
    return writer if isinstance(writer, DirectBody) else None


def _uvicorn_version() -> str:
    import uvicorn

    return str(getattr(uvicorn, "__version__", "?"))
