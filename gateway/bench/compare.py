"""``specgate bench compare``: the same workload on the standard and the speculative pool, measured.

For each concurrency level and each task category, the category's requests go to one pool, then the other
(streamed, greedy, ``stream_options.include_usage`` for exact token counts), at that concurrency. Measured
per pool: latency (mean, p95), time to first token, time per output token. The acceptance rate of the
category comes from the speculative server's own counters (``vllm:spec_decode_num_accepted_tokens_total`` /
``vllm:spec_decode_num_draft_tokens_total``) read from its ``/metrics`` before and after the category ran,
so it is what the engine really accepted, not an estimate. Speedup = standard / speculative, for the mean
latency and for the time per output token.

One unmeasured warm-up request per pool goes first (``--warmup``). Categories run one after the other, so a
counter delta belongs to one category only; the two pools never run at the same time, so they do not compete
for the machine's cores.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from gateway.signals.vllm_metrics import EngineStats, SpecCounters, parse_vllm_metrics, spec_delta


@dataclass(frozen=True)
class BenchItem:
    """One request of the workload."""

    id: str
    category: str
    messages: tuple[Mapping[str, str], ...]
    max_tokens: int


@dataclass(frozen=True)
class RequestResult:
    latency_s: float
    ttft_s: float | None
    output_tokens: int
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class PoolStats:
    requests: int
    errors: int
    mean_latency_s: float | None
    p95_latency_s: float | None
    mean_ttft_s: float | None
    mean_tpot_s: float | None
    mean_output_tokens: float | None

    @classmethod
    def of(cls, results: Sequence[RequestResult]) -> PoolStats:
        ok = [r for r in results if r.error is None]
        latencies = [r.latency_s for r in ok]
        return cls(
            requests=len(results),
            errors=len(results) - len(ok),
            mean_latency_s=_mean(latencies),
            p95_latency_s=percentile(latencies, 95),
            mean_ttft_s=_mean([r.ttft_s for r in ok if r.ttft_s is not None]),
            mean_tpot_s=_mean([t for r in ok if (t := r.tpot_s) is not None]),
            mean_output_tokens=_mean([float(r.output_tokens) for r in ok]),
        )


@dataclass(frozen=True)
class CategoryResult:
    concurrency: int
    category: str
    standard: PoolStats
    speculative: PoolStats
    drafted_tokens: float | None
    accepted_tokens: float | None

    @property
    def acceptance_rate(self) -> float | None:
        if self.drafted_tokens is None or self.accepted_tokens is None or self.drafted_tokens <= 0:
            return None
        return self.accepted_tokens / self.drafted_tokens

    @property
    def speedup_latency(self) -> float | None:
        return _ratio(self.standard.mean_latency_s, self.speculative.mean_latency_s)

    @property
    def speedup_tpot(self) -> float | None:
        return _ratio(self.standard.mean_tpot_s, self.speculative.mean_tpot_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "category": self.category,
            "acceptance_rate": self.acceptance_rate,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "speedup_latency": self.speedup_latency,
            "speedup_tpot": self.speedup_tpot,
            "standard": self.standard.__dict__,
            "speculative": self.speculative.__dict__,
        }


@dataclass
class CompareConfig:
    standard_url: str
    speculative_url: str
    items: Sequence[BenchItem]
    concurrency: Sequence[int] = (1, 4)
    model: str | None = None
    max_tokens_cap: int | None = None
    temperature: float = 0.0
    timeout_s: float = 300.0
    warmup: int = 1
    headers: Mapping[str, str] = field(default_factory=dict)


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile (no interpolation: every reported figure is one that was measured)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def request_body(item: BenchItem, model: str, config: CompareConfig) -> dict[str, Any]:
    max_tokens = item.max_tokens if config.max_tokens_cap is None else min(item.max_tokens, config.max_tokens_cap)
    return {
        "model": model,
        "messages": [dict(message) for message in item.messages],
        "max_tokens": max_tokens,
        "temperature": config.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def timed_request(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> RequestResult:
    """One streamed chat completion: latency to the last byte, TTFT to the first content, usage tokens."""
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                return RequestResult(time.perf_counter() - started, None, 0, f"HTTP {response.status_code}: {text}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = orjson.loads(line[6:])
                if first is None and any(_delta_text(choice) for choice in event.get("choices") or []):
                    first = time.perf_counter() - started
                usage = event.get("usage")
                if usage:
                    tokens = int(usage.get("completion_tokens") or 0)
    except httpx.HTTPError as exc:
        return RequestResult(time.perf_counter() - started, None, 0, f"{type(exc).__name__}: {exc}")
    return RequestResult(time.perf_counter() - started, first, tokens)


def _delta_text(choice: Mapping[str, Any]) -> str:
    delta = choice.get("delta") or {}
    return str(delta.get("content") or delta.get("reasoning_content") or "")


async def run_batch(
    client: httpx.AsyncClient, url: str, bodies: Sequence[dict[str, Any]], concurrency: int
) -> list[RequestResult]:
    """All bodies against one URL with at most ``concurrency`` in flight."""
    gate = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> RequestResult:
        async with gate:
            return await timed_request(client, url, body)

    return list(await asyncio.gather(*(one(body) for body in bodies)))


def category_requests(items: Sequence[BenchItem], concurrency: int) -> list[BenchItem]:
    """The category's items, cycled so that at least ``concurrency`` requests are in flight."""
    count = max(len(items), concurrency)
    return [items[index % len(items)] for index in range(count)]


