"""``specgate bench sessions``: multi-turn conversations through the gateway to two real pools, per policy.

**What is replayed.** The shipped session files (``backends/workloads/sessions/*.yaml``: ShareGPT chats, a
coding agent's tool loop, RAG questions over shared documents) or the given ones; the first
``sessions_per_file`` sessions of each file, at most ``turns`` turns each, the system prompt and every turn's
message cut to a byte budget (the CPU pair's context is 2,048 tokens; a byte is at most one token of a
byte-level BPE, about a quarter of one in English). A conversation's next turn is sent when the previous answer
has arrived, plus ``think_time_s``, with the history as chat messages: the system prompt, each earlier turn's
message and the answer **the engine returned** (not the file's recorded one), so what the engine cached while
answering is exactly the prefix the next turn resends. ``concurrency`` conversations are in flight at once,
each holding its slot from its first turn to its last. Streams are greedy with ``include_usage``; time to
first token is the client's, through the gateway, to the first content (or, for an empty answer, the finish).

**Phases**, over the same conversations:

- ``standard``, ``speculative``: pinned with ``x-specgate-pool`` (the shipped rules' pinning rules). Conversation
  *i* goes through gateway *i* mod 2, so both adaptive gateways below learn from both pools alike (route.py
  sends its pinned phases through its one adaptive gateway for the same reason: it learns from them).
- ``cache-blind``: the adaptive policy (the shipped rules) in a gateway with ``prefix_index=off``.
- ``cache-aware``: the same rules in a gateway with ``prefix_index=on``: every request's prefix blocks are read
  and the replica (and, where the policy reads the index, the pool) is chosen by where the prefix is likely
  cached. With one replica per pool, as the CPU pair has by default, only a pool choice that reads the index can
  differ; with several (``--standard`` and ``--speculative`` repeated, e.g. ``specgate backends launch --cpu
  --replicas 2``) the cache-blind gateway spreads a conversation's turns over its pool's replicas by power of
  two choices on booked tokens, and the cache-aware one sends them where its history is likely cached.

Before the first phase, one short unmeasured request goes straight to each pool (:func:`warm_up`). With
``repeat`` > 1 the order reverses every other pass (``route.phase_orders``), so that a machine that slows down
or speeds up weighs on every phase alike; each phase's figures pool its passes.

**Cold caches: a salt per phase.** Every phase must start from a prefix cache that holds none of its prompts,
or a later phase finds an earlier one's conversations cached and looks faster. Each phase run (each pass too)
opens every conversation's system prompt with its own random line, ``[run <16 hex digits>]``, the same for all
conversations of that run, so that those sharing a system prompt or documents still share them within it, as a
deployment's would. The first KV block then differs, and vLLM chains its block hashes, so no block of one run
matches another's. Not taken: vLLM's ``POST /reset_prefix_cache`` (only with ``VLLM_SERVER_DEV_MODE=1``, and
not for pools the benchmark did not launch); the per-request ``cache_salt`` field (vLLM's alone, the emulator
ignores it, and the gateway's prefix index does not read it: the cache-aware gateway, which also carries half
the pinned traffic, would believe a pinned run's prefixes were still cached where they are not); restarting
the engines (~30 s for the CPU pair here, and not possible for pools the benchmark did not launch). The
price: a dozen more prompt tokens per request, the same in every phase, and earlier runs' blocks left in the
engines' caches until evicted, oldest first (46,592 tokens of KV per CPU engine; a phase of 9 conversations of up
to 4 turns queried ~17,000 tokens of one engine).

**The engines' own hit rate.** Each replica's ``/metrics`` is read before and after each phase run (a pool's
counters are its replicas' summed):
``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`` over the run (tokens, vLLM's own counters;
the CPU engine caches in blocks of 128 tokens, so a prompt's tail under one block is never a hit).
The tables and the JSON are ``sessions_report``'s.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from backends.workloads.loader import WorkloadError
from backends.workloads.sessions import load_session_file, session_files, system_text
from gateway.app import create_app
from gateway.bench.route import adaptive_rules, phase_orders, warm_up
from gateway.config import Settings
from gateway.servers import ThreadServer

PHASES = ("standard", "speculative", "cache-blind", "cache-aware")
PINNED = ("standard", "speculative")
POOLS = ("standard", "speculative")
QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"


@dataclass(frozen=True)
class Conversation:
    id: str
    category: str
    system: str | None
    turns: tuple[tuple[str, str], ...]  # (role, content): a user's message, or a tool's output


@dataclass(frozen=True)
class SessionsConfig:
    standard_urls: Sequence[str]  # the pool's replicas (one URL each)
    speculative_urls: Sequence[str]
    conversations: Sequence[Conversation]
    concurrency: int = 4  # conversations in flight at once
    max_tokens: int = 64
    think_time_s: float = 0.0  # between an answer's end and the next turn
    repeat: int = 2  # passes over the four phases, each in the reverse order of the one before
    min_samples: int | None = None  # override the shipped rules' adaptive.min_samples
    timeout_s: float = 300.0
    health_timeout_s: float = 15.0
    model: str | None = None


@dataclass(frozen=True)
class TurnOutcome:
    conversation: str
    category: str
    turn: int  # 1: the conversation's first
    pool: str
    reason: str
    ttft_s: float | None
    e2e_s: float
    answer: str
    resent: tuple[str, ...]  # the assistant messages this turn's history carried: the earlier answers as received
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class CacheCounters:
    queries: float  # prompt tokens looked up in the engine's prefix cache
    hits: float  # of those, found cached

    def minus(self, before: CacheCounters) -> CacheCounters:
        return CacheCounters(self.queries - before.queries, self.hits - before.hits)


@dataclass
class PhaseRun:
    phase: str
    round: int  # the pass (0-based)
    nonce: str
    seconds: float
    outcomes: list[TurnOutcome]
    cache: dict[str, CacheCounters | None]  # per pool: the counters' rise over the run (None: not readable)


@dataclass
class SessionsResult:
    model: str = ""
    runs: list[PhaseRun] = field(default_factory=list)

    def outcomes(self, phase: str) -> list[TurnOutcome]:
        return [o for run in self.runs if run.phase == phase for o in run.outcomes]

    def errors(self) -> int:
        return sum(1 for run in self.runs for o in run.outcomes if o.error)


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8, on a character boundary."""
    data = text.encode("utf-8")
    return text if len(data) <= limit else data[:limit].decode("utf-8", "ignore")


