"""An OpenAI-compatible emulated vLLM server, as a raw ASGI app (no framework on the hot path).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming: one SSE event per engine step),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (vLLM's names) and ``GET /emulator/stats`` (how well
the loop keeps to the emulated clock). Every response carries ``x-specgate-emulated: true``.

A request's acceptance rate and natural output length come from the workload's ground truth, looked up by a
hash of the messages, or for unknown prompts from the profile (acceptance) and a draw seeded by that hash
(length). Nothing a client or gateway adds (headers, extra fields) changes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from backends.emulator import openai_io as io
from backends.emulator.metrics import EmulatorMetrics
from backends.emulator.profiles import Profile
from backends.emulator.runner import EngineRunner, Ticket
from backends.emulator.text import style_for, token_text
from backends.emulator.timing import Emission, Engine, EngineRequest, TimingModel
from backends.workloads.loader import Workload, WorkloadItem

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

EMULATED_HEADER = b"x-specgate-emulated"
MODE_HEADER = b"x-specgate-emulator-mode"


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    profile: Profile
    speculative: bool
    speed: float = 1.0  # run this many times faster than the profile
    seed: int = 0
    served_model_name: str | None = None

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.profile.model_name

    @property
    def mode(self) -> str:
        return "speculative" if self.speculative else "standard"


@dataclass(frozen=True, slots=True)
class _Job:
    """What the handler needs besides the ticket: the parsed request and its output's text style."""

    parsed: io.ParsedRequest
    style: str
    rid: str
    created: int