async def read_engine_stats(client: httpx.AsyncClient, url: str) -> EngineStats:
    """The server's ``/metrics``, parsed: its running and waiting requests, its speculative counters."""
    response = await client.get(f"{url}/metrics")
    response.raise_for_status()
    return parse_vllm_metrics(response.text)


async def read_spec_counters(client: httpx.AsyncClient, url: str) -> SpecCounters | None:
    """The server's cumulative speculative counters (None when it does not speculate)."""
    return (await read_engine_stats(client, url)).spec


async def discover_model(client: httpx.AsyncClient, url: str) -> tuple[str, str]:
    """The first served model id and its ``owned_by`` (vLLM says ``vllm``) from ``/v1/models``."""
    response = await client.get(f"{url}/v1/models")
    response.raise_for_status()
    first = response.json()["data"][0]
    return str(first["id"]), str(first.get("owned_by", "unknown"))


async def run_category(
    client: httpx.AsyncClient, config: CompareConfig, model: str, items: Sequence[BenchItem], concurrency: int
) -> CategoryResult:
    bodies = [request_body(item, model, config) for item in category_requests(items, concurrency)]
    stats: dict[str, PoolStats] = {}
    stats["standard"] = PoolStats.of(await run_batch(client, config.standard_url, bodies, concurrency))
    before = await read_spec_counters(client, config.speculative_url)
    stats["speculative"] = PoolStats.of(await run_batch(client, config.speculative_url, bodies, concurrency))
    after = await read_spec_counters(client, config.speculative_url)
    accepted = drafted = None
    if before is not None and after is not None:
        delta = spec_delta(before, after, at=time.time())  # handles an engine restart in between
        accepted, drafted = delta.accepted_tokens, delta.draft_tokens
    return CategoryResult(concurrency, items[0].category, stats["standard"], stats["speculative"], drafted, accepted)


async def warm_up(client: httpx.AsyncClient, config: CompareConfig, model: str) -> None:
    """A few unmeasured requests per pool first, so the first category does not pay for a cold engine."""
    bodies = [request_body(item, model, config) for item in config.items[: config.warmup]]
    for url in (config.standard_url, config.speculative_url):
        for result in await run_batch(client, url, bodies, 1):
            if result.error is not None:
                raise httpx.HTTPError(f"warm-up request to {url} failed: {result.error}")


async def compare(config: CompareConfig) -> tuple[list[CategoryResult], dict[str, Any]]:
    """Run the whole comparison; returns the per-(concurrency, category) results and run metadata."""
    by_category: dict[str, list[BenchItem]] = {}
    for item in config.items:
        by_category.setdefault(item.category, []).append(item)
    timeout = httpx.Timeout(config.timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=max(config.concurrency) * 2 + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=dict(config.headers)) as client:
        model, owner = await discover_model(client, config.standard_url)
        model = config.model or model
        await warm_up(client, config, model)
        started = time.time()
        results = [
            await run_category(client, config, model, items, level)
            for level in config.concurrency
            for _, items in sorted(by_category.items())
        ]
    meta = {
        "standard_url": config.standard_url,
        "speculative_url": config.speculative_url,
        "model": model,
        "served_by": owner,
        "started_unix": started,
        "duration_s": time.time() - started,
        "temperature": config.temperature,
        "max_tokens_cap": config.max_tokens_cap,
        "concurrency": list(config.concurrency),
        "items": len(config.items),
    }
    return results, meta
