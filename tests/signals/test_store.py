"""SharedState: memory and Redis behave the same; a Redis that is down degrades, never hangs."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from gateway.servers import free_port
from gateway.signals.shared_qps import SharedQps
from gateway.signals.store import (
    Estimate,
    MemorySharedState,
    RedisSharedState,
    SharedState,
    SharedStateUnavailable,
    rate_from_buckets,
)
from tests.signals.servers import RedisServer


@pytest.mark.parametrize(
    ("counts", "now", "window", "expected"),
    [
        ({100: 10, 101: 10, 102: 10, 103: 10, 104: 10}, 105.0, 5, 40 / 4),  # current second not started
        ({100: 10, 101: 10, 102: 10, 103: 10, 104: 10}, 104.5, 5, 50 / 4.5),
        ({90: 1000, 104: 5}, 104.5, 5, 5 / 4.5),  # outside the window
        ({}, 104.5, 5, 0.0),
    ],
    ids=["whole-seconds", "partial-second", "old-bucket-ignored", "empty"],
)
def test_rate_from_buckets(counts: dict[int, int], now: float, window: float, expected: float) -> None:
    assert rate_from_buckets(counts, now, window) == pytest.approx(expected)


@pytest.mark.redis
async def test_request_counts_add_up_across_writers(store: SharedState) -> None:
    now = 1_000_000.5
    await store.add_requests({999_996: 4, 999_997: 4}, window_s=5)
    await store.add_requests({999_997: 6, 1_000_000: 3}, window_s=5)
    assert await store.request_rate(now, window_s=5) == pytest.approx((4 + 10 + 3) / 4.5)


@pytest.mark.redis
async def test_estimates_merge_by_weight_and_expire(store: SharedState) -> None:
    await store.put_estimates("gw-a", {"accept:code": Estimate(0.8, 100)}, now=1000.0, ttl_s=30)
    await store.put_estimates(
        "gw-b", {"accept:code": Estimate(0.4, 300), "tpot:chat": Estimate(0.02, 5)}, now=1010.0, ttl_s=30
    )
    merged = await store.get_estimates(now=1015.0, ttl_s=30)
    assert merged["accept:code"].value == pytest.approx((0.8 * 100 + 0.4 * 300) / 400)
    assert merged["accept:code"].weight == pytest.approx(400)
    assert merged["tpot:chat"] == Estimate(0.02, 5)
    later = await store.get_estimates(now=1035.0, ttl_s=30)  # gw-a's entry is older than the ttl
    assert later["accept:code"] == Estimate(0.4, 300)


@pytest.mark.redis
async def test_estimates_in_different_spaces_do_not_mix(store: SharedState) -> None:
    await store.put_estimates("gw-a", {"tpot:chat": Estimate(0.02, 10)}, now=1000.0, ttl_s=30)
    await store.put_estimates("gw-b", {"tpot:chat": Estimate(-3.9, 10)}, now=1000.0, ttl_s=30, space="est:v2")
    assert await store.get_estimates(now=1001.0, ttl_s=30) == {"tpot:chat": Estimate(0.02, 10)}
    assert await store.get_estimates(now=1001.0, ttl_s=30, space="est:v2") == {"tpot:chat": Estimate(-3.9, 10)}
    assert await store.get_estimates(now=1001.0, ttl_s=30, space="est:v3") == {}


@pytest.mark.redis
async def test_the_owners_that_published_lately_are_counted_per_space(store: SharedState) -> None:
    await store.put_estimates("gw-a", {}, now=1000.0, ttl_s=30)  # a replica with nothing learned yet counts
    await store.put_estimates("gw-b", {"tpot:chat": Estimate(0.02, 10)}, now=1004.0, ttl_s=30)
    await store.put_estimates("gw-c", {"tpot:chat": Estimate(0.02, 10)}, now=1004.0, ttl_s=30, space="est:v2")
    assert await store.live_owners(now=1005.0, within_s=6) == 2
    assert await store.live_owners(now=1008.0, within_s=6) == 1  # gw-a went quiet
    assert await store.live_owners(now=1008.0, within_s=6, space="est:v2") == 1
    await store.put_estimates("gw-a", {}, now=1009.0, ttl_s=30)  # the same owner again: still one
    assert await store.live_owners(now=1009.0, within_s=6) == 2


@pytest.mark.redis
async def test_token_bucket_refills_at_rate(store: SharedState) -> None:
    bucket = f"tenant-{uuid.uuid4().hex[:6]}"
    allowed = [await store.take_tokens(bucket, rate=2.0, burst=3.0, now=100.0) for _ in range(4)]
    assert allowed == [True, True, True, False]
    assert await store.take_tokens(bucket, rate=2.0, burst=3.0, now=100.5)  # +1 token
    assert not await store.take_tokens(bucket, rate=2.0, burst=3.0, now=100.5)


@pytest.mark.redis
async def test_two_replicas_see_each_others_requests(shared_redis: RedisServer) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    stores = [RedisSharedState(shared_redis.url, prefix=prefix) for _ in range(2)]
    first, second = (SharedQps(s, window_s=5) for s in stores)
    now = time.time()
    for i in range(30):
        first.record(now - 2 + i * 0.01)
    for i in range(20):
        second.record(now - 1 + i * 0.01)
    await first.sync(now)
    rate = await second.sync(now)
    assert rate is not None and first.last is not None
    expected = 50 / (4 + now - int(now))
    assert rate.qps == pytest.approx(expected)
    assert first.last.qps == pytest.approx(30 / (4 + now - int(now)))  # it synced before the other
    for s in stores:
        await s.close()


@pytest.mark.redis
async def test_redis_down_keeps_counts_and_recovers(private_redis: RedisServer) -> None:
    store = RedisSharedState(private_redis.url, timeout_s=0.2)
    qps = SharedQps(store, window_s=10)
    now = time.time()
    qps.record(now - 1)
    assert await qps.sync(now) is not None
    private_redis.stop()
    for _ in range(5):
        qps.record(now)
    started = time.monotonic()
    assert await qps.sync(now) is None
    assert time.monotonic() - started < 1.0, "a dead Redis must cost at most the short timeout"
    assert not qps.up and qps.error is not None
    assert qps.pending_requests() == 5
    private_redis.start()  # same port, empty data: only what is still pending comes back
    rate = await qps.sync(now + 0.1)
    assert rate is not None and qps.up
    assert not qps.trusted(now + 0.1), "an emptied window is not trusted until it has refilled"
    assert qps.trusted(now + 10.1)
    assert rate.qps == pytest.approx(5 / (9 + now + 0.1 - int(now + 0.1)))
    await store.close()


@pytest.mark.redis
async def test_paused_redis_times_out_fast(private_redis: RedisServer) -> None:
    store = RedisSharedState(private_redis.url, timeout_s=0.2)
    await store.ping()
    private_redis.pause()
    try:
        started = time.monotonic()
        with pytest.raises(SharedStateUnavailable):
            await store.request_rate(time.time(), 10)
        assert time.monotonic() - started < 1.0
    finally:
        private_redis.resume()
    assert await store.ping()  # the same client reconnects by itself
    await store.close()


async def test_unreachable_redis_is_unavailable_not_an_exception_zoo() -> None:
    store = RedisSharedState(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    with pytest.raises(SharedStateUnavailable, match="redis add_requests"):
        await store.add_requests({1: 1}, 10)
    await store.close()


async def test_memory_store_drops_old_buckets() -> None:
    store = MemorySharedState()
    await store.add_requests({1: 5}, window_s=5)
    await store.add_requests({100: 1}, window_s=5)
    assert await store.request_rate(100.5, 5) == pytest.approx(1 / 4.5)


async def test_values_are_shared_until_their_ttl(store: SharedState) -> None:
    await store.put_value("resp:a", "http://r1", ttl_s=1.0)
    await store.put_value("resp:b", "http://r2", ttl_s=60)
    assert await store.get_value("resp:a") == "http://r1"
    assert await store.get_value("resp:missing") is None
    await asyncio.sleep(1.1)
    assert await store.get_value("resp:a") is None
    assert await store.get_value("resp:b") == "http://r2"
