"""What the decider knows about the world, as plain immutable data.

Pollers (local QPS window, vLLM /metrics scrapers, Prometheus queries, health checks) fill a
:class:`Snapshot` outside the request path; ``decide()`` only reads it. Engine-reported values
(queue, KV use, acceptance) are kept apart from what the gateway observes itself (QPS).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.adaptive.model import LatencyModel

STANDARD = "standard"
SPECULATIVE = "speculative"
POOL_NAMES: tuple[str, str] = (STANDARD, SPECULATIVE)


def other_pool(name: str) -> str:
    """Both pools serve the same model, so the other one is always a correct fallback."""
    return SPECULATIVE if name == STANDARD else STANDARD


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """One pool as the decider sees it. ``None`` means unknown (never scraped, or stale)."""

    name: str
    healthy_replicas: int = 0
    total_replicas: int = 0
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # fraction 0..1, as vLLM reports it
    acceptance_rate: float | None = None  # accepted draft tokens / proposed draft tokens, recent window
    acceptance_length: float | None = None  # mean tokens emitted per draft step (1 + accepted per draft)
    stats_age_s: float | None = None  # seconds since the engine stats were scraped
    inflight: int = 0  # this gateway's own requests on the pool now (fresh per request)
    inflight_base: int = 0  # ... when the snapshot was built (the engine stats are at least that old)

    @property
    def available(self) -> bool:
        return self.healthy_replicas > 0


_EMPTY: Mapping[str, float] = MappingProxyType({})


@dataclass(slots=True)  # not frozen: made per request, and a frozen __init__ costs ~4x; never mutated
class Snapshot:
    """Everything ``decide()`` may look at. Built by pollers, swapped atomically."""

    pools: Mapping[str, PoolSnapshot]
    qps: float = 0.0
    qps_source: str = "local"  # "local", "redis" or "prometheus"
    qps_age_s: float | None = None
    signals: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # named Prometheus signals
    signal_ages_s: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    model: LatencyModel | None = None  # the learned latency model (gateway.adaptive), None until learning
    gateways: int = 1  # gateway replicas sharing the pools (from the shared store), for load estimates
    inflight_now: Mapping[str, int] | None = None  # this gateway's in-flight counts at decision time, when fresher

    def __init__(
        self, pools: Mapping[str, PoolSnapshot], qps: float = 0.0, qps_source: str = "local",
        qps_age_s: float | None = None, signals: Mapping[str, float] = _EMPTY,
        signal_ages_s: Mapping[str, float] = _EMPTY, model: LatencyModel | None = None, gateways: int = 1,
        inflight_now: Mapping[str, int] | None = None,
    ) -> None:  # fmt: skip
        # written out: see features.RequestFeatures.__init__
        self.pools, self.qps, self.qps_source, self.qps_age_s = pools, qps, qps_source, qps_age_s
        self.signals, self.signal_ages_s, self.model = signals, signal_ages_s, model
        self.gateways, self.inflight_now = gateways, inflight_now

    def pool(self, name: str) -> PoolSnapshot:
        found = self.pools.get(name)
        return found if found is not None else PoolSnapshot(name=name)

    def with_inflight(self, counts: Mapping[str, int]) -> Snapshot:
        """The same snapshot with this gateway's in-flight counts as of now (fresher than any scrape).
        (The constructor, not ``dataclasses.replace``: this runs per request, and replace costs ~4x more.)"""
        return Snapshot(
            self.pools, self.qps, self.qps_source, self.qps_age_s, self.signals, self.signal_ages_s, self.model,
            self.gateways, counts,
        )  # fmt: skip


def pool_load(snapshot: Snapshot, name: str) -> float:
    """Requests on a pool as this gateway can best tell: the engines' running + waiting as last scraped,
    plus what this gateway (and, scaled by their count, the other replicas) sent since then; never less
    than this gateway's own in-flight requests. Without engine stats, the own in-flight count."""
    pool = snapshot.pool(name)
    fresh = snapshot.inflight_now
    inflight = pool.inflight if fresh is None else fresh.get(name, 0)
    if pool.running is None:
        return float(inflight)
    engine = pool.running + (pool.waiting or 0.0)
    return max(float(inflight), engine + snapshot.gateways * (inflight - pool.inflight_base))
