"""The transport-free part of the emulator server: engine, loop, metrics, ground truth and response bodies.

:class:`EmulatorCore` turns a parsed request into an engine request (acceptance and natural length from the
workload's ground truth, looked up by a hash of the messages, or read from the prompt's content by the
profile's acceptance model for unknown prompts; never from anything else the client sends), and
:func:`stream_events` / :func:`full_body` turn its tokens into OpenAI bytes. The ASGI server (``server.py``)
and the aiohttp one (``aiohttp_server.py``) only move bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from backends.emulator import extras
from backends.emulator import openai_io as io
from backends.emulator import responses_io as rio
from backends.emulator.acceptance import ground_truth
from backends.emulator.metrics import EmulatorMetrics
from backends.emulator.profiles import Profile
from backends.emulator.runner import EngineRunner, Ticket
from backends.emulator.text import style_for, token_text
from backends.emulator.timing import Engine, EngineRequest, TimingModel
from backends.workloads.loader import Workload, WorkloadItem

EMULATED_HEADER = "x-specgate-emulated"
MODE_HEADER = "x-specgate-emulator-mode"
CONTENT_CACHE = 4096  # prompts whose content truth is kept (emptied when full)


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    profile: Profile
    speculative: bool
    speed: float = 1.0  # run this many times faster than the profile
    seed: int = 0
    served_model_name: str | None = None
    # vLLM's --enable-prefix-caching: hash each prompt's KV blocks and reuse the cached ones. Off by default
    # here (vLLM's default is on) so that existing emulated figures do not move (`specgate emulate
    # --enable-prefix-caching`).
    prefix_caching: bool = False

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.profile.model_name

    @property
    def mode(self) -> str:
        return "speculative" if self.speculative else "standard"


@dataclass(frozen=True, slots=True)
class Job:
    """One admitted request: what was asked, how its text looks, and its place in the engine."""

    parsed: io.ParsedRequest
    style: str
    rid: str
    created: int
    ticket: Ticket
    spec_k: int = 0  # draft tokens per step on a speculative engine; 0 on a standard one
    store: rio.ResponseStore | None = None  # Responses API: where the finished response is kept


class EmulatorCore:
    """One emulated engine. Build as many as you like; each owns its engine, registry and loop task."""

    def __init__(
        self, config: EmulatorConfig, workload: Workload | None = None, registry: CollectorRegistry | None = None
    ) -> None:
        if config.speed <= 0:
            raise ValueError("speed must be positive")
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        model = TimingModel(config.profile, config.speculative)
        self.metrics = EmulatorMetrics(self.registry, config.model_name, model.k if config.speculative else None)
        self.engine = Engine(model, random.Random(config.seed))
        self.runner = EngineRunner(self.engine, self.metrics, config.speed)
        self.headers = {EMULATED_HEADER: "true", MODE_HEADER: config.mode}
        truth = workload.with_model(config.profile.acceptance_model) if workload is not None else None
        self._truth: dict[str, WorkloadItem] = truth.by_key() if truth is not None else {}
        self._content: dict[str, tuple[float, int]] = {}  # prompt key -> content truth, for unknown prompts
        self._runner_task: asyncio.Task[None] | None = None
        self.responses = rio.ResponseStore()

    def ensure_running(self) -> None:
        """Start the engine loop on the running event loop (kept; stopped by :meth:`aclose`)."""
        if self._runner_task is None or self._runner_task.done():
            self._runner_task = asyncio.get_running_loop().create_task(self.runner.run())

    async def aclose(self) -> None:
        task, self._runner_task = self._runner_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def parse(self, kind: str, raw: bytes) -> io.ParsedRequest:
        name, max_len, blocks = self.config.model_name, self.config.profile.max_model_len, self.config.prefix_caching
        if kind == rio.RESPONSES:
            parsed = rio.parse_responses(raw, name, max_len, blocks)
        else:
            parsed = io.parse_request(kind, raw, name, max_len, blocks)
        if parsed.key not in self._truth and parsed.key not in self._content:
            self._remember(parsed, _roles(kind, raw, parsed))
        return parsed

    def _remember(self, parsed: io.ParsedRequest, messages: list[dict[str, Any]]) -> None:
        """Read an unknown prompt's content once: its acceptance and natural length, kept by its key."""
        if len(self._content) >= CONTENT_CACHE:
            self._content.clear()
        model = self.config.profile.acceptance_model
        self._content[parsed.key] = ground_truth(messages, self._draw_length(parsed.key), model)

    def start(self, parsed: io.ParsedRequest) -> Job:
        """Admit a parsed request into the engine."""
        self.ensure_running()
        request, style = self._engine_request(parsed)
        k = self.engine.model.k if self.config.speculative else 0
        if parsed.kind == rio.RESPONSES:
            ticket = self.runner.submit(request)
            return Job(parsed, style, rio.new_id(), int(time.time()), ticket, k, self.responses)
        rid = f"{'chatcmpl' if parsed.kind == io.CHAT else 'cmpl'}-{uuid.uuid4().hex}"
        return Job(parsed, style, rid, int(time.time()), self.runner.submit(request), k)

    def drift(self, task: str, acceptance: float) -> int:
        """From now on, serve the workload's ``task`` prompts at ``acceptance`` (a new draft model, a changed
        prompt template): drift experiments for tests and demos. Returns how many prompts changed."""
        changed = {key: dataclasses.replace(item, acceptance=acceptance)
                   for key, item in self._truth.items() if item.task == task}  # fmt: skip
        self._truth.update(changed)
        return len(changed)

    def simple(self, path: str, raw: bytes) -> bytes:
        """``POST /tokenize``, ``/detokenize`` or ``/v1/embeddings`` (no engine time: EMULATED shapes only)."""
        name, max_len = self.config.model_name, self.config.profile.max_model_len
        if path == "/tokenize":
            return extras.tokenize(raw, name, max_len)
        if path == "/detokenize":
            return extras.detokenize(raw, name)
        return extras.embeddings(raw, name)

    def finish(self, job: Job) -> None:
        """Release a job: a no-op when it completed, an abort when the client went away."""
        self.runner.abort(job.ticket)

    def _engine_request(self, parsed: io.ParsedRequest) -> tuple[EngineRequest, str]:
        item = self._truth.get(parsed.key)
        if item is not None:
            acceptance, drawn, task = item.acceptance, item.output_tokens, item.task
        else:
            if parsed.key not in self._content:  # parsed elsewhere: its roles are gone, its text is not
                self._remember(parsed, [{"role": "user", "content": parsed.prompt_text}])
            (acceptance, drawn), task = self._content[parsed.key], None
        limit = parsed.max_tokens or self.config.profile.max_model_len - parsed.prompt_tokens
        stops_early = drawn <= limit and not parsed.ignore_eos  # ignore_eos: only the length limit stops it
        request = EngineRequest(
            request_id=parsed.key,
            prompt_tokens=parsed.prompt_tokens,
            output_tokens=drawn if stops_early else limit,
            acceptance=acceptance,
            finish_reason="stop" if stops_early else "length",
            block_hashes=parsed.block_hashes,
        )
        return request, style_for(task, parsed.prompt_text)

    def _draw_length(self, key: str) -> int:
        spec = self.config.profile.output_length
        rng = random.Random(key)
        drawn = math.exp(math.log(spec.median) + spec.sigma * rng.gauss(0.0, 1.0))
        return int(min(max(round(drawn), spec.minimum), spec.maximum))

    def models_body(self) -> bytes:
        name = self.config.model_name
        model = {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "vllm",
            "root": name,
            "max_model_len": self.config.profile.max_model_len,
        }
        return orjson.dumps({"object": "list", "data": [model]})

    def stats_body(self) -> bytes:
        config = self.config
        return orjson.dumps(
            {
                "emulated": True,
                "mode": config.mode,
                "profile": config.profile.name,
                "speed": config.speed,
                "running": self.engine.num_running,
                "waiting": self.engine.num_waiting,
                **self.runner.stats.as_dict(),
            }
        )

    def metrics_body(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _roles(kind: str, raw: bytes, parsed: io.ParsedRequest) -> list[dict[str, Any]]:
    """A parsed request's messages with their roles (a chat's as sent; other kinds' text as one message)."""
    if kind == io.CHAT:
        messages = orjson.loads(raw).get("messages")  # parse() validated it: a list of objects with a role
        return [m for m in messages if isinstance(m, dict)]
    return [{"role": "user", "content": parsed.prompt_text}]


async def full_body(job: Job) -> bytes | None:
    """The whole response once the request finished; ``None`` when it was aborted."""
    accepted: list[int] = []
    drafted = 0
    while (emission := await job.ticket.queue.get()) is not None:
        if emission.drafted:
            accepted.append(emission.accepted)
            drafted += emission.draft_tokens
        if emission.finished:
            request = job.ticket.request
            text = token_text(job.style, job.parsed.continued, request.generated)
            if job.store is not None:
                final = rio.response_object(
                    job.parsed, job.rid, job.created, text, request.finish_reason, request.generated
                )
                body = orjson.dumps(final)
                job.store.put(job.rid, body)
                return body
            metrics = _metrics(job, accepted, drafted)
            return io.full_response(
                job.parsed, job.rid, job.created, text, request.finish_reason, request.generated, metrics
            )
    return None


def _metrics(job: Job, accepted: list[int], drafted: int) -> dict[str, Any] | None:
    """Per-request speculative metrics, as vLLM reports them with ``--per-request-spec-decode-metrics``
    (which the shipped speculative manifests turn on); None on a standard engine. ``drafted``: the draft
    tokens of its steps (each step's k; fewer than ``k`` per step under a dynamic schedule)."""
    k = job.spec_k
    return io.spec_decode_metrics(k, accepted, drafted) if k else None


async def stream_events(job: Job) -> AsyncIterator[bytes]:
    """SSE events: the role (chat), one event per engine step, usage if asked, then ``[DONE]``.

    As in vLLM, the chat role event goes out with the first engine output (after prefill), not on admission:
    a client's time to first token includes the prefill and any wait for a batch slot.
    """
    if job.store is not None:
        async for event in _response_events(job, job.store):
            yield event
        return
    parsed, produced, ticket = job.parsed, 0, job.ticket
    emission = await ticket.queue.get()
    if parsed.kind == io.CHAT and emission is not None:
        yield io.stream_chunk(parsed, job.rid, job.created, None, None, role=True)
    accepted: list[int] = []
    drafted = 0
    while emission is not None:
        if emission.drafted:
            accepted.append(emission.accepted)
            drafted += emission.draft_tokens
        text = token_text(job.style, parsed.continued + produced, emission.tokens)
        produced += emission.tokens
        finish = ticket.request.finish_reason if emission.finished else None
        yield io.stream_chunk(parsed, job.rid, job.created, text, finish)
        if emission.finished:
            break
        emission = await ticket.queue.get()
    if emission is not None and parsed.include_usage:
        yield io.usage_chunk(parsed, job.rid, job.created, produced, _metrics(job, accepted, drafted))
    yield io.DONE


async def _response_events(job: Job, store: rio.ResponseStore) -> AsyncIterator[bytes]:
    """The Responses API stream: vLLM's opening events, one text delta per engine step, the closing events."""
    writer, produced, pieces = rio.EventWriter(job.parsed, job.rid, job.created), 0, []
    for event in writer.opening():
        yield event
    while (emission := await job.ticket.queue.get()) is not None:
        text = token_text(job.style, produced, emission.tokens)
        produced += emission.tokens
        pieces.append(text)
        yield writer.delta(text)
        if emission.finished:
            text, finish = "".join(pieces), job.ticket.request.finish_reason
            final = rio.response_object(job.parsed, job.rid, job.created, text, finish, produced)
            store.put(job.rid, orjson.dumps(final))
            for event in writer.closing(final, text):
                yield event
            return
