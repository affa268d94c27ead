"""Per-key limits across gateway replicas through a real Redis (``SharedState.sync_limits``), and the local
fallback when Redis is gone: limits per replica, never a failed request."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from gateway.signals.store import BucketSync, SharedState
from tests.conftest import Gateway, dead_url, wait_for
from tests.signals.servers import RedisServer

StartGateway = Callable[..., Gateway]
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def test_sync_limits_debits_refills_and_returns_the_others_inflight(store: SharedState) -> None:
    now = 1_000_000.0
    levels, others = await store.sync_limits("a", [BucketSync("k:rpm", 1.0, 60.0, 10.0)], {"k": 3}, now, 5.0)
    assert levels == [50.0] and others == {"k": {}}
    levels, others = await store.sync_limits("b", [BucketSync("k:rpm", 1.0, 60.0, 2.5)], {"k": 1}, now + 4, 5.0)
    assert levels == [pytest.approx(51.5)] and others == {"k": {"a": 3}}  # refilled 4 s at 1/s, minus 2.5
    levels, others = await store.sync_limits("b", [BucketSync("k:rpm", 1.0, 60.0, 500.0)], {"k": 0}, now + 8, 5.0)
    assert levels == [-60.0]  # debt, floored at minus the burst
    assert others == {"k": {}}  # a's count (8 s old) is past the 5 s ttl: a dead replica holds no slots
    levels, _ = await store.sync_limits("a", [BucketSync("k:rpm", 1.0, 60.0, -3.0)], {}, now + 8, 5.0)
    assert levels == [-57.0]  # given back


def synced_twice(gw: Gateway) -> None:
    """Two more syncs with Redis: one under way when the last request was admitted may have read before it."""
    limiter = gw.app.state.access.limiter
    target = limiter.syncs + 2
    wait_for(lambda: limiter.syncs >= target, what="two syncs with Redis")


@pytest.mark.redis
def test_two_gateways_share_a_key_limit_through_redis(gateway: StartGateway, shared_redis: RedisServer) -> None:
    keys = f"keys: [{{name: shared-{time.monotonic_ns()}, key: sk-shared, rpm: 6}}]"  # a fresh Redis bucket
    gws = [gateway(keys=keys, redis_url=shared_redis.url, redis_sync_interval_s=0.05) for _ in range(2)]
    statuses = []
    for i in range(12):
        with httpx.Client(base_url=gws[i % 2].url, headers={"x-api-key": "sk-shared"}) as client:
            statuses.append(client.post("/v1/chat/completions", json=CHAT).status_code)
        synced_twice(gws[i % 2])  # its spending is in Redis
        if i > 0:  # and the other has taken it (a key a replica has not used yet is not synced there)
            synced_twice(gws[(i + 1) % 2])
    assert statuses.count(200) in (6, 7), statuses  # 6 per minute for both together (+ the refill: 0.1/s)
    assert set(statuses) == {200, 429}
    assert all(gw.app.state.access.limiter.store_up for gw in gws)


@pytest.mark.redis
def test_redis_down_leaves_per_replica_limits_and_fails_nothing(
    gateway: StartGateway, private_redis: RedisServer
) -> None:
    gw = gateway(keys="keys: [{name: k, key: sk-k, rpm: 4}]", redis_url=private_redis.url, redis_sync_interval_s=0.05)
    limiter = gw.app.state.access.limiter
    with httpx.Client(base_url=gw.url, headers={"x-api-key": "sk-k"}) as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        wait_for(lambda: limiter.syncs > 0, what="a sync with Redis")
        private_redis.stop()
        wait_for(lambda: not limiter.store_up, what="the limiter noticing Redis is gone")
        statuses = [client.post("/v1/chat/completions", json=CHAT).status_code for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429]  # 4 per minute, kept by this replica alone; never a 5xx


def test_an_unreachable_redis_from_the_start_fails_no_request(gateway: StartGateway) -> None:
    gw = gateway(keys="keys: [{name: k, key: sk-k, rpm: 3}]", redis_url=dead_url().replace("http", "redis"))
    with httpx.Client(base_url=gw.url, headers={"x-api-key": "sk-k"}) as client:
        statuses = [client.post("/v1/chat/completions", json=CHAT).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
