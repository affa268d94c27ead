"""An OpenAI-compatible emulated vLLM server, as a raw ASGI app (no framework on the hot path).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses`` (streaming: one SSE
event per engine step), ``GET /v1/responses/{id}`` (and ``/cancel``), ``POST /tokenize``, ``/detokenize``,
``/v1/embeddings`` (EMULATED contents, see :mod:`.extras`), ``GET /version``, ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (vLLM's names) and ``GET /emulator/stats`` (how well the loop keeps to the
emulated clock).
Every response carries ``x-specgate-emulated: true``.

A request's acceptance rate and natural output length come from the workload's ground truth, looked up by a
hash of the messages, or for unknown prompts from the profile (acceptance) and a draw seeded by that hash
(length). Nothing a client or gateway adds (headers, extra fields) changes them. See :mod:`.core`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry

from backends.emulator import extras
from backends.emulator import openai_io as io
from backends.emulator import responses_io as rio
from backends.emulator.core import EmulatorConfig, EmulatorCore, Job, full_body, stream_events
from backends.workloads.loader import Workload

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

__all__ = ["EmulatorApp", "EmulatorConfig"]

_POSTS = {"/v1/chat/completions": io.CHAT, "/v1/completions": io.COMPLETION, "/v1/responses": rio.RESPONSES}
SIMPLE_POSTS = frozenset({"/tokenize", "/detokenize", "/v1/embeddings"})
RESPONSE_PREFIX = "/v1/responses/"
CANCEL_SUFFIX = "/cancel"


class EmulatorApp:
    """The ASGI app around one :class:`EmulatorCore`."""

    def __init__(
        self, config: EmulatorConfig, workload: Workload | None = None, registry: CollectorRegistry | None = None
    ) -> None:
        self.core = EmulatorCore(config, workload, registry)
        self._headers = [(name.encode(), value.encode()) for name, value in self.core.headers.items()]
        self._gets: dict[str, Callable[[], tuple[bytes, str]]] = {
            "/health": lambda: (b"", "text/plain"),
            "/v1/models": lambda: (self.core.models_body(), "application/json"),
            "/metrics": self.core.metrics_body,
            "/emulator/stats": lambda: (self.core.stats_body(), "application/json"),
            "/version": lambda: (extras.version(), "application/json"),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def aclose(self) -> None:
        """Stop the engine loop (the lifespan's shutdown does this too)."""
        await self.core.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.core.ensure_running()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.core.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        if path in _POSTS and method == "POST":
            await self._complete(_POSTS[path], receive, send)
        elif path in SIMPLE_POSTS and method == "POST":
            await self._simple(lambda raw: self.core.simple(path, raw), receive, send)
        elif path.startswith(RESPONSE_PREFIX) and method == "GET":
            await self._simple(lambda _: self.core.responses.get(path[len(RESPONSE_PREFIX) :]), receive, send)
        elif path.startswith(RESPONSE_PREFIX) and path.endswith(CANCEL_SUFFIX) and method == "POST":
            rid = path[len(RESPONSE_PREFIX) : -len(CANCEL_SUFFIX)]
            await self._simple(lambda _: self.core.responses.cancel(rid), receive, send)
        elif path in self._gets and method in ("GET", "HEAD"):
            body, content_type = self._gets[path]()
            await self._send(send, 200, body, content_type)
        elif path in _POSTS or path in self._gets:
            await self._send_error(send, io.RequestError(405, f"method {method} not allowed on {path}"))
        else:
            await self._send_error(send, io.RequestError(404, f"no route {path}"))

    async def _complete(self, kind: str, receive: Receive, send: Send) -> None:
        try:
            parsed = self.core.parse(kind, await _read_body(receive))
        except io.RequestError as exc:
            await self._send_error(send, exc)
            return
        job = self.core.start(parsed)
        watcher = asyncio.get_running_loop().create_task(self._watch_disconnect(receive, job))
        try:
            await (self._stream(job, send) if parsed.stream else self._respond(job, send))
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self.core.finish(job)

    async def _simple(self, answer: Callable[[bytes], bytes], receive: Receive, send: Send) -> None:
        try:
            body = answer(await _read_body(receive))
        except io.RequestError as exc:
            await self._send_error(send, exc)
            return
        await self._send(send, 200, body, "application/json")

    async def _watch_disconnect(self, receive: Receive, job: Job) -> None:
        while (await receive())["type"] != "http.disconnect":
            continue
        self.core.finish(job)

    async def _respond(self, job: Job, send: Send) -> None:
        body = await full_body(job)
        if body is not None:  # None: the client went away
            await self._send(send, 200, body, "application/json")

    async def _stream(self, job: Job, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": [*headers, *self._headers]})
        ended = False
        async for event in stream_events(job):
            ended = event is io.DONE  # chat and completions end with [DONE]; the Responses API does not
            await send({"type": "http.response.body", "body": event, "more_body": not ended})
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send(self, send: Send, status: int, body: bytes, content_type: str) -> None:
        headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": [*headers, *self._headers]})
        await send({"type": "http.response.body", "body": body})

    async def _send_error(self, send: Send, error: io.RequestError) -> None:
        await self._send(send, error.status, error.body(), "application/json")


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
