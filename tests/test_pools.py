from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from gateway.errors import NoHealthyBackend
from gateway.metrics import GatewayMetrics
from gateway.pools import (
    PoolSet,
    Replica,
    affinity_limit,
    choose_replica,
    expected_cached,
    expected_hit,
    request_blocks,
)
from gateway.prefix_index import PrefixIndex, chain


def make(standard: list[str], speculative: list[str] | None = None, index: PrefixIndex | None = None) -> PoolSet:
    pools = PoolSet(GatewayMetrics(CollectorRegistry()), random.Random(7), index=index)
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


# -- the prefix index: replica choice by expected prefix hit, yielding to load ---------------------------------

PROMPT = (11, 12, 13, 14)  # a prompt's block values (gateway/prefix_index.py makes them from its text)
URLS = ["http://a:1", "http://b:1", "http://c:1"]


def indexed(urls: list[str] = URLS) -> tuple[PoolSet, list[Replica], PrefixIndex]:
    index = PrefixIndex()
    pools = make(urls, index=index)
    return pools, pools.pools["standard"].replicas, index


def busy(replica: Replica, requests: int) -> None:
    for _ in range(requests):
        replica.book(100)


def test_with_even_loads_the_replica_holding_the_longest_prefix_is_chosen() -> None:
    pools, (a, b, c), index = indexed()
    index.record(b.url, PROMPT)
    index.record(c.url, PROMPT[:2])
    busy(a, 2)  # every replica within the slack of the least loaded (a: 2, b and c: 0)
    for _ in range(20):
        booking = pools.acquire("standard", 100, blocks=PROMPT)
        assert booking.replica is b
        booking.release()
    assert pools.acquire("standard", 100, blocks=(11, 12, 99)).replica in (b, c)  # both hold two: fewer booked


def test_ties_between_holders_go_to_the_fewest_booked_tokens() -> None:
    pools, (a, b, c), index = indexed()
    for replica in (a, b, c):
        index.record(replica.url, PROMPT)
    a.book(500)
    b.book(50)
    c.book(200)
    assert pools.acquire("standard", 1, blocks=PROMPT).replica is b


def test_affinity_yields_when_the_holder_is_past_the_slack() -> None:
    pools, (a, b, c), index = indexed()
    index.record(b.url, PROMPT)
    busy(b, 8)  # the least loaded has 0: b may have up to 8 and still win
    first = pools.acquire("standard", 100, blocks=PROMPT)
    assert first.replica is b
    # now b has 9 in flight: past the slack, it is not eligible; nobody else holds the prompt -> power of two
    picks = {pools.acquire("standard", 100, blocks=PROMPT).replica for _ in range(6)}
    assert b not in picks and picks <= {a, c}


def test_the_slack_grows_with_the_load() -> None:
    assert affinity_limit(0) == 8 and affinity_limit(40) == 50 and affinity_limit(100) == 125
    pools, (a, b, c), index = indexed()
    index.record(c.url, PROMPT)
    busy(a, 40)
    busy(b, 40)
    busy(c, 50)
    assert pools.acquire("standard", 1, blocks=PROMPT).replica is c  # 50 <= 40 + 10
    assert pools.acquire("standard", 1, blocks=PROMPT).replica is not c  # 51 > 50


def test_a_holder_that_is_down_or_excluded_is_not_chosen() -> None:
    pools, (_, b, c), index = indexed()
    index.record(b.url, PROMPT)
    index.record(c.url, PROMPT[:1])
    assert pools.acquire_retry("standard", 1, frozenset({b}), blocks=PROMPT).replica is c
    b.set_healthy(False)
    assert pools.acquire("standard", 1, blocks=PROMPT).replica is c


def test_without_blocks_or_without_the_index_the_choice_is_power_of_two_as_before() -> None:
    """The same seed picks the same replicas whether the index is there (and holds the prompt) or not."""
    def picks(index: PrefixIndex | None, blocks: tuple[int, ...]) -> list[str]:
        pools = make([f"http://r{i}:1" for i in range(4)], index=index)
        if index is not None:
            index.record("http://r2:1", PROMPT)
        return [pools.acquire("standard", 10 + i % 7, blocks=blocks).replica.url for i in range(60)]

    today = picks(None, ())
    assert picks(PrefixIndex(), ()) == today
    assert picks(None, PROMPT) == today  # blocks but no index (prefix_index=off)
    assert len(set(today)) == 4
    assert picks(PrefixIndex(), PROMPT) != today  # the test can tell


def test_a_booking_records_the_prompt_and_counts_the_expected_hit() -> None:
    pools, (a, b, c), index = indexed()
    index.record(a.url, PROMPT[:3])
    booking = pools.acquire("standard", 1, blocks=PROMPT)
    assert booking.replica is a and index.expected_hit(a.url, PROMPT) == 4
    registry = a.metrics.registry
    labels = {"pool": "standard", "replica": a.url}
    assert registry.get_sample_value("specgate_prefix_cache_queries_total", labels) == 4
    assert registry.get_sample_value("specgate_prefix_cache_hits_total", labels) == 3
    pools.acquire("standard", 1)  # no blocks: nothing recorded, nothing counted
    assert registry.get_sample_value("specgate_prefix_cache_queries_total", labels) == 4
    assert sum(index.held(r.url) for r in (a, b, c)) == 4


