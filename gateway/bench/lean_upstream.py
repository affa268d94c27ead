"""A lean fake OpenAI upstream for benchmarks: uvloop, one ``asyncio.Protocol`` per connection, httptools.

It answers ``POST /v1/chat/completions`` and ``POST /v1/completions`` with the same OpenAI shapes as
:mod:`gateway.bench.fake_upstream` (``chat.completion`` / ``text_completion`` with usage; chunk events, an
optional usage event, ``data: [DONE]``), ``GET /health`` and ``GET /v1/models``; ``POST /v1/traces`` accepts
(and discards) OTLP/HTTP span exports, so a traced proxy has somewhere to send them. It honours two headers:

    x-fake-chunks: 64         stream events (stream requests) / completion tokens (non-stream)
    x-fake-interval: 0.02     seconds between stream events

What makes it cheap enough to measure a proxy's sub-millisecond cost against:

- Response bodies are serialised once per (chat or completions, event count, usage event) and reused; the
  request body is parsed once (``orjson.loads``) only to learn ``stream`` and the kind.
- A stream's head and first event go out at once, in one write (an engine after prefill; uvicorn, too, sends
  the head with the first body chunk). Unpaced, the rest follow back to back, one ``transport.write`` per
  event as vLLM does (not coalesced: a proxy's per-chunk cost is what a benchmark measures). Paced, ONE
  shared ticker per interval value (an engine's decode step) gives every active stream with that interval its
  next event, so there is one timer for all streams, not one per event.
  The last event is followed at once by the tail (usage event if asked, ``[DONE]``, the final chunk).
- Flow control: a stream whose transport asked to pause writing gets nothing until it resumes (a paced one
  then continues at the next tick); a client that disconnects is dropped from its ticker.

Pipelined requests on one connection are answered in order. ``python -m gateway.bench.lean_upstream --port N``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass

import httptools
import orjson

from gateway.bench import shapes
from gateway.rawclient import nodelay

MAX_EVENTS = 100_000
_CACHE_LIMIT = 256
_STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
_WANTED_HEADERS = frozenset({b"x-fake-chunks", b"x-fake-interval"})


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _response(status: str, body: bytes, keep_alive: bool, content_type: bytes = b"application/json") -> bytes:
    connection = b"" if keep_alive else b"connection: close\r\n"
    head = b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (status.encode(), content_type, len(body))
    return head + connection + b"\r\n" + body


def _error(status: str, message: str, keep_alive: bool) -> bytes:
    body = {"error": {"message": message, "type": "BadRequestError", "code": int(status.split()[0])}}
    return _response(status, orjson.dumps(body), keep_alive)


@dataclass(frozen=True)
class StreamBody:
    """A stream's body, chunk-framed: one bytes object per event write, then the tail."""

    events: tuple[bytes, ...]
    tail: bytes  # usage event (when asked), data: [DONE], the terminating zero-size chunk


