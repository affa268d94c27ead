"""The learner's cells: a Trend reads the slope whatever the constant bias of what it is fed."""

from __future__ import annotations

import random

import pytest

from gateway.adaptive.cells import Trend


def test_a_trend_reads_the_slope_through_a_constant_bias_and_forgets_an_old_one() -> None:
    rng = random.Random(3)
    trend = Trend()
    assert trend.value() == 0.0 and trend.spread == 0.0
    for _ in range(400):
        x = rng.uniform(0.0, 3.0)
        trend.step(x, 0.5 + 0.05 * x + rng.gauss(0.0, 0.01))  # a bias of 0.5: a regression through 0 reads ~0.3
    assert trend.value() == pytest.approx(0.05, rel=0.15)
    for _ in range(600):  # the traffic changes: the sums fade, the new slope takes over
        x = rng.uniform(0.0, 3.0)
        trend.step(x, -1.0 + 0.2 * x)
    assert trend.value() == pytest.approx(0.2, rel=0.05)


def test_a_trend_with_nothing_spread_stays_at_its_prior_and_takes_a_shared_slope() -> None:
    trend = Trend()
    for _ in range(50):
        trend.step(1.0, 7.0)  # one x only: no slope to see
    assert trend.value() == pytest.approx(0.0, abs=1e-9)
    trend.take(0.3, 2.0)
    assert trend.value() == pytest.approx(0.3)
    seen = Trend()
    for x in (0.0, 1.0, 2.0) * 20:
        seen.step(x, 0.1 * x)
    spread = seen.spread
    seen.take(0.5, 99.0)  # keeps the spread it saw
    assert seen.value() == pytest.approx(0.5) and seen.spread == pytest.approx(spread)
