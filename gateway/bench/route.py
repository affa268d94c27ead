"""``specgate bench route``: the shipped workload through the gateway to two real pools, per policy.

One short unmeasured request goes straight to each pool first (:func:`warm_up`: an engine's first request pays
one-off costs). At each concurrency level (closed loop) the same requests run four times: pinned to the standard pool,
pinned to the speculative pool, routed by the reference rules (a gateway with ``rules-reference.yaml``) and
routed by the adaptive policy (a gateway with the shipped rules). With ``repeat`` > 1 the four phases run
again in the reverse order (standard, speculative, rules, adaptive, then adaptive, rules, speculative,
standard, ...), and each policy's figures pool its passes: a machine that slows down or speeds up during
the run then weighs on every policy alike, not on whichever phase ran last. The pinned phases go through the adaptive
gateway, so it learns from them as it would from any traffic; how many requests it had taken in when its
model first decided is reported. Streams with ``include_usage`` (exact token counts, and vLLM's per-request
acceptance when the speculative pool reports it); latency is the client's, through the gateway.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from gateway.adaptive.suggest_k import KSuggestion, suggest_k, table_text
from gateway.app import create_app
from gateway.bench.compare import BenchItem
from gateway.config import Settings
from gateway.rules import default_rules_path, reference_rules_path
from gateway.servers import ThreadServer

PHASES = ("standard", "speculative", "rules", "adaptive")


@dataclass(frozen=True)
class RouteConfig:
    standard_url: str
    speculative_url: str
    items: Sequence[BenchItem]
    concurrency: Sequence[int] = (1, 8)
    max_tokens_cap: int | None = 128
    min_samples: int | None = None  # override the shipped rules' adaptive.min_samples (short runs)
    repeat: int = 2  # passes over the four phases per level, alternating their order
    timeout_s: float = 300.0
    health_timeout_s: float = 15.0
    model: str | None = None
    suggest_k: int | None = None  # the speculative pool's k: after the run, what suggest-k reads from the model


@dataclass(frozen=True)
class Outcome:
    item: BenchItem
    latency_s: float
    pool: str
    reason: str
    error: str | None = None


@dataclass
class RouteResult:
    outcomes: dict[tuple[int, str], list[Outcome]] = field(default_factory=dict)
    learned_after: int | None = None
    model: str = ""
    # per pool: its learned time-per-token factor while the other pool is busy (shared hardware; 1.0: none seen)
    while_other_busy: dict[str, float] = field(default_factory=dict)
    while_other_busy_fit: dict[str, Any] = field(default_factory=dict)  # what each was read from (None: no spread)
    k_suggestion: KSuggestion | None = None  # --suggest-k: the adaptive gateway's suggested k table

    def mean(self, concurrency: int, phase: str, category: str | None = None) -> float:
        chosen = [o.latency_s for o in self.outcomes[concurrency, phase] if category in (None, o.item.category)]
        return statistics.fmean(chosen) if chosen else float("nan")

    def errors(self) -> int:
        return sum(1 for outcomes in self.outcomes.values() for o in outcomes if o.error)


def adaptive_rules(directory: Path, min_samples: int | None) -> Path:
    """The shipped rules (pins, then `fastest`) with ``min_samples`` overridden, written into ``directory``."""
    data = yaml.safe_load(default_rules_path().read_text(encoding="utf-8"))
    if min_samples is not None:
        data.setdefault("adaptive", {})["min_samples"] = min_samples
    path = directory / "adaptive-rules.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def _gateway(config: RouteConfig, rules: Path) -> ThreadServer:
    settings = Settings(
        _env_file=None,
        standard_urls=[config.standard_url], speculative_urls=[config.speculative_url], rules_file=rules,
        reload_rules=False, first_byte_timeout_s=config.timeout_s, idle_timeout_s=config.timeout_s,
        # A CPU engine busy with a batch answers /health seconds late; with the default 2 s the pools flapped
        # down and up, and a pinned phase's requests fell back to the other pool, measuring the wrong pool.
        health_timeout_s=config.health_timeout_s,
    )  # fmt: skip
    return ThreadServer(create_app(settings, CollectorRegistry()))


def _body(item: BenchItem, model: str, cap: int | None) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [dict(m) for m in item.messages],
        "max_tokens": item.max_tokens if cap is None else min(item.max_tokens, cap),
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _one(client: httpx.AsyncClient, url: str, item: BenchItem, body: dict[str, Any], phase: str) -> Outcome:
    headers = {"x-specgate-pool": phase} if phase in ("standard", "speculative") else {}
    started = time.perf_counter()
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as response:
            text = b"".join([chunk async for chunk in response.aiter_bytes()])
            pool, reason = response.headers.get("x-specgate-pool", "?"), response.headers.get("x-specgate-reason", "?")
            error = None if response.status_code == 200 and b'"error"' not in text else text[:300].decode("replace")
    except httpx.HTTPError as exc:
        return Outcome(item, time.perf_counter() - started, "?", "?", f"{type(exc).__name__}: {exc}")
    return Outcome(item, time.perf_counter() - started, pool, reason, error)


async def _phase(
    client: httpx.AsyncClient, url: str, items: Sequence[BenchItem], model: str, config: RouteConfig,
    concurrency: int, phase: str,
) -> list[Outcome]:  # fmt: skip
    gate = asyncio.Semaphore(concurrency)

    async def one(item: BenchItem) -> Outcome:
        async with gate:
            return await _one(client, url, item, _body(item, model, config.max_tokens_cap), phase)

    return list(await asyncio.gather(*(one(item) for item in items)))


def phase_orders(repeat: int, phases: tuple[str, ...] = PHASES) -> list[tuple[str, ...]]:
    """The phases of each pass: in order, then reversed, and so on (``repeat`` passes, at least one)."""
    return [phases if i % 2 == 0 else phases[::-1] for i in range(max(repeat, 1))]


async def _drive(config: RouteConfig, adaptive_url: str, rules_url: str, result: RouteResult) -> None:
    async with httpx.AsyncClient(timeout=config.timeout_s) as client:
        model = config.model or (await client.get(f"{config.standard_url}/v1/models")).json()["data"][0]["id"]
        result.model = model
        await warm_up(client, (config.standard_url, config.speculative_url), model)
        for concurrency in config.concurrency:
            items = [config.items[i % len(config.items)] for i in range(max(len(config.items), concurrency))]
            for order in phase_orders(config.repeat):
                for phase in order:
                    url = rules_url if phase == "rules" else adaptive_url
                    outcomes = await _phase(client, url, items, model, config, concurrency, phase)
                    result.outcomes.setdefault((concurrency, phase), []).extend(outcomes)
        view = (await client.get(f"{adaptive_url}/v1/route/model")).json()
        result.learned_after = view.get("warm_after")
        pools = view.get("pools") or {}
        result.while_other_busy = {name: pool.get("tpot_factor_while_other_busy", 1.0) for name, pool in pools.items()}
        result.while_other_busy_fit = {name: pool.get("while_other_busy_fit") for name, pool in pools.items()}
        if config.suggest_k is not None and len(pools) == 2:
            result.k_suggestion = suggest_k(view, config.suggest_k, min_samples=1.0)  # a short run's few samples


async def warm_up(client: httpx.AsyncClient, urls: Iterable[str], model: str, system: str | None = None) -> None:
    """One short unmeasured request straight to each pool (no gateway learns from it): an engine's first request
    pays one-off costs (1.4 s against 0.4 s to the first token on the CPU engine, measured by `bench sessions`),
    which would otherwise land on whichever phase uses the pool first. ``system``: a system prompt to open with
    (`bench sessions` salts it, so the warm-up shares no cached prefix with a phase)."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": "Say hello."})
    for url in urls:
        await client.post(f"{url}/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 4})


def bench_route(config: RouteConfig) -> RouteResult:
    result = RouteResult()
    with tempfile.TemporaryDirectory() as folder:
        adaptive_rules_file = adaptive_rules(Path(folder), config.min_samples)
        with _gateway(config, adaptive_rules_file) as adaptive, _gateway(config, reference_rules_path()) as rules:
            asyncio.run(_drive(config, adaptive.url, rules.url, result))
    return result


def report(result: RouteResult, console: Console) -> None:
    levels = sorted({concurrency for concurrency, _ in result.outcomes})
    for concurrency in levels:
        table = Table(title=f"specgate bench route: real pools ({result.model}), concurrency {concurrency}, "
                            "mean latency through the gateway in s (client-measured)")  # fmt: skip
        for column in ("category", *PHASES, "adaptive to spec", "adaptive / best pinned", "adaptive / rules", "n"):
            table.add_column(column, justify="left" if column == "category" else "right")
        categories = sorted({o.item.category for o in result.outcomes[concurrency, "adaptive"]})
        for category in [*categories, None]:
            means = [result.mean(concurrency, phase, category) for phase in PHASES]
            routed = [o for o in result.outcomes[concurrency, "adaptive"] if category in (None, o.item.category)]
            share = sum(o.pool == "speculative" for o in routed) / len(routed)
            table.add_row(
                category or "all", *(f"{m:.3f}" for m in means), f"{share:.0%}",
                f"{means[3] / min(means[0], means[1]):.3f}x", f"{means[3] / means[2]:.3f}x", str(len(routed)),
                style="bold" if category is None else None,
            )  # fmt: skip
        console.print(table)
    console.print(
        "adaptive gateway: the model decided after "
        + (f"{result.learned_after} finished requests" if result.learned_after is not None else "more than ran")
        + " (pinned phases included); before that the reference rules decided (warm-up)"
    )
    if result.k_suggestion is not None:
        found = result.k_suggestion
        where = f"k = 0 from batch {found.stop_at}" if found.stop_at else "no k = 0 within what it saw"
        accepted = "none reported" if found.acceptance_length is None else f"{found.acceptance_length:.2f}"
        console.print(f"suggested speculative k table (suggest-k): {table_text(found.table) or 'none'} ({where}; "
                      f"batch sizes judged {found.judged_from}-{found.judged_to}; mean acceptance length {accepted})")
    if result.while_other_busy:
        console.print(
            "learned: time per token while the other pool has work, over while it is idle (shared hardware): "
            + ", ".join(f"{name} {factor:.2f}x" for name, factor in sorted(result.while_other_busy.items()))
        )


def to_json(result: RouteResult) -> dict[str, Any]:
    return {
        "model": result.model,
        "learned_after": result.learned_after,
        "while_other_busy": result.while_other_busy,
        "while_other_busy_fit": result.while_other_busy_fit,
        "k_suggestion": None if result.k_suggestion is None else {
            "table": [list(entry) for entry in result.k_suggestion.table], "stop_at": result.k_suggestion.stop_at,
            "judged": [result.k_suggestion.judged_from, result.k_suggestion.judged_to],
            "acceptance_length": result.k_suggestion.acceptance_length,
        },
        "levels": {
            str(c): {phase: result.mean(c, phase) for phase in PHASES}
            for c in sorted({c for c, _ in result.outcomes})
        },
        "outcomes": [
            {
                "concurrency": c, "phase": phase, "category": o.item.category, "id": o.item.id,
                "latency_s": o.latency_s, "pool": o.pool, "reason": o.reason, "error": o.error,
            }
            for (c, phase), outcomes in result.outcomes.items()
            for o in outcomes
        ],
    }


def write_json(path: Path, result: RouteResult) -> None:
    path.write_bytes(orjson.dumps(to_json(result), option=orjson.OPT_INDENT_2))
