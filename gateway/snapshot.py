"""What the decider knows about the world, as plain immutable data.

Pollers (local QPS window, vLLM /metrics scrapers, Prometheus queries, health checks) fill a
:class:`Snapshot` outside the request path; ``decide()`` only reads it. Engine-reported values
(queue, KV use, acceptance) are kept apart from what the gateway observes itself (QPS).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

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

    @property
    def available(self) -> bool:
        return self.healthy_replicas > 0


_EMPTY: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything ``decide()`` may look at. Built by pollers, swapped atomically."""

    pools: Mapping[str, PoolSnapshot]
    qps: float = 0.0
    qps_source: str = "local"  # "local", "redis" or "prometheus"
    qps_age_s: float | None = None
    signals: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # named Prometheus signals
    signal_ages_s: Mapping[str, float] = field(default_factory=lambda: _EMPTY)

    def pool(self, name: str) -> PoolSnapshot:
        found = self.pools.get(name)
        return found if found is not None else PoolSnapshot(name=name)
