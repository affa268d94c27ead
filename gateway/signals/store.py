"""State that several gateway replicas share: request counts (QPS), estimates, rate-limit buckets, and plain
values with a TTL (which replica, for which key, holds a Responses API id; set only if absent).

One small interface, :class:`SharedState`, two implementations: :class:`MemorySharedState` (one replica, no
Redis) and :class:`RedisSharedState` (``redis.asyncio``, short timeouts, no client-side retries). Nothing
here is awaited on the routing path: :class:`~gateway.signals.shared_qps.SharedQps` counts requests
locally and a background task flushes the counts and reads the shared total. The one exception is the
Responses API's id map (:mod:`gateway.response_ids`): a non-streamed response waits for its id's write, and a
``GET /v1/responses/{id}`` this replica did not relay reads Redis, both bounded by the short timeouts.

Errors: every Redis failure (refused, timed out, reset, a server error) surfaces as
:class:`SharedStateUnavailable`; the caller degrades (keeps its local view) and tries again on its next tick.
redis-py reconnects by itself on the next command once the server is back.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry  # the asyncio client's own (redis 8 warns on, and converts, the sync one)
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

QPS_BUCKET_TTL_EXTRA_S = 10
_MEMORY_VALUES_LIMIT = 100_000  # past this many values, expired ones are dropped on the next put
T = TypeVar("T")


class SharedStateUnavailable(RuntimeError):
    """The shared store did not answer in time or failed; local values remain valid."""


@dataclass(frozen=True, slots=True)
class BucketSync:
    """One replica's spending on a shared token bucket since its last sync (negative: given back)."""

    bucket: str
    rate: float  # refill per second
    burst: float  # capacity
    spent: float


@dataclass(frozen=True, slots=True)
class Estimate:
    """A shared running estimate (e.g. acceptance for a task, time per output token): merged by ``weight``."""

    value: float
    weight: float


class SharedState(Protocol):
    """What gateway replicas share. Every method may raise :class:`SharedStateUnavailable`."""

    @property
    def kind(self) -> str: ...

    async def add_requests(self, counts_by_second: Mapping[int, int], window_s: float) -> None: ...

    async def request_rate(self, now: float, window_s: float) -> float: ...

    async def put_estimates(
        self, owner: str, estimates: Mapping[str, Estimate], now: float, ttl_s: float, space: str = "est"
    ) -> None: ...

    async def get_estimates(self, now: float, ttl_s: float, space: str = "est") -> dict[str, Estimate]: ...

    async def live_owners(self, now: float, within_s: float, space: str = "est") -> int:
        """How many owners published estimates in ``space`` within ``within_s`` (the gateway replicas alive)."""
        ...

    async def take_tokens(self, bucket: str, rate: float, burst: float, now: float, cost: float = 1.0) -> bool: ...

    async def put_value(self, key: str, value: str, ttl_s: float) -> None: ...

    async def put_value_if_absent(self, key: str, value: str, ttl_s: float) -> bool:
        """Set ``key`` only when it holds no (live) value; True when this call set it."""
        ...

    async def get_value(self, key: str) -> str | None: ...

    async def sync_limits(
        self, owner: str, buckets: Sequence[BucketSync], inflight: Mapping[str, int], now: float, ttl_s: float
    ) -> tuple[list[float], dict[str, dict[str, int]]]:
        """Debit each bucket by what ``owner`` spent (refilled by elapsed time first; it may go into debt, down
        to minus its burst) and return the levels; publish ``owner``'s in-flight count per key (-1: none, but
        it refused some: it wants its share) and return, per key, the other owners' counts heard from within
        ``ttl_s``."""
        ...

    async def close(self) -> None: ...


def window_seconds(now: float, window_s: float) -> range:
    """The whole seconds a window ending at ``now`` covers, the current (partial) second included."""
    current = math.floor(now)
    return range(current - max(1, math.ceil(window_s)) + 1, current + 1)