class EmulatorApp:
    """The ASGI app. Build as many as you like; each owns its engine, registry and loop task."""

    def __init__(
        self,
        config: EmulatorConfig,
        workload: Workload | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if config.speed <= 0:
            raise ValueError("speed must be positive")
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        model = TimingModel(config.profile, config.speculative)
        k = model.k if config.speculative else None
        self.metrics = EmulatorMetrics(self.registry, config.model_name, k)
        self.engine = Engine(model, random.Random(config.seed))
        self.runner = EngineRunner(self.engine, self.metrics, config.speed)
        self._truth: dict[str, WorkloadItem] = workload.by_key() if workload is not None else {}
        self._runner_task: asyncio.Task[None] | None = None
        self._headers = [(EMULATED_HEADER, b"true"), (MODE_HEADER, config.mode.encode())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def aclose(self) -> None:
        """Stop the engine loop (the lifespan's shutdown does this too)."""
        task, self._runner_task = self._runner_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _ensure_runner(self) -> None:
        if self._runner_task is None or self._runner_task.done():
            self._runner_task = asyncio.get_running_loop().create_task(self.runner.run())

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._ensure_runner()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        posts = {"/v1/chat/completions": io.CHAT, "/v1/completions": io.COMPLETION}
        gets: dict[str, Callable[[], tuple[bytes, bytes]]] = {
            "/health": lambda: (b"", b"text/plain"),
            "/v1/models": self._models,
            "/metrics": lambda: (generate_latest(self.registry), CONTENT_TYPE_LATEST.encode()),
            "/emulator/stats": self._stats,
        }
        if path in posts and method == "POST":
            await self._complete(posts[path], receive, send)
        elif path in gets and method in ("GET", "HEAD"):
            body, content_type = gets[path]()
            await self._send(send, 200, body, content_type)
        elif path in posts or path in gets:
            await self._send_error(send, io.RequestError(405, f"method {method} not allowed on {path}"))
        else:
            await self._send_error(send, io.RequestError(404, f"no route {path}"))

    def _models(self) -> tuple[bytes, bytes]:
        model = {
            "id": self.config.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "vllm",
            "root": self.config.model_name,
            "max_model_len": self.config.profile.max_model_len,
        }
        return orjson.dumps({"object": "list", "data": [model]}), b"application/json"

    def _stats(self) -> tuple[bytes, bytes]:
        body = {
            "emulated": True,
            "mode": self.config.mode,
            "profile": self.config.profile.name,
            "speed": self.config.speed,
            "running": self.engine.num_running,
            "waiting": self.engine.num_waiting,
            **self.runner.stats.as_dict(),
        }
        return orjson.dumps(body), b"application/json"

    async def _complete(self, kind: str, receive: Receive, send: Send) -> None:
        try:
            parsed = io.parse_request(
                kind, await _read_body(receive), self.config.model_name, self.config.profile.max_model_len
            )
        except io.RequestError as exc:
            await self._send_error(send, exc)
            return
        self._ensure_runner()
        request, style = self._engine_request(parsed)
        job = _Job(parsed, style, _request_id(kind), int(time.time()))
        ticket = self.runner.submit(request)
        watcher = asyncio.get_running_loop().create_task(self._watch_disconnect(receive, ticket))
        try:
            await (self._stream(job, ticket, send) if parsed.stream else self._respond(job, ticket, send))
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self.runner.abort(ticket)

    def _engine_request(self, parsed: io.ParsedRequest) -> tuple[EngineRequest, str]:
        item = self._truth.get(parsed.key)
        if item is not None:
            acceptance, drawn, task = item.acceptance, item.output_tokens, item.task
        else:
            acceptance, drawn, task = (
                self.config.profile.default_acceptance,
                self._draw_length(parsed.key),
                None,
            )
        limit = parsed.max_tokens or self.config.profile.max_model_len - parsed.prompt_tokens
        request = EngineRequest(
            request_id=parsed.key,
            prompt_tokens=parsed.prompt_tokens,
            output_tokens=min(drawn, limit),
            acceptance=acceptance,
            finish_reason="length" if limit < drawn else "stop",
        )
        return request, style_for(task, parsed.prompt_text)

    def _draw_length(self, key: str) -> int:
        spec = self.config.profile.output_length
        rng = random.Random(key)
        drawn = math.exp(math.log(spec.median) + spec.sigma * rng.gauss(0.0, 1.0))
        return int(min(max(round(drawn), spec.minimum), spec.maximum))

    async def _watch_disconnect(self, receive: Receive, ticket: Ticket) -> None:
        while (await receive())["type"] != "http.disconnect":
            continue
        self.runner.abort(ticket)

    async def _respond(self, job: _Job, ticket: Ticket, send: Send) -> None:
        emissions = await _drain(ticket)
        if emissions is None:
            return  # the client went away
        text = token_text(job.style, 0, ticket.request.generated)
        body = io.full_response(
            job.parsed, job.rid, job.created, text, ticket.request.finish_reason, ticket.request.generated
        )
        await self._send(send, 200, body, b"application/json")

    async def _stream(self, job: _Job, ticket: Ticket, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    *self._headers,
                ],
            }
        )
        parsed, produced = job.parsed, 0
        if parsed.kind == io.CHAT:
            await _body(send, io.stream_chunk(parsed, job.rid, job.created, None, None, role=True))
        while (emission := await ticket.queue.get()) is not None:
            text = token_text(job.style, produced, emission.tokens)
            produced += emission.tokens
            finish = ticket.request.finish_reason if emission.finished else None
            await _body(send, io.stream_chunk(parsed, job.rid, job.created, text, finish))
            if emission.finished:
                break
        if emission is not None and parsed.include_usage:
            await _body(send, io.usage_chunk(parsed, job.rid, job.created, produced))
        await send({"type": "http.response.body", "body": io.DONE, "more_body": False})

    async def _send(self, send: Send, status: int, body: bytes, content_type: bytes) -> None:
        headers = [
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
            *self._headers,
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _send_error(self, send: Send, error: io.RequestError) -> None:
        await self._send(send, error.status, error.body(), b"application/json")


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _drain(ticket: Ticket) -> list[Emission] | None:
    emissions = []
    while (emission := await ticket.queue.get()) is not None:
        emissions.append(emission)
        if emission.finished:
            return emissions
    return None


async def _body(send: Send, chunk: bytes) -> None:
    await send({"type": "http.response.body", "body": chunk, "more_body": True})


def _request_id(kind: str) -> str:
    prefix = "chatcmpl" if kind == io.CHAT else "cmpl"
    return f"{prefix}-{uuid.uuid4().hex}"