def load_conversations(
    paths: Iterable[Path] | None = None, per_file: int | None = 3, turns: int | None = 4,
    system_bytes: int = 2048, message_bytes: int = 768,
) -> list[Conversation]:  # fmt: skip
    """The first ``per_file`` sessions of each session file (the shipped ones without ``paths``), at most
    ``turns`` turns each, the system prompt and each message cut to their byte budgets."""
    paths = None if paths is None else list(paths)
    conversations: list[Conversation] = []
    for path in session_files(paths):
        spec = load_session_file(path)
        for session in spec.sessions[:per_file]:
            system = system_text(spec, session)
            conversations.append(Conversation(
                session.id, spec.category, None if system is None else clip(system, system_bytes),
                tuple((turn.role, clip(turn.content, message_bytes)) for turn in session.turns[:turns]),
            ))  # fmt: skip
    if not conversations:
        where = ", ".join(map(str, paths)) if paths is not None else "the shipped session files"
        raise WorkloadError(f"no sessions in {where}")
    return conversations


def salted(nonce: str, system: str | None) -> str:
    """The system prompt a phase run sends: its own first line, then the conversation's system prompt."""
    return f"[run {nonce}]" + (f"\n{system}" if system else "")


def counter_totals(text: str, names: Iterable[str]) -> dict[str, float]:
    """Each named counter's samples summed over their label sets, from a Prometheus text (absent: left out)."""
    wanted, totals = set(names), dict[str, float]()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


async def read_cache(client: httpx.AsyncClient, url: str) -> CacheCounters | None:
    """The engine's prefix-cache counters from its ``/metrics`` (None: unreachable, or no such counters)."""
    try:
        response = await client.get(f"{url}/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    totals = counter_totals(response.text, (QUERIES, HITS))
    return CacheCounters(totals[QUERIES], totals.get(HITS, 0.0)) if QUERIES in totals else None


@dataclass(frozen=True)
class _Reply:
    ttft_s: float | None
    e2e_s: float
    answer: str = ""
    pool: str = "?"
    reason: str = "?"
    usage: dict[str, Any] | None = None
    error: str | None = None


async def _send(client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]) -> _Reply:
    """One streamed chat turn: the answer's text, time to its first content and to its end, usage, the pool."""
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    usage: dict[str, Any] | None = None
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as response:
            pool, reason = response.headers.get("x-specgate-pool", "?"), response.headers.get("x-specgate-reason", "?")
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                return _Reply(None, time.perf_counter() - started, "", pool, reason, None,
                              f"HTTP {response.status_code}: {text[:300]}")  # fmt: skip
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = orjson.loads(line[6:])
                if "error" in event:
                    return _Reply(first, time.perf_counter() - started, "".join(parts), pool, reason, usage,
                                  f"error event: {line[6:306]}")  # fmt: skip
                for choice in event.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") or ""
                    if first is None and (text or choice.get("finish_reason")):
                        first = time.perf_counter() - started
                    parts.append(text)
                usage = event.get("usage") or usage
    except httpx.HTTPError as exc:
        return _Reply(first, time.perf_counter() - started, "".join(parts), error=f"{type(exc).__name__}: {exc}")
    return _Reply(first, time.perf_counter() - started, "".join(parts), pool, reason, usage)


