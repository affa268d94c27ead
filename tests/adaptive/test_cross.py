"""The cross term: how a pool's time per token follows the other pool's busyness (pools on one device)."""

from __future__ import annotations

import math
import random

import pytest

from gateway.adaptive.cross import SHARED_PRIOR, Cross
from gateway.adaptive.learner import Learner, Observation
from gateway.adaptive.model import busy


def _tpot(load: float) -> float:
    """A pool's own time per token: flat, then rising (not a line in the load position: a misfit to keep)."""
    return 0.02 * (1.0 + load / 10.0) ** 1.5


def _observe(learner: Learner, rng: random.Random, own: float, other: float, cross: float, noise: float) -> None:
    tpot = _tpot(own) * math.exp(cross * busy(other) + rng.gauss(0.0, noise))
    learner.observe(Observation("standard", "chat", 100, own, 0.05, 0.05 + 99 * tpot, 100, other_busy=busy(other)))
    # the other pool is observed too (its own numbers do not matter here)
    total = 0.05 + 99 * _tpot(other)
    learner.observe(Observation("speculative", "chat", 100, other, 0.05, total, 100, other_busy=busy(own)))


@pytest.mark.parametrize("seed", range(3))
def test_a_pool_on_shared_hardware_learns_how_the_other_slows_it(seed: int) -> None:
    rng = random.Random(seed)
    learner = Learner()
    for i in range(1500):
        own = rng.uniform(0, 20)
        other = max(0.0, own * 0.5 + rng.uniform(-6, 6))  # the loads move together, not in lockstep
        _observe(learner, rng, own, other, cross=0.5, noise=0.2)
        if i % 25 == 0:
            learner.model(float(i))  # as the gateway's snapshot refresh does
    model = learner.model()
    assert 0.35 < model.pools["standard"].cross <= 0.52
    shared, alone = (model.predict("standard", "chat", 100, 100, 8.0, other_load=o) for o in (15.0, 0.0))
    assert shared is not None and alone is not None
    assert shared.tpot_s / alone.tpot_s == pytest.approx(math.exp(0.5), rel=0.1)
    assert alone.tpot_s == pytest.approx(_tpot(8.0), rel=0.15)


@pytest.mark.parametrize("seed", range(10))
def test_pools_on_separate_hardware_keep_no_cross_term(seed: int) -> None:
    """Loads that rise and fall together (traffic), an own curve that is no line, noisy times: the cross term
    stays 0 at every refresh, so the model is what it was without one."""
    rng = random.Random(seed)
    learner = Learner()
    traffic = 5.0
    for i in range(3000):
        traffic = min(max(traffic + rng.gauss(0.0, 1.0), 0.0), 60.0)
        own = max(0.0, traffic + rng.gauss(0.0, 2.0))
        other = max(0.0, 0.8 * traffic + rng.gauss(0.0, 2.0))
        _observe(learner, rng, own, other, cross=0.0, noise=0.3)
        if i % 50 == 0:
            assert learner.model(float(i)).pools["standard"].cross == 0.0, i


def test_without_the_other_load_nothing_is_learned_or_applied() -> None:
    rng = random.Random(4)
    learner = Learner()
    for _ in range(500):
        own = rng.uniform(0, 20)
        tpot = _tpot(own) * math.exp(rng.gauss(0.0, 0.1))
        learner.observe(Observation("standard", "chat", 100, own, 0.05, 0.05 + 99 * tpot, 100))
    model = learner.model()
    assert model.pools["standard"].cross == 0.0
    plain, busy = (model.predict("standard", "chat", 100, 100, 5.0, other_load=o) for o in (0.0, 30.0))
    assert plain == busy


def test_a_request_is_charged_for_slowing_the_other_pool() -> None:
    """A pool whose speed follows the other's load makes each request sent to that other pool costlier by the
    delay it adds there; its own predicted time does not change."""
    rng = random.Random(5)
    learner = Learner()
    for i in range(1500):
        own, other = rng.uniform(0, 20), rng.choice([0.0, 0.5, rng.uniform(0, 20)])
        _observe(learner, rng, own, other, cross=0.4, noise=0.1)
        if i % 25 == 0:
            learner.model(float(i))
    model = learner.model()
    assert model.pools["standard"].cross > 0.2
    assert model.pools["speculative"].cross == 0.0
    quiet = model.predict("speculative", "chat", 100, 100, 0.0, other_load=0.0)
    loaded = model.predict("speculative", "chat", 100, 100, 0.0, other_load=10.0)
    assert quiet is not None and loaded is not None
    assert loaded.e2e_s == quiet.e2e_s
    # ten requests on the standard pool, each slowed by e^cross - 1 ~ cross for as long as this one runs
    extra = model.pools["standard"].cross * 10.0 * loaded.e2e_s
    assert loaded.cost_s - quiet.cost_s == pytest.approx(extra, rel=1e-9)
    # the speculative pool already busy: one more request there changes nothing for the standard pool
    busy_quiet, busy_loaded = (model.predict("speculative", "chat", 100, 100, 4.0, other_load=o) for o in (0.0, 10.0))
    assert busy_quiet is not None and busy_loaded is not None
    assert busy_loaded.cost_s == busy_quiet.cost_s


def test_declared_shared_device_starts_from_the_prior_before_any_spread() -> None:
    learner = Learner(shared_device=True)
    rng = random.Random(0)
    for _ in range(50):  # both pools always busy: no spread in the other's busyness, nothing to learn from
        _observe(learner, rng, 10.0, 10.0, cross=0.5, noise=0.1)
    model = learner.model()
    assert model.pools["standard"].cross == pytest.approx(SHARED_PRIOR)
    assert model.other_cross  # so the policy's one-device step may act at once
    undeclared = Learner()
    for _ in range(50):
        _observe(undeclared, rng, 10.0, 10.0, cross=0.5, noise=0.1)
    assert undeclared.model().pools["standard"].cross == 0.0 and not undeclared.model().other_cross


@pytest.mark.parametrize("seed", range(3))
def test_declared_shared_device_learns_the_factor_from_the_prior(seed: int) -> None:
    rng = random.Random(seed)
    learner = Learner(shared_device=True)
    for i in range(1500):
        own = rng.uniform(0, 20)
        other = max(0.0, own * 0.5 + rng.uniform(-6, 6))
        _observe(learner, rng, own, other, cross=0.3, noise=0.2)  # the truth: 1.35x, not the prior's 2x
        if i % 25 == 0:
            learner.model(float(i))
    fit = learner.model().pools["standard"]
    assert fit.cross_fit is not None
    assert 0.2 < fit.cross < SHARED_PRIOR - 0.2  # the data moved it most of the way from log 2 to 0.3


def test_a_declared_term_keeps_what_it_learned_while_the_data_cannot_tell() -> None:
    cross = Cross(used=0.4, last_declared=True)
    assert cross.refresh(declared=True) == 0.4
    assert Cross().refresh(declared=True) == pytest.approx(SHARED_PRIOR)
    assert Cross().refresh(declared=False) == 0.0
