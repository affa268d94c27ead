"""Scrape every replica's vLLM ``/metrics`` on an interval; keep per-replica and per-pool engine stats.

A replica whose scrape fails (refused, timed out, non-200, not a vLLM text) is *stale*: it keeps its last
good values for inspection but drops out of the pool figures, which are then built from the fresh replicas
only. A pool with no fresh replica reports ``None`` (unknown), never zero.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

from gateway.errors import UpstreamError
from gateway.metrics import HistogramSeries, held
from gateway.signals.vllm_metrics import (
    AcceptanceWindow,
    EngineStats,
    MetricsParseError,
    acceptance_from,
    parse_vllm_metrics,
)
from gateway.upstream import Fetch


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    pool: str
    base_url: str  # the replica's base URL; the poller GETs {base_url}/metrics

    @property
    def metrics_url(self) -> str:
        return self.base_url.rstrip("/") + "/metrics"


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica's engine stats as last scraped. ``stats`` is the last good scrape (None: never)."""

    target: ScrapeTarget
    stats: EngineStats | None
    age_s: float | None  # since the last good scrape
    error: str | None  # why the latest scrape failed; None when it succeeded
    acceptance_rate: float | None
    acceptance_length: float | None

    @property
    def fresh(self) -> bool:
        return self.error is None and self.stats is not None


@dataclass(frozen=True, slots=True)
class PoolEngineStats:
    """A pool's engine figures over its fresh replicas. All ``None`` when no replica is fresh."""

    running: float | None
    waiting: float | None
    kv_cache_usage: float | None
    acceptance_rate: float | None
    acceptance_length: float | None
    age_s: float | None  # age of the oldest scrape used (or of the newest, when none is fresh)
    fresh_replicas: int
    stale_replicas: int
    # This gateway's own requests on the fresh replicas when they were scraped: what the engines' running and
    # waiting already count of them. What it sent since is on top; what finished since is no longer there.
    inflight_base: int = 0


class _ReplicaState:
    def __init__(self, target: ScrapeTarget, window_s: float) -> None:
        self.target = target
        self.window = AcceptanceWindow(window_s)
        self.stats: EngineStats | None = None
        self.scraped_at: float | None = None
        self.inflight_at_scrape = 0  # this gateway's requests on the replica as the scrape read the engine
        self.error: str | None = "not scraped yet"

    def view(self, now: float, stale_after_s: float) -> ReplicaView:
        acceptance = self.window.acceptance(now)
        age = None if self.scraped_at is None else now - self.scraped_at
        error = self.error
        if error is None and age is not None and age > stale_after_s:
            error = f"last good scrape is {age:.1f} s old"
        return ReplicaView(
            target=self.target,
            stats=self.stats,
            age_s=age,
            error=error,
            acceptance_rate=None if acceptance is None else acceptance.rate,
            acceptance_length=None if acceptance is None else acceptance.length,
        )


def _none_in_flight(target: ScrapeTarget) -> int:
    return 0  # a poller told nothing of the gateway's requests (tests, tools)


class EnginePoller:
    """Owns the scrape state. The hub calls :meth:`scrape_once` on its interval, in a task it keeps."""

    def __init__(
        self,
        fetch: Fetch,
        targets: Callable[[], Sequence[ScrapeTarget]],
        *,
        timeout_s: float = 0.5,
        window_s: float = 30.0,
        stale_after_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        inflight: Callable[[ScrapeTarget], int] | None = None,
        timing: HistogramSeries | None = None,
    ) -> None:
        self._fetch = fetch  # GETs through the upstream seam (gateway.upstream.fetcher)
        self._timing = timing  # how long each page's parse held the loop
        self._inflight = inflight or _none_in_flight  # this gateway's requests on a replica now
        self._targets = targets
        self._timeout_s = timeout_s
        self._window_s = window_s
        self._stale_after_s = stale_after_s
        self._clock = clock
        self._replicas: dict[ScrapeTarget, _ReplicaState] = {}

    async def scrape_once(self) -> None:
        targets = list(dict.fromkeys(self._targets()))
        for gone in set(self._replicas) - set(targets):
            del self._replicas[gone]
        states = [self._replicas.setdefault(t, _ReplicaState(t, self._window_s)) for t in targets]
        await asyncio.gather(*(self._scrape(state) for state in states))

    async def _scrape(self, state: _ReplicaState) -> None:
        before = self._inflight(state.target)
        try:
            status, body = await self._fetch(state.target.metrics_url, self._timeout_s)
            if status != 200:
                state.error = f"HTTP {status} from {state.target.metrics_url}"
                return
            with held(self._timing) if self._timing is not None else nullcontext():
                stats = parse_vllm_metrics(body.decode("utf-8", "replace"))
        except (UpstreamError, MetricsParseError) as exc:
            state.error = f"{type(exc).__name__}: {exc}"
            return
        now = self._clock()
        state.stats, state.scraped_at, state.error = stats, now, None
        # The engine read its counts at some moment of the exchange. A request of ours that ended during it may
        # or may not be counted there, and one sent during it likewise: taking the larger of the counts before
        # and after errs toward too few, which the decision's floor (our own in-flight count) makes good.
        state.inflight_at_scrape = max(before, self._inflight(state.target))
        if stats.spec is not None:
            state.window.observe(stats.spec, now)

    def replicas(self) -> list[ReplicaView]:
        now = self._clock()
        return [state.view(now, self._stale_after_s) for state in self._replicas.values()]

    def pool_stats(self, pool: str) -> PoolEngineStats:
        now = self._clock()
        states = [s for s in self._replicas.values() if s.target.pool == pool]
        fresh = [s for s in states if s.view(now, self._stale_after_s).fresh]
        return aggregate_pool(fresh, len(states) - len(fresh), now)


def aggregate_pool(fresh: Iterable[_ReplicaState], stale_count: int, now: float) -> PoolEngineStats:
    replicas = list(fresh)
    stats = [s.stats for s in replicas if s.stats is not None]
    if not stats:
        return PoolEngineStats(None, None, None, None, None, None, 0, stale_count)
    kv_values = [s.kv_cache_usage for s in stats if s.kv_cache_usage is not None]
    acceptance = acceptance_from(d for s in replicas for d in s.window.deltas(now))
    ages = [now - s.scraped_at for s in replicas if s.scraped_at is not None]
    return PoolEngineStats(
        running=sum(s.running for s in stats),
        waiting=sum(s.waiting for s in stats),
        kv_cache_usage=sum(kv_values) / len(kv_values) if kv_values else None,
        acceptance_rate=None if acceptance is None else acceptance.rate,
        acceptance_length=None if acceptance is None else acceptance.length,
        age_s=max(ages) if ages else None,
        fresh_replicas=len(stats),
        stale_replicas=stale_count,
        inflight_base=sum(s.inflight_at_scrape for s in replicas if s.stats is not None),
    )
