"""gateway/bench/limits_accuracy.py: two in-process gateways sharing one key's limits through a real Redis."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rich.console import Console

from gateway.bench import limits_accuracy


@pytest.mark.redis
def test_the_limits_hold_across_two_replicas_and_fail_nothing() -> None:
    console = Console(width=160, record=True)
    scenarios = [replace(s, value=s.value // 5) for s in limits_accuracy.SCENARIOS]  # a short run still hits them
    outcomes = {o.scenario.name: o for o in limits_accuracy.run(3.0, 4, 0.1, console, scenarios)}
    assert all(o.failed == 0 and o.admitted > 0 and o.limited > 0 for o in outcomes.values())
    shared_rpm, alone_rpm = outcomes["rpm, shared"], outcomes["rpm, Redis down (each replica alone)"]
    # A short run ends with the shared bucket possibly in debt: between two syncs each replica may spend the level
    # it last saw, so two replicas may admit up to one more full bucket (docs/operating.md), and on an idle machine
    # fast clients do (1.37-1.45x here on Dec 5; 1.2-1.3x on a busy one). That bound is what is guaranteed; without
    # the store each replica admits the whole limit, and the shared run must admit fewer than that.
    limit = shared_rpm.scenario.value
    guaranteed = (2 * limit + limit / 60 * 3.0) / shared_rpm.allowed
    assert 0.9 <= shared_rpm.accuracy <= guaranteed and 0.9 <= alone_rpm.accuracy <= 1.1
    assert alone_rpm.admitted > shared_rpm.admitted
    concurrency = outcomes["concurrency, shared (0.2 s answers)"]
    # Once the replicas have synced, each reserves the other's share: the total stays at the limit (counted
    # as a replica saw the other at its last sync, so allow one in flight over; without the shares it was 2x).
    assert concurrency.max_inflight <= concurrency.scenario.value + 1
    console.print(limits_accuracy.table(list(outcomes.values()), 0.1))
    assert "ratio" in console.export_text()
