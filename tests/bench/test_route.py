"""``specgate bench route``'s pass order (the run itself, on real pools: tests/backends/test_bench_route.py)."""

from __future__ import annotations

from gateway.bench.route import PHASES, phase_orders


def test_passes_alternate_the_phase_order_so_drift_weighs_on_every_policy_alike() -> None:
    assert phase_orders(1) == [PHASES]
    assert phase_orders(2) == [PHASES, PHASES[::-1]]
    assert phase_orders(3) == [PHASES, PHASES[::-1], PHASES]
    assert phase_orders(0) == [PHASES]  # at least one pass
    # over two passes every phase's mean position is the same: a linear drift shifts them all alike
    positions = {p: sum(order.index(p) for order in phase_orders(2)) for p in PHASES}
    assert len(set(positions.values())) == 1
