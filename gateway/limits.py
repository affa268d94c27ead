"""Per-key limits: requests per minute, tokens per minute, concurrent requests.

The request path never waits for Redis. Each gateway replica keeps a local token bucket per key and limit
(:class:`Bucket`) and decides from it with a few float operations. A background task
(:meth:`Limiter.sync`, every ``redis_sync_interval_s``) sends, in one pipelined round trip, what each active
bucket spent since the last sync to the shared bucket in Redis (``SharedState.sync_limits``: refill by
elapsed time, debit, may go into debt) and takes the shared level back as its own, and publishes its
in-flight counts while reading the other replicas'. Between two syncs every replica may spend the level it
last saw, so N replicas can overshoot a bucket by up to (N-1) x that level (the whole burst, when a full
bucket is hit on every replica at once); the debt is paid back before the shared bucket admits anything again,
so over a window the admitted total holds (``specgate bench limits`` measures it). A key's first use wakes the
sync at once rather than at the next interval, which shortens the window in which fresh replicas each see a
full bucket.

Concurrency has no debt to repay, so a replica does not let the others' stale counts decide alone: the limit
is split into whole shares, one per replica heard from (by the order of their names, so every replica computes
the same split), and a replica reserves for every other one that is using the key, or was refused for it, its
share or its last count, whichever is higher. Replicas under load then settle at their shares and never add up
past the limit between syncs, and a replica alone with the key may still use all of it.

When Redis is down (or not configured), the local buckets simply keep refilling on their own: limits hold
per replica, and no request fails because of the store.

Tokens: at admission a request takes its estimate (prompt estimate + ``max_tokens`` x ``n``); when it ends,
:meth:`Admission.finish` gives back what it did not use (the response's ``usage``, or the stream's events).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gateway.errors import RateLimited
from gateway.signals.store import BucketSync, SharedState, SharedStateUnavailable

log = logging.getLogger("specgate.limits")
ACTIVE_S = 120.0  # a key used within this long is synced with the shared store
INFLIGHT_TTL_S = 5.0  # another replica's in-flight count older than this is ignored (a dead replica)
Headers = tuple[tuple[bytes, bytes], ...]


@dataclass(slots=True)
class Bucket:
    """A token bucket holding up to ``limit``, refilled at ``limit`` per minute (OpenAI's semantics)."""

    limit: float
    level: float
    updated: float  # wall-clock seconds
    spent: float = 0.0  # taken (minus given back) since the last sync

    @property
    def rate(self) -> float:
        return self.limit / 60.0

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.limit, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def take(self, cost: float, now: float) -> bool:
        self.refill(now)
        if self.level < cost:
            return False
        self.level -= cost
        self.spent += cost
        return True

    def give_back(self, amount: float) -> None:
        self.level = min(self.limit, self.level + amount)
        self.spent -= amount

    def wait_s(self, cost: float) -> float:
        """Seconds until ``cost`` fits (``cost`` capped at the limit)."""
        return max(0.0, (min(cost, self.limit) - self.level) / self.rate)

    def reset_s(self) -> float:
        """Seconds until the bucket is full again (OpenAI's ``x-ratelimit-reset-*``)."""
        return max(0.0, (self.limit - self.level) / self.rate)


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60.0:
        return f"{math.ceil(seconds * 10) / 10:g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


def _headers_for(kind: bytes) -> Callable[[Bucket], Headers]:
    limit, remaining, reset = (b"x-ratelimit-%s-%s" % (what, kind) for what in (b"limit", b"remaining", b"reset"))

    def headers(bucket: Bucket) -> Headers:
        level = bucket.level
        return (
            (limit, b"%d" % bucket.limit),
            (remaining, b"%d" % (level if level > 0 else 0)),
            (reset, duration((bucket.limit - level) / bucket.rate).encode()),
        )

    return headers


_REQUEST_HEADERS, _TOKEN_HEADERS = _headers_for(b"requests"), _headers_for(b"tokens")


@dataclass(eq=False, slots=True)
class KeyLimits:
    """One key's limits and this replica's view of them."""

    name: str
    requests: Bucket | None
    tokens: Bucket | None
    concurrency: int | None
    inflight: int = 0
    others_inflight: int = 0  # reserved for the other replicas at the last sync (see reserve_for_others)
    last_used: float = 0.0
    wanted: bool = False  # a request was refused for concurrency since the last sync (published as demand)
    wake: asyncio.Event | None = None  # set on first use: the limiter syncs at once

    def check(self, now: float) -> None:
        """Refuse (:class:`RateLimited`, nothing taken) a request this key could not be admitted for whatever it
        asks: no slot free, no request left, or an empty token bucket. Cheap, so it runs before the body is
        parsed: a key over its limits costs the gateway no work that grows with what it sends."""
        if now - self.last_used >= ACTIVE_S and self.wake is not None:
            self.wake.set()  # not synced while idle: the shared levels and the others' counts are unknown
        self.last_used = now
        if self.concurrency is not None and self.inflight + self.others_inflight >= self.concurrency:
            self.wanted = True
            raise self._refused("requests", f"concurrent requests: Limit {self.concurrency}", 1.0, now, "concurrency")
        requests, tokens = self.requests, self.tokens
        if requests is not None:
            requests.refill(now)
            if requests.level < 1:
                message = f"requests per min (RPM): Limit {requests.limit:g}, Requested 1"
                raise self._refused("requests", message, requests.wait_s(1), now, "rpm")
        if tokens is not None:
            tokens.refill(now)
            if tokens.level < 1:
                message = f"tokens per min (TPM): Limit {tokens.limit:g}"
                raise self._refused("tokens", message, tokens.wait_s(1), now, "tpm")

    def admit(self, cost: int, now: float) -> Admission:
        """Take one request and ``cost`` tokens, or raise :class:`RateLimited` (nothing taken)."""
        self.check(now)
        requests, tokens = self.requests, self.tokens
        if requests is not None and not requests.take(1, now):
            message = f"requests per min (RPM): Limit {requests.limit:g}, Requested 1"
            raise self._refused("requests", message, requests.wait_s(1), now, "rpm")
        if tokens is not None and not tokens.take(cost, now):
            if requests is not None:
                requests.give_back(1)
            message = f"tokens per min (TPM): Limit {tokens.limit:g}, Requested {cost}"
            if cost > tokens.limit:
                message = f"Request too large for {message}; lower max_tokens or the prompt"
            raise self._refused("tokens", message, tokens.wait_s(cost), now, "tpm")
        self.inflight += 1
        return Admission(self, cost, self.headers(now))

    def headers(self, now: float) -> Headers:
        """OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for the buckets this key has."""
        out: Headers = ()
        requests, tokens = self.requests, self.tokens
        if requests is not None:
            requests.refill(now)
            out = _REQUEST_HEADERS(requests)
        if tokens is not None:
            tokens.refill(now)
            out += _TOKEN_HEADERS(tokens)
        return out

    def _refused(self, kind: str, what: str, wait_s: float, now: float, limit: str) -> RateLimited:
        wait_s = max(wait_s, 0.001)
        message = f"Rate limit reached for key '{self.name}' on {what}. Please try again in {duration(wait_s)}."
        retry = ((b"retry-after", b"%d" % math.ceil(wait_s)), (b"retry-after-ms", b"%d" % math.ceil(wait_s * 1000)))
        return RateLimited(message, kind, retry + self.headers(now), limit)


class Admission:
    """One admitted request: :meth:`finish` gives its concurrency slot and unused tokens back, once."""

    __slots__ = ("_limits", "cost", "done", "headers")

    def __init__(self, limits: KeyLimits, cost: int, headers: Headers) -> None:
        self._limits = limits
        self.cost = cost
        self.headers = headers
        self.done = False

    def finish(self, used_tokens: int) -> None:
        if self.done:
            return
        self.done = True
        limits = self._limits
        limits.inflight -= 1
        if limits.tokens is not None and used_tokens != self.cost:
            limits.tokens.give_back(self.cost - used_tokens)


@dataclass
class Limiter:
    """Every key's :class:`KeyLimits` and their sync with the shared store."""

    owner: str
    keys: dict[str, KeyLimits] = field(default_factory=dict)
    store_up: bool = True
    syncs: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def configure(self, specs: Iterable[tuple[str, int | None, int | None, int | None]]) -> dict[str, KeyLimits]:
        """(name, rpm, tpm, concurrency) per key. A known key is updated in place, so admissions still running
        finish on the object that counts them; a changed limit starts a fresh, full bucket."""
        now = time.time()
        fresh: dict[str, KeyLimits] = {}
        for name, rpm, tpm, concurrency in specs:
            limits = self.keys.get(name) or KeyLimits(name, None, None, None)
            if _limit(limits.requests) != rpm:
                limits.requests = _bucket(rpm, now)
            if _limit(limits.tokens) != tpm:
                limits.tokens = _bucket(tpm, now)
            limits.concurrency, limits.wake = concurrency, self.wake
            fresh[name] = limits
        self.keys = fresh
        return fresh

    async def sync(self, store: SharedState, now: float) -> bool:
        """One round trip: publish spending and in-flight counts, take the shared levels. False: store down."""
        active = [k for k in self.keys.values() if now - k.last_used < ACTIVE_S]
        if not active:
            return True
        plan: list[tuple[Bucket, float]] = []
        syncs: list[BucketSync] = []
        for limits in active:
            for kind, bucket in (("rpm", limits.requests), ("tpm", limits.tokens)):
                if bucket is not None:
                    plan.append((bucket, bucket.spent))
                    syncs.append(BucketSync(f"{limits.name}:{kind}", bucket.rate, bucket.limit, bucket.spent))
                    bucket.spent = 0.0
        # What is published: the count in flight, or -1 for none but refused (the others leave it its share
        # instead of holding every slot).
        inflight = {k.name: k.inflight or -int(k.wanted) for k in active if k.concurrency is not None}
        for limits in active:
            limits.wanted = False
        try:
            levels, others = await store.sync_limits(self.owner, syncs, inflight, now, INFLIGHT_TTL_S)
        except SharedStateUnavailable as exc:
            if self.store_up:
                log.warning("per-key limits fall back to this replica's own buckets: %s", exc)
            self.store_up = False
            for limits in active:
                limits.others_inflight = 0
            return False
        self.store_up, self.syncs = True, self.syncs + 1
        for (bucket, _), level in zip(plan, levels, strict=True):
            bucket.level, bucket.updated = level - bucket.spent, now  # minus what was taken during the await
        for limits in active:
            if limits.concurrency is not None:
                limits.others_inflight = reserve_for_others(limits.concurrency, self.owner, others.get(limits.name, {}))
        return True

    async def run(self, store: SharedState, interval_s: float) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), interval_s)
            self.wake.clear()
            await self.sync(store, time.time())


def reserve_for_others(limit: int, owner: str, others: dict[str, int]) -> int:
    """Slots this replica leaves to the others: for each one using the key, its count or its share of the limit,
    whichever is higher (it may grow to its share before the next sync tells); its share alone for one that was
    refused with nothing in flight (-1); nothing for an idle one. The shares are whole and add up to the limit:
    ``limit // replicas`` each, one more for the first ``limit % replicas`` replicas by name."""
    if not others:
        return 0
    ranked = sorted([owner, *others])
    base, extra = divmod(limit, len(ranked))
    reserved = 0
    for rank, name in enumerate(ranked):
        count = others.get(name, 0) if name != owner else 0
        if count:
            share = base + (rank < extra)
            reserved += max(count, share) if count > 0 else share
    return reserved


def _bucket(limit: int | None, now: float) -> Bucket | None:
    return Bucket(float(limit), float(limit), now) if limit is not None else None


def _limit(bucket: Bucket | None) -> float | None:
    return bucket.limit if bucket is not None else None
