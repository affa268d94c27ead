"""Circuit breaker per replica: unit tests on a fake clock, the pool's picking, and one HTTP test."""

from __future__ import annotations

import random
from collections.abc import Callable

import httpx
import pytest
from prometheus_client import CollectorRegistry

from gateway.breaker import CLOSED, HALF_OPEN, OPEN, BreakerPolicy, CircuitBreaker
from gateway.metrics import GatewayMetrics
from gateway.pools import PoolSet
from tests.conftest import Gateway, Upstreams, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def breaker(**policy: float) -> tuple[CircuitBreaker, Clock, list[str]]:
    clock, changes = Clock(), []
    return CircuitBreaker(BreakerPolicy(**policy), changes.append, clock), clock, changes  # type: ignore[arg-type]


def test_consecutive_failures_open_it_and_a_success_resets_the_count() -> None:
    b, _, changes = breaker(failure_threshold=3, min_requests=1000)
    for _ in range(2):
        b.failure()
    b.success()
    b.failure()
    b.failure()
    assert b.state == CLOSED and b.admits
    b.failure()
    assert (b.state, b.admits, changes) == (OPEN, False, [OPEN])


def test_error_rate_over_the_window_opens_it() -> None:
    b, clock, _ = breaker(failure_threshold=100, error_rate=0.5, min_requests=10, window_s=10)
    for i in range(20):  # alternate: never 2 failures in a row, 50 % failures
        clock.now += 0.1
        b.tick()
        b.success() if i % 2 else b.failure()
    assert b.state == OPEN


def test_old_outcomes_leave_the_window() -> None:
    b, clock, _ = breaker(failure_threshold=100, error_rate=0.5, min_requests=10, window_s=5)
    for _ in range(9):
        b.failure()  # 9 failures, but under min_requests
    clock.now += 30  # they age out of the window
    b.tick()
    for _ in range(9):
        b.success()
    b.failure()  # 1 of 10 in the window
    assert b.state == CLOSED


def test_half_open_admits_one_probe_and_success_closes() -> None:
    b, clock, changes = breaker(failure_threshold=1, cooldown_s=5)
    b.failure()
    b.tick()
    assert b.state == OPEN  # still cooling down
    clock.now += 5
    b.tick()
    assert (b.state, b.admits) == (HALF_OPEN, True)
    assert b.dispatched() is True  # the probe
    assert not b.admits  # nobody else while the probe runs
    b.success()
    assert (b.state, b.admits, changes) == (CLOSED, True, [OPEN, HALF_OPEN, CLOSED])
    assert b.dispatched() is False


def test_failed_probe_reopens_and_a_probe_without_outcome_lets_another_probe() -> None:
    b, clock, _ = breaker(failure_threshold=1, cooldown_s=5)
    b.failure()
    clock.now += 5
    b.tick()
    b.dispatched()
    b.probe_ended()  # the client went away before any outcome
    assert (b.state, b.admits) == (HALF_OPEN, True)
    b.dispatched()
    b.failure()
    assert (b.state, b.admits, b.opened_at) == (OPEN, False, clock.now)
    assert b.opens == 2


def test_the_window_holds_the_last_window_s_seconds() -> None:
    b, clock, _ = breaker(failure_threshold=100, error_rate=0.5, min_requests=10, window_s=3)
    for _ in range(9):  # second 0: 9 failures, under min_requests
        b.failure()
    clock.now += 1.5
    b.tick()
    b.success()  # second 1
    clock.now += 1.0
    b.tick()  # second 2: second 0 is still in the 3 s window
    b.failure()  # 11 outcomes, 10 failures
    assert b.state == OPEN
    b2, clock2, _ = breaker(failure_threshold=100, error_rate=0.5, min_requests=10, window_s=3)
    for _ in range(9):
        b2.failure()
    clock2.now += 3.5
    b2.tick()  # second 0 left the window
    b2.success()
    b2.failure()
    assert b2.state == CLOSED


def test_disabled_breaker_never_opens() -> None:
    b, _, _ = breaker(failure_threshold=0)
    for _ in range(100):
        b.failure()
    assert b.state == CLOSED and b.admits


