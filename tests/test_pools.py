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


class _Clock:
    """time.perf_counter as the test sets it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_booking_learns_how_far_the_pools_load_moved_while_it_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """Booked alone at t=0 on a two-replica pool; three more requests join the pool (either replica) from
    t=1 to t=3; released at t=4: it ran at 1 + 3 x 2/4 = 2.5 requests on average, 1.5 above its start."""
    clock = _Clock()
    monkeypatch.setattr("gateway.pools.time.perf_counter", clock)
    pools = make(["http://a:1", "http://b:1"])
    first = pools.acquire("standard", 10)
    clock.now += 1
    others = [pools.acquire("standard", 10) for _ in range(3)]
    assert {b.replica.url for b in others} | {first.replica.url} == {"http://a:1", "http://b:1"}
    clock.now += 2
    for booking in others:
        booking.release()
    assert others[0].run_shift == pytest.approx(2.0)  # the two booked just after it ran beside it throughout
    assert others[2].run_shift == pytest.approx(0.0)  # booked last, released with the others: nothing moved
    clock.now += 1
    first.release()
    assert first.run_shift == pytest.approx(1.5)
    first.release()  # idempotent: the clock is not moved twice
    assert pools.pools["standard"].replicas[0].clock.count == 0


def test_each_pool_keeps_its_own_load_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr("gateway.pools.time.perf_counter", clock)
    pools = make(["http://a:1"], ["http://s:1"])
    mine = pools.acquire("speculative", 10)
    clock.now += 1
    other = pools.acquire("standard", 10)  # the other pool's load is not this pool's
    clock.now += 1
    other.release()
    mine.release()
    assert mine.run_shift == pytest.approx(0.0)
    pools.configure({"standard": ["http://a:1", "http://b:1"], "speculative": ["http://s:1"]})
    a, b = pools.pools["standard"].replicas
    assert a.clock is b.clock is not pools.pools["speculative"].replicas[0].clock


def test_a_booking_learns_how_busy_the_other_pool_was_while_it_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """Booked on the speculative pool from t=0 to t=4; the standard pool has requests from t=1 to t=2 and from
    t=1.5 to t=3 (overlapping: busy from 1 to 3): busy half of its life. Its own pool's load is not counted."""
    clock = _Clock()
    monkeypatch.setattr("gateway.pools.time.perf_counter", clock)
    pools = make(["http://a:1"], ["http://s:1"])
    mine = pools.acquire("speculative", 10)
    neighbour = pools.acquire("speculative", 10)  # its own pool busy too: not what other_busy reads
    clock.now += 1
    first = pools.acquire("standard", 10)
    clock.now += 0.5
    second = pools.acquire("standard", 10)
    clock.now += 0.5
    first.release()
    assert first.other_busy == pytest.approx(1.0)  # the speculative pool had work all along
    clock.now += 1
    second.release()
    clock.now += 1
    mine.release()
    neighbour.release()
    assert mine.other_busy == pytest.approx(0.5)
    assert mine.run_shift == pytest.approx(1.0)  # its own pool: the neighbour, booked just after it
    lone = pools.acquire("standard", 10)
    clock.now += 1
    lone.release()
    assert lone.other_busy == pytest.approx(0.0)