def test_reconfigure_keeps_the_index_of_known_replicas_only() -> None:
    pools, (a, b, _), index = indexed()
    index.record(a.url, PROMPT)
    index.record(b.url, PROMPT)
    pools.configure({"standard": [a.url, "http://d:1"], "speculative": []})
    assert index.held(a.url) == 4 and index.held(b.url) == 0
    assert pools.pools["standard"].index is index


def test_priced_affinity_yields_to_load_where_the_hit_is_worth_less_than_the_extra_requests() -> None:
    """With ``worth`` (blocks one more request in flight is worth), a holder wins only where its hit beats
    ``worth`` x its extra requests over the least loaded; without it, the fixed slack alone (as before)."""
    _, (a, b, c), index = indexed()
    index.record(b.url, PROMPT)  # four blocks
    busy(b, 2)
    assert choose_replica([a, b, c], PROMPT, index, random.Random(0)) is b  # within the slack of 8
    assert choose_replica([a, b, c], PROMPT, index, random.Random(0), worth=1.5) is b  # 4 - 2 x 1.5 > 0
    assert choose_replica([a, b, c], PROMPT, index, random.Random(0), worth=2.5) in (a, c)  # 4 - 2 x 2.5 < 0
    index.record(a.url, PROMPT[:1])  # the least loaded holds one block: 1 > 4 - 2 x 2
    assert choose_replica([a, b, c], PROMPT, index, random.Random(0), worth=2.0) is a
    busy(b, 7)  # past the slack: never, however cheap the load
    assert choose_replica([a, b, c], PROMPT, index, random.Random(0), worth=0.01) is a


def test_what_a_request_in_flight_is_worth_in_cached_blocks() -> None:
    # 0.2 s added per request on the pool, two replicas, 1 ms a token, 128 tokens per 512-byte block
    assert request_blocks(0.2, 0.001, 2, 1280, 5120) == pytest.approx((1 + 1.0) * 0.2 * 2 / 0.128)
    assert request_blocks(0.2, 0.001, 2, 1280, 5120, externality=0.0) == pytest.approx(0.2 * 2 / 0.128)
    for unknown in ((0.0, 0.001), (0.2, 0.0)):
        assert request_blocks(*unknown, 2, 1280, 5120) is None  # the fixed slack decides


def test_expected_hits_show_each_replica_and_its_eligibility() -> None:
    pools, (a, b, c), index = indexed()
    index.record(b.url, PROMPT[:2])
    busy(b, 9)
    rows = pools.expected_hits(PROMPT)["standard"]
    assert [(r["replica"], r["expected_hit_blocks"], r["affinity_eligible"]) for r in rows] == [
        (a.url, 0, True), (b.url, 2, False), (c.url, 0, True)
    ]  # fmt: skip
    assert rows[1]["expected_hit_share"] == 0.5 and pools.expected_hits(PROMPT)["speculative"] == []


# -- what each pool's choice would find cached: the pool choice's input ------------------------------------------


def test_each_pool_expects_the_hit_of_the_replica_its_choice_would_take() -> None:
    """The holder the rule would choose gives the pool's expected hit; a holder past the slack does not (the
    choice would go by load); a pool of one replica expects that one's; the other pool expects nothing."""
    index = PrefixIndex()
    pools = make(URLS, ["http://s:1"], index=index)
    a, b, _ = pools.pools["standard"].replicas
    values = chain(b"y" * 2048)  # four blocks of 512 bytes, 2 KiB read
    index.record(b.url, values)
    index.record(a.url, values[:1])
    assert pools.expected_cached(values, 2048, 400) == {"standard": 400, "speculative": 0}
    busy(b, 9)  # past the slack: the choice would be a, which holds one block of four
    assert pools.expected_cached(values, 2048, 400) == {"standard": 100, "speculative": 0}
    index.record("http://s:1", values[:2])
    assert pools.expected_cached(values, 2048, 400)["speculative"] == 200  # the only replica's, whatever its load
    assert [pools.pools[name].expected_hit(values) for name in ("standard", "speculative")] == [1, 2]


def test_a_pool_with_no_replica_up_or_no_index_expects_nothing_cached() -> None:
    pools, (a, b, c), index = indexed()
    index.record(a.url, PROMPT)
    for replica in (a, b, c):
        replica.set_healthy(False)
    assert pools.expected_cached(PROMPT, 2048, 100) == {"standard": 0, "speculative": 0}
    assert make(URLS).expected_cached(PROMPT, 2048, 100) == {"standard": 0, "speculative": 0}


class _Bare:
    """Anything with a URL, an in-flight count and booked tokens (the simulator's replicas)."""

    def __init__(self, url: str, inflight: int = 0, booked_tokens: int = 0) -> None:
        self.url, self.inflight, self.booked_tokens = url, inflight, booked_tokens


def test_the_rule_is_the_same_for_the_gateways_replicas_and_any_other() -> None:
    pools, replicas, index = indexed()
    index.record(replicas[2].url, PROMPT)
    bare = [_Bare(r.url) for r in replicas]
    rng = random.Random(1)
    assert choose_replica(bare, PROMPT, index, rng) is bare[2]
    assert pools.acquire("standard", 1, blocks=PROMPT).replica is replicas[2]
    bare[2].inflight = 9
    assert expected_hit(bare, PROMPT, index) == 0 and choose_replica(bare, PROMPT, index, rng) in bare[:2]
    assert expected_cached({"one": bare[2:]}, PROMPT, 0, 10, index) == {"one": 0}  # nothing read: nothing known
