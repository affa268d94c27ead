"""Limits on what a client may send before the gateway sees a request: head size and read time.

uvicorn's httptools protocol puts no bound on a request head (llhttp has none: every header of a 100 MB head
is kept) and no deadline on reading a request: its keep-alive timer runs only *between* requests, so a
client that opens a connection, or sends half a head or half a body, and stalls holds a connection, a file
descriptor and (past the head) a request task forever. Hundreds of such clients are cheap for an attacker.

:class:`IntakeProtocol` is :class:`gateway.direct.DirectBodyProtocol` plus two limits:

- ``max_head_bytes``: a request head (request line + headers) larger than this is answered with 431 and the
  connection closed, before the parser keeps any of it. Counted per socket read while a head is incomplete
  (up to the blank line when the read holds it): one C-level search per request, nothing per header.
- Requests the HTTP parser refuses get a 400 in OpenAI's error shape (uvicorn's is plain text), like every
  other error the gateway makes.
- ``read_timeout_s``: from a connection's opening, or a request's first byte, to the request's last body
  byte. Past it the connection is answered 408 (when no response is under way on it) and closed; a request
  whose body was being read sees ``http.disconnect``. One timer per connection, re-armed at most once per
  ``read_timeout_s``, never a timer per request.

Both come from :class:`gateway.config.Settings` (``client_max_head_bytes``, ``client_read_timeout_s``) via
:func:`intake_protocol`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.direct import DirectBodyProtocol
from gateway.errors import error_body

DEFAULT_MAX_HEAD_BYTES = 64 * 1024
DEFAULT_READ_TIMEOUT_S = 60.0


def _error_response(status: bytes, message: str, code: str) -> bytes:
    """A complete response in OpenAI's error shape that closes the connection."""
    body = error_body(message, "invalid_request_error", None, code)
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
    )


_TOO_LARGE = _error_response(b"431 Request Header Fields Too Large", "request head too large", "request_head_too_large")
_TIMEOUT = _error_response(b"408 Request Timeout", "request not received in time", "request_timeout")
_MALFORMED = _error_response(b"400 Bad Request", "malformed HTTP request", "invalid_http")


class IntakeProtocol(DirectBodyProtocol):
    """uvicorn's httptools protocol with :class:`DirectBody`, a head-size limit and a read deadline."""

    max_head_bytes = DEFAULT_MAX_HEAD_BYTES
    read_timeout_s = DEFAULT_READ_TIMEOUT_S

    _head_pending = True  # the current (or next) request's head is not complete yet
    _head_bytes = 0
    _reading_since: float | None = None  # when the request being read began; None between requests
    _read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._reading_since = self.loop.time()
        self._read_timer = self.loop.call_later(self.read_timeout_s, self._check_read)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._head_pending:
            end = data.find(b"\r\n\r\n")  # one C search per read that starts inside a head
            self._head_bytes += len(data) if end < 0 else end
            if self._head_bytes > self.max_head_bytes:
                self._refuse(_TOO_LARGE)  # before parsing it: the parser would keep every header
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._reading_since is None:
            self._reading_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self._head_pending = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_pending, self._head_bytes, self._reading_since = True, 0, None

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request its parser refuses, in OpenAI's error shape instead of plain text."""
        self._refuse(_MALFORMED)

    def _check_read(self) -> None:
        self._read_timer = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:  # closed, or now a websocket
            return
        since, now = self._reading_since, self.loop.time()
        if since is not None and now - since >= self.read_timeout_s:
            self._refuse(_TIMEOUT)
            return
        delay = self.read_timeout_s if since is None else since + self.read_timeout_s - now
        self._read_timer = self.loop.call_later(delay, self._check_read)

    def _refuse(self, response: bytes) -> None:
        """Answer ``response`` and close, unless a response is under way here (then only close: the bytes
        would land inside it). A request task still reading its body sees ``http.disconnect``; what it sends
        then is dropped by uvicorn."""
        if self.transport.is_closing():
            return
        cycle = getattr(self, "cycle", None)  # uvicorn's current request cycle (None before the first request)
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(response)
        self.transport.close()


def intake_protocol(max_head_bytes: int, read_timeout_s: float) -> type[IntakeProtocol]:
    """An :class:`IntakeProtocol` subclass with these limits (uvicorn takes a protocol class, not an instance)."""
    attrs: dict[str, Any] = {"max_head_bytes": max_head_bytes, "read_timeout_s": read_timeout_s}
    return type("ConfiguredIntakeProtocol", (IntakeProtocol,), attrs)