class Bodies:
    """Response bodies serialised once per shape and reused (bounded cache)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._streams: dict[tuple[bool, int, bool], StreamBody] = {}
        self._completions: dict[tuple[bool, int], bytes] = {}

    def stream(self, chat: bool, count: int, usage: bool) -> StreamBody:
        key = (chat, count, usage)
        body = self._streams.get(key)
        if body is None:
            if len(self._streams) >= _CACHE_LIMIT:
                self._streams.clear()
            body = self._streams[key] = self._build_stream(chat, count, usage)
        return body

    def completion(self, chat: bool, count: int) -> bytes:
        key = (chat, count)
        body = self._completions.get(key)
        if body is None:
            if len(self._completions) >= _CACHE_LIMIT:
                self._completions.clear()
            body = self._completions[key] = self._build_completion(chat, count)
        return body

    def _build_stream(self, chat: bool, count: int, usage: bool) -> StreamBody:
        events = tuple(
            _chunk(b"data: " + orjson.dumps(shapes.stream_event(self.model, chat, index, count)) + b"\n\n")
            for index in range(count)
        )
        tail = _chunk(b"data: " + orjson.dumps(shapes.usage_event(count)) + b"\n\n") if usage else b""
        return StreamBody(events, tail + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    def _build_completion(self, chat: bool, count: int) -> bytes:
        return orjson.dumps(shapes.completion(self.model, chat, count, served_by="lean"))

    def models(self) -> bytes:
        return orjson.dumps({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "fake"}]})


class Ticker:
    """One timer for every paced stream with the same interval: each tick, each stream gets its next event."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float) -> None:
        self._loop = loop
        self.interval_s = interval_s
        self.streams: dict[ServerConnection, None] = {}  # an ordered set
        self._handle: asyncio.TimerHandle | None = None
        self._next_at = 0.0

    def add(self, conn: ServerConnection) -> None:
        self.streams[conn] = None
        if self._handle is None:
            self._next_at = self._loop.time() + self.interval_s
            self._handle = self._loop.call_at(self._next_at, self._tick)

    def discard(self, conn: ServerConnection) -> None:
        self.streams.pop(conn, None)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self.streams.clear()

    def _tick(self) -> None:
        for conn in list(self.streams):  # a stream that ends discards itself
            if not conn.paused:
                conn.write_next_event()
        if not self.streams:
            self._handle = None
            return
        # Drift-free; when a tick ran late (the loop was busy), the next one comes at once, as an engine's would.
        self._next_at = max(self._next_at + self.interval_s, self._loop.time())
        self._handle = self._loop.call_at(self._next_at, self._tick)


@dataclass
class _Request:
    method: bytes
    path: bytes
    headers: dict[bytes, bytes]
    body: bytes
    keep_alive: bool