def pools_with(policy: BreakerPolicy) -> tuple[PoolSet, CollectorRegistry]:
    registry = CollectorRegistry()
    pools = PoolSet(GatewayMetrics(registry), random.Random(3), policy)
    pools.configure({"standard": ["http://a:1", "http://b:1"], "speculative": ["http://s:1"]})
    return pools, registry


def test_an_open_replica_is_not_picked_and_counts_as_down_in_the_snapshot() -> None:
    pools, registry = pools_with(BreakerPolicy(failure_threshold=2))
    a, b = pools.pools["standard"].replicas
    a.breaker.failure()
    a.breaker.failure()
    assert {pools.acquire("standard", 1).replica for _ in range(20)} == {b}
    assert pools.pool_snapshots()["standard"].healthy_replicas == 1
    labels = {"pool": "standard", "replica": "http://a:1"}
    assert registry.get_sample_value("specgate_replica_breaker_state", {**labels, "state": "open"}) == 1
    assert registry.get_sample_value("specgate_replica_breaker_state", {**labels, "state": "closed"}) == 0
    assert registry.get_sample_value("specgate_breaker_opens_total", labels) == 1


def test_a_pool_whose_replicas_are_all_open_falls_back_to_the_other_pool() -> None:
    pools, _ = pools_with(BreakerPolicy(failure_threshold=1))
    for replica in pools.pools["standard"].replicas:
        replica.breaker.failure()
    assert pools.acquire("standard", 1).replica.pool == "speculative"


def test_the_half_open_probe_booking_is_the_only_one_until_released() -> None:
    pools, _ = pools_with(BreakerPolicy(failure_threshold=1, cooldown_s=0.01))
    a, b = pools.pools["standard"].replicas
    a.breaker.failure()
    wait_for(lambda: (pools.tick_breakers(), a.breaker.state == HALF_OPEN)[1], 2, "half-open")
    heavy = b.book(10**9)  # a is the cheaper pick now
    probe = pools.acquire("standard", 1)
    assert probe.replica is a and probe.probe
    assert all(pools.acquire("standard", 1).replica is b for _ in range(10))
    probe.release()  # no outcome recorded: a may be probed again
    assert a.breaker.admits
    heavy.release()


StartGateway = Callable[..., Gateway]


def test_breaker_opens_from_real_5xx_traffic_shows_in_ready_and_metrics_and_closes(
    gateway: StartGateway, upstreams: Upstreams
) -> None:
    gw = gateway(breaker_failures=3, breaker_cooldown_s=0.5, speculative_urls=[])
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        for _ in range(3):
            r = client.post("/v1/chat/completions", json=CHAT, headers={"x-fake-status": "500"})
            assert r.status_code == 500  # relayed as the replica sent it
        wait_for(lambda: client.get("/ready").status_code == 503, 5, "/ready 503: its only replica is out")
        ready = client.get("/ready")
        replicas = ready.json()["replicas"]
        assert [(r["pool"], r["breaker"], r["healthy"]) for r in replicas] == [("standard", "open", True)]
        metrics = client.get("/metrics").text
        assert 'state="open"} 1.0' in metrics and "specgate_breaker_opens_total" in metrics
        r = client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_backend"
        wait_for(lambda: client.get("/ready").json()["replicas"][0]["breaker"] == "half_open", 10, "half-open")
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200  # the probe closes it
        wait_for(lambda: client.get("/ready").status_code == 200, 5, "/ready 200 again")
        assert client.get("/ready").json()["replicas"][0]["breaker"] == "closed"


CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize("status", [400, 404, 422])
def test_client_errors_do_not_open_the_breaker(gateway: StartGateway, status: int) -> None:
    gw = gateway(breaker_failures=2)
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        for _ in range(4):
            r = client.post("/v1/chat/completions", json=CHAT, headers={"x-fake-status": str(status)})
            assert r.status_code == status
    assert all(r.breaker.state == CLOSED for r in gw.app.state.pools.replicas())
