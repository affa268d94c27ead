"""Replicas grouped in pools: least-outstanding-work picking, bookings, and health state.

A :class:`Booking` is taken at dispatch and released exactly once (end of stream, error or client
disconnect); health checks change ``healthy`` and never touch bookings.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gateway.errors import NoHealthyBackend
from gateway.metrics import GatewayMetrics
from gateway.snapshot import POOL_NAMES, PoolSnapshot, other_pool


@dataclass(eq=False)
class Replica:
    url: str
    pool: str
    metrics: GatewayMetrics
    healthy: bool = True
    booked_tokens: int = 0
    inflight: int = 0
    models: tuple[str, ...] = ()
    host: str = field(init=False)

    def __post_init__(self) -> None:
        self.host = urlsplit(self.url).netloc
        self._inflight_gauge = self.metrics.inflight.labels(self.pool, self.url)
        self._booked_gauge = self.metrics.booked_tokens.labels(self.pool, self.url)
        self._healthy_gauge = self.metrics.replica_healthy.labels(self.pool, self.url)
        self._healthy_gauge.set(1 if self.healthy else 0)

    def set_healthy(self, healthy: bool) -> None:
        self.healthy = healthy
        self._healthy_gauge.set(1 if healthy else 0)

    def book(self, tokens: int) -> Booking:
        self.booked_tokens += tokens
        self.inflight += 1
        self._booked_gauge.set(self.booked_tokens)
        self._inflight_gauge.set(self.inflight)
        return Booking(self, tokens)

    def _unbook(self, tokens: int) -> None:
        self.booked_tokens -= tokens
        self.inflight -= 1
        self._booked_gauge.set(self.booked_tokens)
        self._inflight_gauge.set(self.inflight)


class Booking:
    """Load booked on one replica; ``release`` is idempotent so every exit path may call it."""

    __slots__ = ("released", "replica", "tokens")

    def __init__(self, replica: Replica, tokens: int) -> None:
        self.replica = replica
        self.tokens = tokens
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.replica._unbook(self.tokens)


class Pool:
    def __init__(self, name: str, replicas: Iterable[Replica], rng: random.Random) -> None:
        self.name = name
        self.replicas = list(replicas)
        self._rng = rng

    def pick(self, exclude: frozenset[Replica] = frozenset()) -> Replica | None:
        """Power of two choices on booked tokens among healthy replicas not excluded."""
        candidates = [r for r in self.replicas if r.healthy and r not in exclude]
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        a, b = self._rng.sample(candidates, 2)
        return a if a.booked_tokens <= b.booked_tokens else b

    def snapshot_counts(self) -> tuple[int, int]:
        return sum(1 for r in self.replicas if r.healthy), len(self.replicas)


class PoolSet:
    """Both pools, built from replica URLs; replicas can be swapped on reload without losing bookings."""

    def __init__(self, metrics: GatewayMetrics, rng: random.Random | None = None) -> None:
        self._metrics = metrics
        self._rng = rng or random.Random()
        self.pools: dict[str, Pool] = {name: Pool(name, [], self._rng) for name in POOL_NAMES}

    def configure(self, urls: Mapping[str, Iterable[str]]) -> None:
        """Set each pool's replica list; replicas already known keep their state and bookings."""
        for name in POOL_NAMES:
            known = {r.url: r for r in self.pools[name].replicas}
            wanted = list(dict.fromkeys(urls.get(name, ())))
            replicas = [known.get(url) or Replica(url, name, self._metrics) for url in wanted]
            self.pools[name] = Pool(name, replicas, self._rng)

    def replicas(self) -> list[Replica]:
        return [r for pool in self.pools.values() for r in pool.replicas]

    def acquire(self, pool: str, tokens: int, tried: frozenset[Replica] = frozenset()) -> Booking:
        """Book the best replica in ``pool``; raise :class:`NoHealthyBackend` when none is left."""
        replica = self.pools[pool].pick(tried)
        if replica is None:
            raise NoHealthyBackend(f"no healthy replica in the {pool} pool")
        return replica.book(tokens)

    def acquire_retry(self, pool: str, tokens: int, tried: frozenset[Replica]) -> Booking:
        """A second attempt: another replica of the same pool first, then the other pool."""
        for name in (pool, other_pool(pool)):
            replica = self.pools[name].pick(tried)
            if replica is not None:
                return replica.book(tokens)
        raise NoHealthyBackend("no other healthy replica to retry on")

    def pool_snapshots(self) -> dict[str, PoolSnapshot]:
        result = {}
        for name, pool in self.pools.items():
            healthy, total = pool.snapshot_counts()
            inflight = sum(r.inflight for r in pool.replicas)
            result[name] = PoolSnapshot(
                name=name, healthy_replicas=healthy, total_replicas=total, inflight=inflight, inflight_base=inflight
            )
        return result

    def inflight_counts(self) -> dict[str, int]:
        """This gateway's requests in flight per pool, now."""
        return {name: sum(r.inflight for r in pool.replicas) for name, pool in self.pools.items()}

    def models(self) -> list[str]:
        return sorted({m for r in self.replicas() for m in r.models})

    def total_booked(self) -> int:
        return sum(r.booked_tokens for r in self.replicas())
