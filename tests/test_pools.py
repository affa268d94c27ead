from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from gateway.errors import NoHealthyBackend
from gateway.metrics import GatewayMetrics
from gateway.pools import PoolSet


def make(standard: list[str], speculative: list[str] | None = None) -> PoolSet:
    pools = PoolSet(GatewayMetrics(CollectorRegistry()), random.Random(7))
    pools.configure({"standard": standard, "speculative": speculative or []})
    return pools


def test_booking_is_released_exactly_once() -> None:
    pools = make(["http://a:1"])
    booking = pools.acquire("standard", 100)
    assert pools.total_booked() == 100
    booking.release()
    booking.release()
    assert pools.total_booked() == 0
    assert pools.pools["standard"].replicas[0].inflight == 0


def test_the_inflight_and_booked_gauges_read_the_bookings_at_scrape_time() -> None:
    registry = CollectorRegistry()
    pools = PoolSet(GatewayMetrics(registry), random.Random(7))
    pools.configure({"standard": ["http://a:1"], "speculative": []})
    labels = {"pool": "standard", "replica": "http://a:1"}

    def scraped() -> tuple[float | None, float | None]:
        return (registry.get_sample_value("specgate_inflight_requests", labels),
                registry.get_sample_value("specgate_booked_tokens", labels))  # fmt: skip

    first, second = pools.acquire("standard", 100), pools.acquire("standard", 30)
    assert scraped() == (2, 130)
    first.release()
    assert scraped() == (1, 30)
    second.release()
    assert scraped() == (0, 0)


def test_power_of_two_choices_prefers_less_booked() -> None:
    pools = make(["http://a:1", "http://b:1"])
    a, b = pools.pools["standard"].replicas
    a.book(10_000)
    picks = [pools.acquire("standard", 1).replica for _ in range(50)]
    assert all(p is b for p in picks)


def test_load_spreads_over_replicas() -> None:
    pools = make([f"http://r{i}:1" for i in range(4)])
    for _ in range(400):
        pools.acquire("standard", 10)
    booked = [r.booked_tokens for r in pools.pools["standard"].replicas]
    assert max(booked) - min(booked) <= 50, booked


def test_unhealthy_replicas_are_skipped_and_none_left_raises() -> None:
    pools = make(["http://a:1", "http://b:1"])
    a, b = pools.pools["standard"].replicas
    a.set_healthy(False)
    assert {pools.acquire("standard", 1).replica for _ in range(10)} == {b}
    b.set_healthy(False)
    with pytest.raises(NoHealthyBackend):
        pools.acquire("standard", 1)


def test_retry_prefers_same_pool_then_other() -> None:
    pools = make(["http://a:1", "http://b:1"], ["http://s:1"])
    a, b = pools.pools["standard"].replicas
    assert pools.acquire_retry("standard", 1, frozenset({a})).replica is b
    assert pools.acquire_retry("standard", 1, frozenset({a, b})).replica.pool == "speculative"


def test_reconfigure_keeps_bookings_of_known_replicas() -> None:
    pools = make(["http://a:1"])
    booking = pools.acquire("standard", 50)
    pools.configure({"standard": ["http://a:1", "http://c:1"], "speculative": []})
    assert pools.pools["standard"].replicas[0] is booking.replica
    booking.release()
    assert pools.total_booked() == 0


def test_pool_snapshots_count_health() -> None:
    pools = make(["http://a:1", "http://b:1"], ["http://s:1"])
    pools.pools["standard"].replicas[0].set_healthy(False)
    snaps = pools.pool_snapshots()
    assert (snaps["standard"].healthy_replicas, snaps["standard"].total_replicas) == (1, 2)
    assert snaps["speculative"].available


def test_when_no_replica_is_up_a_suspected_one_is_tried_before_503() -> None:
    pools = make(["http://a:1", "http://b:1"], ["http://s:1"])
    a, b = pools.pools["standard"].replicas
    (s,) = pools.pools["speculative"].replicas
    a.set_healthy(False)  # refused or answered non-200: down for sure
    b.set_healthy(False, suspect=True)  # its health check timed out
    s.set_healthy(False, suspect=True)
    assert pools.acquire("standard", 1).replica is b  # the decided pool's suspect first
    assert pools.acquire_retry("standard", 1, frozenset({b})).replica is s
    assert pools.acquire("standard", 1, allowed=frozenset({"standard"})).replica is b
    with pytest.raises(NoHealthyBackend):
        pools.acquire_retry("standard", 1, frozenset({b}), allowed=frozenset({"standard"}))
    for _ in range(5):
        b.breaker.failure()  # real requests failed too: its breaker opens and it is out
    s.set_healthy(True)
    s.set_healthy(False)
    with pytest.raises(NoHealthyBackend):
        pools.acquire("standard", 1)
    assert pools.pool_snapshots()["standard"].healthy_replicas == 0  # a suspect does not count as up
    registry = pools.replicas()[0].metrics.registry
    assert registry.get_sample_value("specgate_suspect_dispatches_total", {"pool": "standard"}) == 2


def test_a_passing_check_clears_suspicion() -> None:
    pools = make(["http://a:1"])
    (a,) = pools.pools["standard"].replicas
    a.set_healthy(False, suspect=True)
    a.set_healthy(True)
    assert a.healthy and not a.suspect