async def converse(
    client: httpx.AsyncClient, url: str, conversation: Conversation, phase: str, nonce: str, model: str,
    config: SessionsConfig,
) -> list[TurnOutcome]:  # fmt: skip
    """One conversation, turn after turn, each resending the history with the answers received so far. A turn
    that fails ends the conversation (its next turn would lack an answer)."""
    headers = {"x-specgate-pool": phase} if phase in PINNED else {}
    messages: list[dict[str, str]] = [{"role": "system", "content": salted(nonce, conversation.system)}]
    answers: list[str] = []
    outcomes: list[TurnOutcome] = []
    for number, (role, content) in enumerate(conversation.turns, start=1):
        if number > 1 and config.think_time_s > 0:
            await asyncio.sleep(config.think_time_s)
        messages.append({"role": role, "content": content})
        body = {
            "model": model, "messages": list(messages), "max_tokens": config.max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        reply = await _send(client, url, body, headers)
        usage = reply.usage or {}
        outcomes.append(TurnOutcome(
            conversation.id, conversation.category, number, reply.pool, reply.reason, reply.ttft_s, reply.e2e_s,
            reply.answer, tuple(answers), usage.get("prompt_tokens"), usage.get("completion_tokens"), reply.error,
        ))  # fmt: skip
        if reply.error is not None:
            break
        messages.append({"role": "assistant", "content": reply.answer})
        answers.append(reply.answer)
    return outcomes


def gateway_for(phase: str, index: int, gateways: Sequence[str]) -> str:
    """The gateway a conversation goes through: pinned, alternately the cache-blind (0) and the cache-aware (1)
    one; routed, the phase's own."""
    if phase in PINNED:
        return gateways[index % 2]
    return gateways[0] if phase == "cache-blind" else gateways[1]


async def run_phase(
    client: httpx.AsyncClient, gateways: Sequence[str], phase: str, nonce: str, model: str, config: SessionsConfig
) -> list[TurnOutcome]:
    """Every conversation through the phase's gateway, ``concurrency`` in flight at once."""
    gate = asyncio.Semaphore(max(config.concurrency, 1))

    async def one(index: int, conversation: Conversation) -> list[TurnOutcome]:
        async with gate:
            url = gateway_for(phase, index, gateways)
            return await converse(client, url, conversation, phase, nonce, model, config)

    done = await asyncio.gather(*(one(i, c) for i, c in enumerate(config.conversations)))
    return [outcome for outcomes in done for outcome in outcomes]


async def drive(
    config: SessionsConfig, gateways: Sequence[str], result: SessionsResult, nonce: Callable[[], str]
) -> None:
    """The phases of every pass against the running gateways (cache-blind, cache-aware), the engines' prefix-cache
    counters read around each run."""
    pools = {"standard": tuple(config.standard_urls), "speculative": tuple(config.speculative_urls)}
    async with httpx.AsyncClient(timeout=config.timeout_s) as client:
        first = config.standard_urls[0]
        model = config.model or (await client.get(f"{first}/v1/models")).json()["data"][0]["id"]
        result.model = model
        await warm_up(client, [url for urls in pools.values() for url in urls], model, salted(nonce(), None))
        for round_, order in enumerate(phase_orders(config.repeat, PHASES)):
            for phase in order:
                salt = nonce()
                before = {name: await read_pool_cache(client, urls) for name, urls in pools.items()}
                started = time.perf_counter()
                outcomes = await run_phase(client, gateways, phase, salt, model, config)
                seconds = time.perf_counter() - started
                after = {name: await read_pool_cache(client, urls) for name, urls in pools.items()}
                cache = {name: _rise(before[name], after[name]) for name in pools}
                result.runs.append(PhaseRun(phase, round_, salt, seconds, outcomes, cache))


async def read_pool_cache(client: httpx.AsyncClient, urls: Iterable[str]) -> CacheCounters | None:
    """A pool's prefix-cache counters: its replicas' summed (None: any replica's unreadable)."""
    counters = [await read_cache(client, url) for url in urls]
    if any(c is None for c in counters):
        return None
    return CacheCounters(sum(c.queries for c in counters if c), sum(c.hits for c in counters if c))


def _rise(before: CacheCounters | None, after: CacheCounters | None) -> CacheCounters | None:
    return None if before is None or after is None else after.minus(before)


def _gateway(config: SessionsConfig, rules: Path, prefix_index: str) -> ThreadServer:
    settings = Settings(
        _env_file=None,
        standard_urls=list(config.standard_urls), speculative_urls=list(config.speculative_urls), rules_file=rules,
        reload_rules=False, first_byte_timeout_s=config.timeout_s, idle_timeout_s=config.timeout_s,
        health_timeout_s=config.health_timeout_s,  # a busy CPU engine answers /health late (route.py)
        prefix_index=prefix_index,
    )  # fmt: skip
    return ThreadServer(create_app(settings, CollectorRegistry()))


def bench_sessions(config: SessionsConfig, nonce: Callable[[], str] | None = None) -> SessionsResult:
    """Run the benchmark: two gateways (the shipped rules, prefix index off and on) in front of the pools."""
    result = SessionsResult()
    with tempfile.TemporaryDirectory() as folder:
        rules = adaptive_rules(Path(folder), config.min_samples)
        with _gateway(config, rules, "off") as blind, _gateway(config, rules, "on") as aware:
            asyncio.run(drive(config, (blind.url, aware.url), result, nonce or (lambda: secrets.token_hex(8))))
    return result