class ServerConnection(asyncio.Protocol):
    """One client connection: parses requests, answers them one at a time."""

    def __init__(self, upstream: LeanUpstream) -> None:
        self.upstream = upstream
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.paused = False
        self.closed = False
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._pending: deque[_Request] = deque()
        self._stream: StreamBody | None = None
        self._head = b""
        self._next_event = 0
        self._keep_alive = True
        self._ticker: Ticker | None = None

    # -- transport callbacks ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = nodelay(transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            raise  # a bug in this module, not a bad request: let the loop report it
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._write(_error("400 Bad Request", "malformed HTTP request", keep_alive=False))
            self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._stream is not None:
            self.upstream.cancelled += 1
            self._stream = None
        if self._ticker is not None:
            self._ticker.discard(self)
        self._pending.clear()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self._stream is not None and self._ticker is None:
            self._write_burst()

    # -- parser callbacks -------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in _WANTED_HEADERS:
            self._headers[name] = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        method: bytes = self.parser.get_method()
        path = self._url.split(b"?", 1)[0]
        request = _Request(method, path, self._headers, b"".join(self._body), self.parser.should_keep_alive())
        if self._stream is not None or self._pending:
            self._pending.append(request)
        else:
            self._answer(request)

    # -- answering --------------------------------------------------------------------------------------
    def _answer(self, request: _Request) -> None:
        self._keep_alive = request.keep_alive
        if request.method == b"GET":
            self._answer_get(request)
        elif request.method == b"POST" and request.path in (b"/v1/chat/completions", b"/v1/completions"):
            self._answer_completion(request)
        elif request.method == b"POST" and request.path == b"/v1/traces":  # an OTLP/HTTP sink for traced proxies
            self.upstream.trace_exports += 1
            self._finish(_response("200 OK", b"", request.keep_alive, b"application/x-protobuf"))
        else:
            self._finish(_error("404 Not Found", f"no route for {request.method.decode()} {request.path.decode()}",
                                request.keep_alive))  # fmt: skip

    def _answer_get(self, request: _Request) -> None:
        if request.path == b"/health":
            self._finish(_response("200 OK", b"", request.keep_alive, b"text/plain"))
        elif request.path == b"/v1/models":
            self._finish(_response("200 OK", self.upstream.bodies.models(), request.keep_alive))
        else:
            self._finish(_error("404 Not Found", f"no route for GET {request.path.decode()}", request.keep_alive))

    def _answer_completion(self, request: _Request) -> None:
        self.upstream.requests += 1
        try:
            body = orjson.loads(request.body)
            count = int(request.headers.get(b"x-fake-chunks") or body.get("max_tokens") or 16)
            interval = float(request.headers.get(b"x-fake-interval") or 0)
        except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError) as exc:
            self._finish(_error("400 Bad Request", f"bad request: {exc}", request.keep_alive))
            return
        if not 0 <= count <= MAX_EVENTS or not 0 <= interval <= 60:
            self._finish(_error("400 Bad Request", f"x-fake-chunks must be 0..{MAX_EVENTS}, x-fake-interval 0..60",
                                request.keep_alive))  # fmt: skip
            return
        chat = "messages" in body
        if not body.get("stream"):
            self._finish(_response("200 OK", self.upstream.bodies.completion(chat, count), request.keep_alive))
            return
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self._start_stream(self.upstream.bodies.stream(chat, count, usage), interval)

    def _start_stream(self, stream: StreamBody, interval: float) -> None:
        self._stream, self._next_event = stream, 0
        self._head = _STREAM_HEAD + (b"\r\n" if self._keep_alive else b"connection: close\r\n\r\n")
        if self.write_next_event() or self.closed:
            return
        if interval > 0:
            self._ticker = self.upstream.ticker(interval)
            self._ticker.add(self)
        else:
            self._write_burst()

    def _write_burst(self) -> None:
        while not self.paused and not self.write_next_event():
            pass

    def write_next_event(self) -> bool:
        """Write the stream's next event (and the tail after the last); True when the stream is over."""
        stream = self._stream
        if stream is None or self.closed:
            return True
        if self._next_event < len(stream.events):
            event = stream.events[self._next_event]
            self._write(self._head + event if self._head else event)  # the head goes out with the first event
            self._head = b""
            self._next_event += 1
        if self._next_event < len(stream.events):
            return False
        if self._ticker is not None:
            self._ticker.discard(self)
            self._ticker = None
        tail, self._head = self._head + stream.tail, b""  # the head is still here when there were no events
        self._finish(tail)
        return True

    def _finish(self, data: bytes) -> None:
        """Write the end of the current response, then answer the next pipelined request or close."""
        self._stream = None
        self._write(data)
        if not self._keep_alive:
            self._close()
        elif self._pending:
            self._answer(self._pending.popleft())

    def _write(self, data: bytes) -> None:
        # is_closing: the peer may have gone (EOF read, transport closing) before connection_lost is called
        if self.transport is not None and not self.closed and not self.transport.is_closing():
            self.transport.write(data)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class LeanUpstream:
    """The server: shared response bodies, one ticker per pacing interval, and request counters."""

    def __init__(self, model: str = "fake-model") -> None:
        self.bodies = Bodies(model)
        self.requests = 0
        self.cancelled = 0
        self.trace_exports = 0  # OTLP/HTTP batches received on POST /v1/traces (and discarded)
        self._tickers: dict[float, Ticker] = {}

    def ticker(self, interval_s: float) -> Ticker:
        ticker = self._tickers.get(interval_s)
        if ticker is None:
            ticker = self._tickers[interval_s] = Ticker(asyncio.get_running_loop(), interval_s)
        return ticker

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        return await loop.create_server(lambda: ServerConnection(self), host, port, backlog=4096)

    def stop(self) -> None:
        for ticker in self._tickers.values():
            ticker.stop()


async def serve(host: str, port: int, model: str) -> None:
    upstream = LeanUpstream(model)
    server = await upstream.start(host, port)
    try:
        await server.serve_forever()
    finally:
        upstream.stop()


def main(argv: list[str] | None = None) -> None:
    import uvloop

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="fake-model")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.host, args.port, args.model))


if __name__ == "__main__":
    main()