def rate_from_buckets(counts: Mapping[int, int], now: float, window_s: float) -> float:
    """Requests per second over the window: the completed seconds plus the elapsed part of the current one."""
    seconds = window_seconds(now, window_s)
    total = sum(counts.get(second, 0) for second in seconds)
    elapsed = (len(seconds) - 1) + (now - math.floor(now))
    return total / elapsed if elapsed > 0 else 0.0


def merge_estimates(per_owner: Sequence[Mapping[str, Estimate]]) -> dict[str, Estimate]:
    merged: dict[str, tuple[float, float]] = {}
    for estimates in per_owner:
        for name, est in estimates.items():
            weighted, weight = merged.get(name, (0.0, 0.0))
            merged[name] = (weighted + est.value * est.weight, weight + est.weight)
    return {name: Estimate(w / total, total) for name, (w, total) in merged.items() if total > 0}


def debit(bucket: _Bucket, sync: BucketSync, now: float) -> float:
    refill(bucket, sync.rate, sync.burst, now)
    bucket.tokens = max(-sync.burst, bucket.tokens - sync.spent)
    return bucket.tokens


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


def refill(bucket: _Bucket, rate: float, burst: float, now: float) -> None:
    bucket.tokens = min(burst, bucket.tokens + max(0.0, now - bucket.updated) * rate)
    bucket.updated = now


class MemorySharedState:
    """The one-replica implementation: the same semantics, in this process."""

    kind = "memory"

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self._estimates: dict[tuple[str, str], tuple[float, dict[str, Estimate]]] = {}  # (space, owner) ->
        self._buckets: dict[str, _Bucket] = {}
        self._values: dict[str, tuple[str, float]] = {}  # key -> (value, monotonic expiry)
        self._inflight: dict[str, dict[str, tuple[int, float]]] = {}

    async def add_requests(self, counts_by_second: Mapping[int, int], window_s: float) -> None:
        for second, count in counts_by_second.items():
            self._counts[second] = self._counts.get(second, 0) + count
        if counts_by_second:
            horizon = max(counts_by_second) - math.ceil(window_s) - QPS_BUCKET_TTL_EXTRA_S
            for second in [s for s in self._counts if s < horizon]:
                del self._counts[second]

    async def request_rate(self, now: float, window_s: float) -> float:
        return rate_from_buckets(self._counts, now, window_s)

    async def put_estimates(
        self, owner: str, estimates: Mapping[str, Estimate], now: float, ttl_s: float, space: str = "est"
    ) -> None:
        self._estimates[(space, owner)] = (now, dict(estimates))

    async def get_estimates(self, now: float, ttl_s: float, space: str = "est") -> dict[str, Estimate]:
        fresh = [est for (sp, _), (at, est) in self._estimates.items() if sp == space and now - at <= ttl_s]
        return merge_estimates(fresh)

    async def live_owners(self, now: float, within_s: float, space: str = "est") -> int:
        return sum(1 for (sp, _), (at, _) in self._estimates.items() if sp == space and now - at <= within_s)

    async def take_tokens(self, bucket: str, rate: float, burst: float, now: float, cost: float = 1.0) -> bool:
        state = self._buckets.setdefault(bucket, _Bucket(tokens=burst, updated=now))
        refill(state, rate, burst, now)
        if state.tokens < cost:
            return False
        state.tokens -= cost
        return True

    async def put_value(self, key: str, value: str, ttl_s: float) -> None:
        now = time.monotonic()
        if len(self._values) >= _MEMORY_VALUES_LIMIT:
            self._values = {k: v for k, v in self._values.items() if v[1] > now}
        self._values[key] = (value, now + ttl_s)

    async def put_value_if_absent(self, key: str, value: str, ttl_s: float) -> bool:
        if await self.get_value(key) is not None:
            return False
        await self.put_value(key, value, ttl_s)
        return True

    async def get_value(self, key: str) -> str | None:
        entry = self._values.get(key)
        return entry[0] if entry is not None and entry[1] > time.monotonic() else None

    async def sync_limits(
        self, owner: str, buckets: Sequence[BucketSync], inflight: Mapping[str, int], now: float, ttl_s: float
    ) -> tuple[list[float], dict[str, dict[str, int]]]:
        levels = [debit(self._buckets.setdefault(s.bucket, _Bucket(s.burst, now)), s, now) for s in buckets]
        others: dict[str, dict[str, int]] = {}
        for key, count in inflight.items():
            owners = self._inflight.setdefault(key, {})
            owners[owner] = (count, now)
            others[key] = {who: n for who, (n, at) in owners.items() if who != owner and now - at <= ttl_s}
        return levels, others

    async def close(self) -> None:
        return None


