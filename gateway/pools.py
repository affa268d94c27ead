"""Replicas grouped in pools: least-outstanding-work picking, bookings, and health state.

A :class:`Booking` is taken at dispatch and released exactly once (end of stream, error or client
disconnect); health checks change ``healthy`` and never touch bookings. A replica takes traffic while it is
healthy and its circuit breaker (``gateway/breaker.py``, fed by the proxy's outcomes) admits requests.

A replica down because its health check timed out (no answer, as opposed to a refusal or a non-200) is only
*suspected*: when no replica of the allowed pools is up, :meth:`PoolSet.acquire` books a suspected one whose
breaker admits rather than answering 503 at once (its breaker takes it out if real requests fail too).

With the prefix index on (``gateway/prefix_index.py``) and a request's block values given, :meth:`Pool.pick`
prefers the replica expected to hold the longest prefix of the prompt, but affinity yields to load: only
replicas with at most :func:`affinity_limit` requests in flight (the least loaded one's count plus
:data:`AFFINITY_SLACK_REQUESTS` or :data:`AFFINITY_SLACK_SHARE` of it, the larger) may win on their cache; ties go
to the fewest booked tokens. When none of those holds a block of the prompt, it is power of two choices on booked
tokens, as without blocks. The slack is the simulator's prefix-aware router's (``backends/emulator/
prefix_router.py``): a few more sequences in a continuous batch of dozens cost a few percent of step time, while
re-prefilling a conversation's history on a replica that never saw it costs its whole prefill; past the slack the
request would queue behind the holder's work, and a session is better re-prefilled elsewhere.

The same rule tells the pool choice what each pool would find cached: before the decision, for a request with
blocks, :meth:`PoolSet.expected_cached` reads per pool the expected hit of the replica the rule would choose
(the longest eligible holder's; 0 where the choice would be by load), as prompt tokens, into
``RequestFeatures.cached_tokens`` (the latency model predicts the first token from the uncached rest). The rule
is written once (:func:`choose_replica`, :func:`best_holder`, :func:`expected_hit`) over anything with a URL, an
in-flight count and booked tokens, so the simulator's specgate chooses by this code too.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

from gateway.breaker import OPEN, STATES, BreakerPolicy, CircuitBreaker
from gateway.errors import NoHealthyBackend
from gateway.metrics import GatewayMetrics
from gateway.prefix_index import BLOCK_BYTES, PrefixIndex, cached_tokens
from gateway.snapshot import POOL_NAMES, PoolSnapshot, other_pool

HEALTH_VERDICTS = ("ok", "failed", "timeout", "late")  # gateway/health.py's verdicts
AFFINITY_SLACK_REQUESTS = 8  # a replica this many more in flight than the least loaded may still win on its cache
AFFINITY_SLACK_SHARE = 0.25  # or this share of the least loaded one's count, where larger


def affinity_limit(least: int) -> float:
    """The most requests in flight a replica may have and still be chosen for its cached prefix, given the
    least-loaded candidate's count (the module's rule)."""
    return least + max(AFFINITY_SLACK_REQUESTS, AFFINITY_SLACK_SHARE * least)


class Bookable(Protocol):
    """What the affinity rule reads of a replica (the gateway's :class:`Replica`, the simulator's too)."""

    @property
    def url(self) -> str: ...
    @property
    def inflight(self) -> int: ...
    @property
    def booked_tokens(self) -> int: ...


R = TypeVar("R", bound=Bookable)


def request_blocks(
    per_request_s: float, prefill_s_per_token: float, replicas: int, prompt_tokens: int, read_bytes: int,
    externality: float = 1.0,
) -> float | None:  # fmt: skip
    """How many of a request's cached blocks one more request in flight on its replica is worth, from the
    learned model: the delay one more request on the pool adds to this one (``Prediction.per_request_s``), on
    one of the pool's ``replicas`` (``replicas`` times the pool's), plus as much added by this one to each
    of the others there (times ``externality``), over the prefill time of a block (the pool's learned prefill
    rate, ``PoolModel.prefill_rate``, times the prompt's tokens per :data:`BLOCK_BYTES` of the text read).
    None where either side is not known (the fixed slack alone then decides)."""
    if per_request_s <= 0 or prefill_s_per_token <= 0 or prompt_tokens <= 0 or read_bytes <= 0:
        return None
    block_s = prefill_s_per_token * prompt_tokens * BLOCK_BYTES / read_bytes
    return (1.0 + externality) * per_request_s * max(replicas, 1) / block_s


def best_holder(
    candidates: Sequence[R], blocks: Sequence[int], index: PrefixIndex, worth: float | None = None
) -> tuple[R | None, int]:  # fmt: skip
    """The module's rule: among ``candidates`` within :func:`affinity_limit` of the least loaded, the one expected
    to hold the most leading blocks (ties: fewest booked tokens), and its expected hit; (None, 0) when no
    eligible one holds any. With ``worth`` (:func:`request_blocks`), each replica's hit counts less that many
    blocks per request it has in flight over the least loaded, and a holder must come out ahead of choosing by
    load (a score above 0): affinity yields to load as the learned model prices them."""
    least = candidates[0].inflight  # a loop, not min(genexpr): once per pool per request
    for replica in candidates:
        if replica.inflight < least:
            least = replica.inflight
    limit = affinity_limit(least)
    best, best_hit, best_score = None, 0, 0.0
    for replica in candidates:
        if replica.inflight > limit:
            continue
        hit = index.expected_hit(replica.url, blocks)
        if not hit:
            continue
        score = hit if worth is None else hit - worth * (replica.inflight - least)
        if score > best_score or (score == best_score and best is not None
                                  and replica.booked_tokens < best.booked_tokens):  # fmt: skip
            best, best_hit, best_score = replica, hit, score
    return best, best_hit


def choose_replica(
    candidates: Sequence[R], blocks: Sequence[int], index: PrefixIndex | None, rng: random.Random,
    worth: float | None = None,
) -> R | None:  # fmt: skip
    """The replica for a request: with ``blocks`` and the prefix index, the one expected to hold the longest
    prefix among those within the load slack (:func:`best_holder`, its hit priced against load by ``worth``
    where the model knows it); else power of two choices on booked tokens. The gateway's :meth:`Pool.pick` and
    the simulator's specgate both choose by it."""
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    if blocks and index is not None:
        holder = best_holder(candidates, blocks, index, worth)[0]
        if holder is not None:
            return holder
    a, b = rng.sample(candidates, 2)
    return a if a.booked_tokens <= b.booked_tokens else b


def expected_hit(candidates: Sequence[R], blocks: Sequence[int], index: PrefixIndex) -> int:
    """The expected hit, in values, of the replica :func:`choose_replica` would choose on its cache among
    ``candidates`` (the only one's, where there is one; 0 where it would choose by load)."""
    if len(candidates) == 1:
        return index.expected_hit(candidates[0].url, blocks)
    return best_holder(candidates, blocks, index)[1] if candidates else 0


def expected_cached(
    pools: Mapping[str, Sequence[R]], blocks: Sequence[int], read_bytes: int, prompt_tokens: int, index: PrefixIndex
) -> dict[str, int]:  # fmt: skip
    """Per pool (its candidate replicas), the prompt tokens expected cached on the replica it would choose
    (:func:`expected_hit`, read as tokens by :func:`~gateway.prefix_index.cached_tokens`): what the latency
    model reads as ``RequestFeatures.cached_tokens``."""
    return {
        name: cached_tokens(blocks, expected_hit(candidates, blocks, index), read_bytes, prompt_tokens)
        for name, candidates in pools.items()
    }


class LoadClock:
    """One pool's in-flight count (this gateway's bookings) integrated over time, in request-seconds: what a
    request's booking reads at its start and end gives the mean load the pool ran at while it was served."""

    __slots__ = ("area", "at", "busy", "count")

    def __init__(self, at: float | None = None) -> None:
        self.area = 0.0
        self.busy = 0.0  # seconds with at least one request on the pool
        self.at = time.perf_counter() if at is None else at
        self.count = 0

    def move(self, change: int, now: float | None = None) -> tuple[float, float]:
        """The integral up to ``now`` (the simulator's virtual clock; else this process's) and ``now``; then
        the count moves by ``change``."""
        if now is None:
            now = time.perf_counter()
        if self.count:
            self.area += self.count * (now - self.at)
            self.busy += now - self.at
        self.at = now
        self.count += change
        return self.area, now

    def begin(self, now: float | None = None) -> LoadSpan:
        """One more request on the pool, from ``now``: :meth:`LoadSpan.end` takes it off again."""
        area, at = self.move(1, now)
        return LoadSpan(self, area, at, self.count)

    def mark(self, now: float | None = None) -> tuple[float, float]:
        """The busy time up to ``now`` and ``now``: :meth:`busy_since` reads how busy the pool was from here.
        (Read without moving the clock: the load integral stays exactly what the bookings make it.)"""
        if now is None:
            now = time.perf_counter()
        return self.busy + (now - self.at if self.count else 0.0), now

    def busy_since(self, mark: tuple[float, float], now: float | None = None) -> float | None:
        """The share of the time since ``mark`` that the pool had a request (None when no time passed)."""
        busy, now = self.mark(now)
        return (busy - mark[0]) / (now - mark[1]) if now > mark[1] else None


class LoadSpan:
    """One request's time on a pool's :class:`LoadClock`, from just after it was counted."""

    __slots__ = ("area", "at", "clock", "count")

    def __init__(self, clock: LoadClock, area: float, at: float, count: int) -> None:
        self.clock, self.area, self.at, self.count = clock, area, at, count

    def end(self, now: float | None = None) -> float | None:
        """Takes the request off the pool; returns how far the pool's count averaged above its value just
        after the request was counted, over the request's life (None when no time passed)."""
        area, now = self.clock.move(-1, now)
        return (area - self.area) / (now - self.at) - self.count if now > self.at else None


@dataclass(eq=False)
class Replica:
    url: str
    pool: str
    metrics: GatewayMetrics
    healthy: bool = True
    suspect: bool = False  # down because its last health check timed out (not a refusal or a non-200)
    booked_tokens: int = 0
    inflight: int = 0
    models: tuple[str, ...] = ()
    policy: BreakerPolicy = field(default_factory=BreakerPolicy)
    clock: LoadClock = field(default_factory=LoadClock)  # the pool's, shared by its replicas (PoolSet.configure)
    other_clock: LoadClock | None = None  # the other pool's (PoolSet.configure): how busy it was meanwhile
    host: str = field(init=False)
    breaker: CircuitBreaker = field(init=False)

    def __post_init__(self) -> None:
        self.host = urlsplit(self.url).netloc
        # read at scrape time, not set per booking (two locked gauge writes per request start and end)
        self.metrics.inflight.labels(self.pool, self.url).set_function(lambda: self.inflight)
        self.metrics.booked_tokens.labels(self.pool, self.url).set_function(lambda: self.booked_tokens)
        self._healthy_gauge = self.metrics.replica_healthy.labels(self.pool, self.url)
        self._healthy_gauge.set(1 if self.healthy else 0)
        self._breaker_gauges = {s: self.metrics.breaker_state.labels(self.pool, self.url, s) for s in STATES}
        self._breaker_opens = self.metrics.breaker_opens.labels(self.pool, self.url)
        self._checks = {v: self.metrics.health_checks.labels(self.pool, self.url, v) for v in HEALTH_VERDICTS}
        self.prefix_counts = self.metrics.prefix_counts(self.pool, self.url)
        self.breaker = CircuitBreaker(self.policy, self._breaker_changed)
        self._breaker_changed(self.breaker.state)

    def _breaker_changed(self, state: str) -> None:
        for name, gauge in self._breaker_gauges.items():
            gauge.set(1 if name == state else 0)
        if state == OPEN:
            self._breaker_opens.inc()

    def set_healthy(self, healthy: bool, suspect: bool = False) -> None:
        self.healthy = healthy
        self.suspect = suspect and not healthy
        self._healthy_gauge.set(1 if healthy else 0)

    def count_check(self, verdict: str) -> None:
        self._checks[verdict].inc()

    def book(self, tokens: int) -> Booking:
        self.booked_tokens += tokens
        self.inflight += 1
        return Booking(self, tokens, self.breaker.dispatched())

    def _unbook(self, tokens: int, probe: bool) -> None:
        if probe:
            self.breaker.probe_ended()
        self.booked_tokens -= tokens
        self.inflight -= 1


class Booking:
    """Load booked on one replica; ``release`` is idempotent so every exit path may call it.

    ``run_shift``, once released: how much the pool's in-flight count (this gateway's bookings, this one
    included) averaged above what it was just after this booking, over the booking's life. The learner adds
    it to the load the decision saw, to learn time per token against the load a request ran at rather than
    the load it arrived at (a pool that filled up behind it, as in a warm-up, would otherwise teach that a
    low load is slow). ``other_busy``: the share of its life the other pool had one of this gateway's
    requests (what a cross term is learned against, on pools that share hardware)."""

    __slots__ = ("_mark", "_span", "other_busy", "probe", "released", "replica", "run_shift", "tokens")

    def __init__(self, replica: Replica, tokens: int, probe: bool = False) -> None:
        self.replica = replica
        self.tokens = tokens
        self.probe = probe  # the half-open breaker's one trial request
        self.released = False
        self.run_shift: float | None = None
        self.other_busy: float | None = None
        self._span = replica.clock.begin()
        other = replica.other_clock
        self._mark = other.mark(self._span.at) if other is not None else None

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.run_shift = self._span.end()
            other, mark = self.replica.other_clock, self._mark
            if other is not None and mark is not None:
                self.other_busy = other.busy_since(mark, self._span.clock.at)
            self.replica._unbook(self.tokens, self.probe)


class Pool:
    def __init__(
        self, name: str, replicas: Iterable[Replica], rng: random.Random, index: PrefixIndex | None = None
    ) -> None:
        self.name = name
        self.replicas = list(replicas)
        self._rng = rng
        self.index = index

    def pick(
        self, exclude: frozenset[Replica] = frozenset(), blocks: Sequence[int] = (), worth: float | None = None
    ) -> Replica | None:  # fmt: skip
        """:func:`choose_replica` among healthy replicas not excluded whose breaker admits."""
        candidates = [r for r in self.replicas if r.healthy and r.breaker.admits and r not in exclude]
        return choose_replica(candidates, blocks, self.index, self._rng, worth)

    def expected_hit(self, blocks: Sequence[int]) -> int:
        """:func:`expected_hit` of the replicas :meth:`pick` would choose among (none excluded)."""
        if self.index is None:
            return 0
        return expected_hit([r for r in self.replicas if r.healthy and r.breaker.admits], blocks, self.index)

    def expected_hits(self, blocks: Sequence[int]) -> list[dict[str, object]]:
        """Each replica's expected hit for ``blocks`` and whether its load lets it win on it (for explain)."""
        index = self.index
        up = [r for r in self.replicas if r.healthy and r.breaker.admits]
        limit = affinity_limit(min(r.inflight for r in up)) if up else 0.0
        rows: list[dict[str, object]] = []
        for r in self.replicas:
            hit = index.expected_hit(r.url, blocks) if index is not None else 0
            rows.append({"replica": r.url, "expected_hit_blocks": hit,
                         "expected_hit_share": round(hit / len(blocks), 3) if blocks else 0.0,
                         "inflight": r.inflight, "booked_tokens": r.booked_tokens,
                         "affinity_eligible": r in up and r.inflight <= limit})  # fmt: skip
        return rows

    def pick_suspect(self, exclude: frozenset[Replica] = frozenset()) -> Replica | None:
        """The least-booked replica down only on a timed-out health check whose breaker admits (last resort)."""
        candidates = [r for r in self.replicas if r.suspect and r.breaker.admits and r not in exclude]
        return min(candidates, key=lambda r: r.booked_tokens) if candidates else None

    def snapshot_counts(self) -> tuple[int, int]:
        return sum(1 for r in self.replicas if r.healthy and r.breaker.state != OPEN), len(self.replicas)


class PoolSet:
    """Both pools, built from replica URLs; replicas can be swapped on reload without losing bookings."""

    def __init__(
        self, metrics: GatewayMetrics, rng: random.Random | None = None, breaker: BreakerPolicy | None = None,
        index: PrefixIndex | None = None,
    ) -> None:  # fmt: skip
        self._metrics = metrics
        self._rng = rng or random.Random()
        self._breaker = breaker or BreakerPolicy()
        self.index = index  # the prefix index (None: off); replicas are chosen by it only when a request has blocks
        self.pools: dict[str, Pool] = {name: Pool(name, [], self._rng, index) for name in POOL_NAMES}
        self._clocks = {name: LoadClock() for name in POOL_NAMES}

    def configure(self, urls: Mapping[str, Iterable[str]]) -> None:
        """Set each pool's replica list; replicas already known keep their state and bookings."""
        for name in POOL_NAMES:
            known = {r.url: r for r in self.pools[name].replicas}
            wanted = list(dict.fromkeys(urls.get(name, ())))
            replicas = [known.get(url) or Replica(url, name, self._metrics, policy=self._breaker) for url in wanted]
            for replica in replicas:
                replica.clock = self._clocks[name]
                replica.other_clock = self._clocks[other_pool(name)]
            self.pools[name] = Pool(name, replicas, self._rng, self.index)
        if self.index is not None:
            self.index.keep(r.url for r in self.replicas())

    def replicas(self) -> list[Replica]:
        return [r for pool in self.pools.values() for r in pool.replicas]

    def acquire(
        self, pool: str, tokens: int, tried: frozenset[Replica] = frozenset(), allowed: frozenset[str] | None = None,
        blocks: Sequence[int] = (), worth: float | None = None,
    ) -> Booking:  # fmt: skip
        """Book the best replica in ``pool``, else in the other pool if ``allowed`` (the snapshot the decision
        read may be older than a breaker that just opened); raise :class:`NoHealthyBackend` when none is left.
        ``blocks``: the prompt's block values, when the prefix index is on (the replica choice then reads them,
        and they are recorded as sent to the replica booked); ``worth``: :func:`request_blocks` for ``pool``."""
        replica = self.pools[pool].pick(tried, blocks, worth)
        other = other_pool(pool)
        if replica is None and (allowed is None or other in allowed):
            replica = self.pools[other].pick(tried, blocks)
        if replica is None:
            replica = self._last_resort(pool, tried, allowed)
        if replica is None:
            raise NoHealthyBackend(f"no healthy replica in the {pool} pool")
        return self._book(replica, tokens, blocks)

    def acquire_retry(
        self, pool: str, tokens: int, tried: frozenset[Replica], allowed: frozenset[str] | None = None,
        blocks: Sequence[int] = (),
    ) -> Booking:  # fmt: skip
        """A second attempt: another replica of the same pool first, then the other pool (if ``allowed``)."""
        for name in (pool, other_pool(pool)):
            if allowed is not None and name not in allowed and name != pool:
                continue
            replica = self.pools[name].pick(tried, blocks)
            if replica is not None:
                return self._book(replica, tokens, blocks)
        replica = self._last_resort(pool, tried, allowed)
        if replica is not None:
            return self._book(replica, tokens, blocks)
        raise NoHealthyBackend("no other healthy replica to retry on")

    def _book(self, replica: Replica, tokens: int, blocks: Sequence[int]) -> Booking:
        """Book ``replica``; with blocks and the index, record them as sent there and count the expected hit."""
        if blocks and self.index is not None:
            counts = replica.prefix_counts
            counts.queries += len(blocks)
            counts.hits += self.index.record(replica.url, blocks)
        return replica.book(tokens)

    def expected_cached(self, blocks: Sequence[int], read_bytes: int, prompt_tokens: int) -> dict[str, int]:
        """Per pool, the prompt tokens expected cached on the replica it would pick for ``blocks`` (the module's
        :func:`expected_cached` over each pool's replicas that take traffic; all 0 with the index off). Computed
        once per request with blocks, before the decision."""
        index = self.index
        if index is None or not blocks:
            return dict.fromkeys(self.pools, 0)
        found: dict[str, int] = {}
        for name, pool in self.pools.items():  # the module's expected_cached, without a dict of lists per request
            up = [r for r in pool.replicas if r.healthy and r.breaker.admits]
            found[name] = cached_tokens(blocks, expected_hit(up, blocks, index), read_bytes, prompt_tokens)
        return found

    def expected_hits(self, blocks: Sequence[int]) -> dict[str, list[dict[str, object]]]:
        """Per pool, each replica's expected hit for ``blocks`` (explain)."""
        return {name: pool.expected_hits(blocks) for name, pool in self.pools.items()}

    def _last_resort(self, pool: str, tried: frozenset[Replica], allowed: frozenset[str] | None) -> Replica | None:
        """No replica is up: a suspected one (its health check timed out) of ``pool``, else of the other pool."""
        for name in (pool, other_pool(pool)):
            if name != pool and allowed is not None and name not in allowed:
                continue
            replica = self.pools[name].pick_suspect(tried)
            if replica is not None:
                self._metrics.suspect_dispatches.labels(name).inc()
                return replica
        return None

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

    def tick_breakers(self) -> None:
        """Rotate the breakers' windows; open ones whose cool-down is over go half-open (off the request path)."""
        for replica in self.replicas():
            replica.breaker.tick()

    def total_booked(self) -> int:
        return sum(r.booked_tokens for r in self.replicas())


def replica_states(pools: PoolSet) -> list[dict[str, object]]:
    """Each replica's health-check result and breaker state, for ``/ready``."""
    return [
        {"pool": r.pool, "url": r.url, "healthy": r.healthy, "suspect": r.suspect, "breaker": r.breaker.state,
         "inflight": r.inflight}
        for r in pools.replicas()
    ]  # fmt: skip
