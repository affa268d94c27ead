"""The simulator's summaries: the per-second split that shows herding."""

from __future__ import annotations

import pytest

from backends.emulator.report import shares_per_second, summarise
from backends.emulator.simulate import RequestResult


def results(pools: list[str], per_second: int) -> list[RequestResult]:
    """One result per pool given, ``per_second`` arrivals in each virtual second."""
    return [RequestResult(i, f"item-{i}", "chat", "chat", pool, "fastest", i / per_second, 0.5, 64, 0.1, 1.0)
            for i, pool in enumerate(pools)]  # fmt: skip


def test_a_steady_split_has_no_spread_and_a_herd_has_the_widest() -> None:
    steady = results(["speculative", "standard"] * 50, per_second=10)  # half and half in every second
    herd = results((["speculative"] * 10 + ["standard"] * 10) * 5, per_second=10)  # all, then none, ...
    assert [share for _, share in shares_per_second(steady)] == [0.5] * 10
    assert summarise(steady).speculative_share == summarise(herd).speculative_share == 0.5
    assert summarise(steady).share_spread == 0.0
    assert summarise(herd).share_spread == pytest.approx(0.5)


def test_seconds_with_too_few_arrivals_are_left_out_of_the_spread() -> None:
    sparse = results(["speculative", "standard", "standard", "speculative"], per_second=1)  # one a second
    assert shares_per_second(sparse) == [] and summarise(sparse).share_spread == 0.0