# Token bucket in one round-trip, atomically: refill by elapsed time, take `cost` if there is enough.
_TAKE_TOKENS_LUA = """
local rate, burst, now, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'updated')
local tokens, updated = tonumber(state[1]), tonumber(state[2])
if tokens == nil then tokens, updated = burst, now end
tokens = math.min(burst, tokens + math.max(0, now - updated) * rate)
local allowed = 0
if tokens >= cost then tokens = tokens - cost; allowed = 1 end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'updated', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return allowed
"""


# A shared token bucket's sync: refill by elapsed time, debit what one replica spent (debt down to -burst).
# The level goes back as a string: Redis would truncate a Lua number to an integer.
_SYNC_BUCKET_LUA = """
local rate, burst, now, spent = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'updated')
local tokens, updated = tonumber(state[1]), tonumber(state[2])
if tokens == nil then tokens, updated = burst, now end
tokens = math.max(-burst, math.min(burst, tokens + math.max(0, now - updated) * rate) - spent)
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'updated', tostring(math.max(now, updated)))
redis.call('EXPIRE', KEYS[1], math.ceil(2 * burst / rate) + 1)
return tostring(tokens)
"""


class RedisSharedState:
    """Redis-backed :class:`SharedState`. Short socket timeouts, no retries: a slow Redis costs one tick."""

    kind = "redis"

    def __init__(self, url: str, *, timeout_s: float = 0.25, prefix: str = "specgate:") -> None:
        self._timeout_s = timeout_s
        self._prefix = prefix
        self._client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
        )

    async def _guard(self, operation: str, awaitable: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self._timeout_s * 2):
                return await awaitable
        except (RedisError, OSError, TimeoutError) as exc:
            raise SharedStateUnavailable(f"redis {operation}: {type(exc).__name__}: {exc}") from exc

    async def add_requests(self, counts_by_second: Mapping[int, int], window_s: float) -> None:
        if not counts_by_second:
            return
        ttl = math.ceil(window_s) + QPS_BUCKET_TTL_EXTRA_S
        pipe = self._client.pipeline(transaction=False)
        for second, count in counts_by_second.items():
            key = f"{self._prefix}qps:{second}"
            pipe.incrby(key, count)
            pipe.expire(key, ttl)
        await self._guard("add_requests", pipe.execute())

    async def request_rate(self, now: float, window_s: float) -> float:
        seconds = window_seconds(now, window_s)
        keys = [f"{self._prefix}qps:{second}" for second in seconds]
        values = await self._guard("request_rate", self._client.mget(keys))
        counts = {second: int(v) for second, v in zip(seconds, values, strict=True) if v is not None}
        return rate_from_buckets(counts, now, window_s)

    async def put_estimates(
        self, owner: str, estimates: Mapping[str, Estimate], now: float, ttl_s: float, space: str = "est"
    ) -> None:
        key = f"{self._prefix}{space}:{owner}"
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(key)
        if estimates:
            pipe.hset(key, mapping={name: f"{e.value!r} {e.weight!r}" for name, e in estimates.items()})
            pipe.expire(key, math.ceil(ttl_s))
        pipe.zadd(f"{self._prefix}{space}:owners", {owner: now})
        await self._guard("put_estimates", pipe.execute())

    async def get_estimates(self, now: float, ttl_s: float, space: str = "est") -> dict[str, Estimate]:
        owners_key = f"{self._prefix}{space}:owners"
        query = self._client.zrangebyscore(owners_key, now - ttl_s, "+inf")
        owners = await self._guard("get_estimates", query)
        pipe = self._client.pipeline(transaction=False)
        for owner in owners:
            pipe.hgetall(f"{self._prefix}{space}:{owner!s}")
        raw: list[dict[str, str]] = await self._guard("get_estimates", pipe.execute())
        return merge_estimates([_decode_estimates(fields) for fields in raw])

    async def live_owners(self, now: float, within_s: float, space: str = "est") -> int:
        query = self._client.zcount(f"{self._prefix}{space}:owners", now - within_s, "+inf")
        return int(await self._guard("live_owners", query))

    async def take_tokens(self, bucket: str, rate: float, burst: float, now: float, cost: float = 1.0) -> bool:
        key = f"{self._prefix}bucket:{bucket}"
        call = self._client.eval(_TAKE_TOKENS_LUA, 1, key, rate, burst, now, cost)
        allowed = await self._guard("take_tokens", call)
        return bool(allowed)

    async def put_value(self, key: str, value: str, ttl_s: float) -> None:
        call = self._client.set(f"{self._prefix}val:{key}", value, px=max(1, math.ceil(ttl_s * 1000)))
        await self._guard("put_value", call)

    async def put_value_if_absent(self, key: str, value: str, ttl_s: float) -> bool:
        call = self._client.set(f"{self._prefix}val:{key}", value, px=max(1, math.ceil(ttl_s * 1000)), nx=True)
        return bool(await self._guard("put_value_if_absent", call))

    async def get_value(self, key: str) -> str | None:
        value = await self._guard("get_value", self._client.get(f"{self._prefix}val:{key}"))
        return None if value is None else str(value)

    async def sync_limits(
        self, owner: str, buckets: Sequence[BucketSync], inflight: Mapping[str, int], now: float, ttl_s: float
    ) -> tuple[list[float], dict[str, dict[str, int]]]:
        """All of it in one pipelined round trip (each bucket's script is atomic on its own)."""
        pipe = self._client.pipeline(transaction=False)
        for sync in buckets:
            pipe.eval(_SYNC_BUCKET_LUA, 1, f"{self._prefix}limit:{sync.bucket}", sync.rate, sync.burst, now, sync.spent)
        for key, count in inflight.items():
            name = f"{self._prefix}inflight:{key}"
            pipe.hset(name, owner, f"{count} {now!r}")
            pipe.expire(name, math.ceil(ttl_s) + 1)
            pipe.hgetall(name)
        replies = await self._guard("sync_limits", pipe.execute())
        levels = [float(level) for level in replies[: len(buckets)]]
        owners = replies[len(buckets) + 2 :: 3]
        others = {key: _fresh_others(fields, owner, now, ttl_s) for key, fields in zip(inflight, owners, strict=True)}
        return levels, others

    async def ping(self) -> bool:
        return bool(await self._guard("ping", self._client.ping()))

    async def close(self) -> None:
        await self._client.aclose()


def _fresh_others(fields: Mapping[str, str], owner: str, now: float, ttl_s: float) -> dict[str, int]:
    others = {}
    for who, packed in fields.items():
        count, at = packed.split(" ", 1)
        if who != owner and now - float(at) <= ttl_s:
            others[who] = int(count)
    return others


def _decode_estimates(fields: Mapping[str, str]) -> dict[str, Estimate]:
    decoded: dict[str, Estimate] = {}
    for name, packed in fields.items():
        value, weight = packed.split(" ", 1)
        decoded[name] = Estimate(float(value), float(weight))
    return decoded
