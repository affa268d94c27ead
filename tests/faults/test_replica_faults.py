"""Replicas that die (SIGKILL), hang (SIGSTOP) or slow down, under load, with every part a real process.

Three fake replicas (``python -m gateway.bench.fake_upstream``): A and B in the standard pool, C in the
speculative one; ``specgate serve`` in front; 64 concurrent workers pinned to the standard pool, half of
them paced streams. Run with ``-s`` for the figures.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import httpx
import pytest

from tests.faults.procs import (
    Load,
    Outcome,
    Proc,
    fake_replica,
    gateway_proc,
    metric,
    replica_state,
    running,
    summary,
    wait_ready,
)
from tests.signals.servers import wait_until

pytestmark = pytest.mark.slow

PINNED = {"x-specgate-pool": "standard"}
STREAM = {"x-fake-chunks": "40", "x-fake-interval": "0.05"}  # ~2 s per stream: many in flight at any time
PLAIN = {"x-fake-delay": "0.3"}  # a response head takes 0.3 s: many requests wait for theirs at any time


def replicas(tmp_path: Path) -> tuple[Proc, Proc, Proc]:
    return fake_replica(tmp_path, "A"), fake_replica(tmp_path, "B"), fake_replica(tmp_path, "C")


async def load_with(load: Load, seconds: float, at: float | None = None, fault: object = None) -> float:
    """Run ``load`` for ``seconds``; call ``fault()`` ``at`` seconds in; return when the fault happened."""
    task = asyncio.create_task(load.run())
    fault_at = 0.0
    if at is not None and callable(fault):
        await asyncio.sleep(at)
        fault_at = time.monotonic()
        await asyncio.to_thread(fault)
        seconds -= at
    await asyncio.sleep(seconds)
    load.stop.set()
    await asyncio.wait_for(task, timeout=90)  # a hang fails the test here instead of stalling CI
    return fault_at


def test_sigkill_under_64_concurrent_requests_loses_nothing_that_had_not_started(tmp_path: Path) -> None:
    a, b, c = replicas(tmp_path)
    gw = gateway_proc(
        tmp_path, [a.url, b.url], [c.url], breaker_cooldown_s=1.0, first_byte_timeout_s=20, idle_timeout_s=10
    )
    with running(a, b, c, gw):
        wait_ready(gw)
        load = Load(gw.url, workers=64, headers=PINNED, stream_headers=STREAM, plain_headers=PLAIN)
        killed_at = asyncio.run(load_with(load, seconds=5.0, at=2.0, fault=a.kill))
        streams = [o for o in load.outcomes if o.stream]
        cut = [o for o in streams if o.error_event]
        lost = [o for o in load.outcomes if not o.ok and not o.error_event]
        print(f"\nSIGKILL of replica A at 64 concurrent: {summary(load.outcomes)}")
        print(f"  streams {len(streams)}, cut with an error event {len(cut)}; lost otherwise {len(lost)}")
        print(f"  retries {metric(gw, 'specgate_retries_total'):.0f}")
        assert not lost, summary(load.outcomes)
        assert all(o.head_at is not None and o.head_at < killed_at + 2.0 for o in cut), "only started streams cut"
        assert cut, "the kill should have cut the streams A was relaying"
        assert metric(gw, "specgate_retries_total") > 0  # requests waiting on A went elsewhere
        after = [o for o in load.outcomes if o.started > killed_at + 0.5]
        assert after and all(o.ok for o in after)

        # A comes back on the same port: the health check sees it, the breaker's probe closes, traffic returns.
        a.start()
        wait_until(
            lambda: replica_state(gw, a.url)["healthy"] and replica_state(gw, a.url)["breaker"] != "open",
            30,
            "replica A back in the gateway's view",
            interval_s=0.2,
        )
        back = Load(gw.url, workers=8, stream_share=0, headers=PINNED, plain_headers={"x-fake-delay": "0.05"})
        asyncio.run(load_with(back, seconds=2.0))
        served = [o.served_by for o in back.outcomes if o.ok]
        print(f"  after A's restart: {len(served)} requests, {served.count('A')} served by A, {served.count('B')} by B")
        assert all(o.ok for o in back.outcomes), summary(back.outcomes)
        assert served.count("A") >= len(served) // 5, "traffic comes back to the restarted replica"
        assert replica_state(gw, a.url)["breaker"] == "closed"


def test_a_slow_then_hung_replica_does_not_drag_the_rest_and_hits_the_deadlines(tmp_path: Path) -> None:
    a, b, c = replicas(tmp_path)
    deadline = 1.5
    gw = gateway_proc(
        tmp_path,
        [a.url, b.url],
        [c.url],
        first_byte_timeout_s=deadline,
        idle_timeout_s=deadline,
        health_timeout_s=0.5,
        breaker_cooldown_s=30,
    )
    with running(a, b, c, gw):
        wait_ready(gw)
        # Slow: A answers every request 1.5 s late (below the deadlines); B's latency must not follow.
        base = Load(gw.url, workers=16, stream_share=0, headers=PINNED)
        asyncio.run(load_with(base, seconds=1.5))
        httpx.post(f"{a.url}/fake/delay", params={"s": str(deadline)}, timeout=5)
        slow = Load(gw.url, workers=16, stream_share=0, headers=PINNED)
        asyncio.run(load_with(slow, seconds=3.0))
        httpx.post(f"{a.url}/fake/delay", params={"s": "0"}, timeout=5)
        served = [o.served_by for o in slow.outcomes]
        before, during = _direct_latency(base.outcomes, "B"), _direct_latency(slow.outcomes, "B")
        print(
            f"\nreplica A {deadline} s slow: {summary(slow.outcomes)}; A served {served.count('A')}, B"
            f" {served.count('B')}; B's median {before * 1e3:.0f} ms before, {during * 1e3:.0f} ms during"
        )
        assert all(o.ok for o in slow.outcomes), summary(slow.outcomes)
        assert served.count("B") > served.count("A")  # least booked work: B takes what A is slow to finish
        assert during < 3 * before + 0.25

        # Hung: SIGSTOP while A relays streams and owes response heads. The kernel still accepts
        # connections to it; nothing answers.
        def hang() -> None:
            wait_until(lambda: replica_state(gw, a.url)["inflight"] >= 4, 20, "requests in flight on A", 0.05)
            a.pause()

        stream = {"x-fake-chunks": "40", "x-fake-interval": "0.1"}  # 4 s
        load = Load(gw.url, workers=16, headers=PINNED, stream_headers=stream, plain_headers={"x-fake-delay": "0.5"})
        stopped_at = asyncio.run(load_with(load, seconds=9.0, at=3.0, fault=hang))
        try:
            state = replica_state(gw, a.url)
        finally:
            a.resume()
        cut = [o for o in load.outcomes if o.error_event]
        retried = metric(gw, "specgate_retries_total")
        print(f"SIGSTOP of replica A: {summary(load.outcomes)}; {retried:.0f} retried; A then {state}")
        assert not [o for o in load.outcomes if not o.ok and not o.error_event], summary(load.outcomes)
        assert all(o.head_at is not None and o.head_at < stopped_at + 2.0 for o in cut), "only started streams cut"
        assert cut, "streams relayed from A end with an error event once the idle deadline passes"
        assert retried > 0, "requests owed a head by A are retried once the first-byte deadline passes"
        slack = 10.0  # a loaded 2-core CI machine: generous, but far from a hang
        assert all(o.ended - stopped_at < deadline + slack for o in cut)
        assert all(o.ended - o.started < 2 * deadline + slack for o in load.outcomes if not o.stream)
        assert not state["healthy"] or state["breaker"] != "closed", "the hung replica is taken out"
        # Plain requests B answered directly: as fast after A hung as before.
        plain = [o for o in load.outcomes if not o.stream]
        before = _direct_latency([o for o in plain if o.ended < stopped_at], "B")
        during = _direct_latency([o for o in plain if o.started > stopped_at + 2 * deadline], "B")
        print(f"  plain requests B answered directly: median {before * 1e3:.0f} ms before, {during * 1e3:.0f} after")
        assert during < 3 * before + 0.25


def _direct_latency(outcomes: list[Outcome], name: str) -> float:
    times = [o.ended - o.started for o in outcomes if o.served_by == name and "retry" not in o.reason and o.ok]
    assert len(times) >= 5, f"too few requests served by {name}: {len(times)}"
    return statistics.median(times)
