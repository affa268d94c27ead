"""Pools on one device in the simulator (``Profile.shared_hardware``), and the cross term learned from them."""

from __future__ import annotations

from backends.emulator.policies import fixed_pool_rules
from backends.emulator.profiles import load_profile
from backends.emulator.report import summarise
from backends.emulator.scenarios import make_arrivals
from backends.emulator.simulate import Simulation
from backends.workloads.loader import load_workload
from gateway.adaptive.learner import Learner
from gateway.rules import default_rules, reference_rules

PROFILE = load_profile("a100-70b-draft")
SHARED = PROFILE.model_copy(update={"shared_hardware": 1.0})
WORKLOAD = load_workload()


def test_a_pool_alone_on_shared_hardware_runs_as_fast_as_on_its_own() -> None:
    arrivals = make_arrivals(WORKLOAD, 8, 200, 0, reference_rules())
    for pool in ("standard", "speculative"):
        rules = fixed_pool_rules(reference_rules(), pool)
        assert Simulation(SHARED, rules).run(arrivals) == Simulation(PROFILE, rules).run(arrivals)


def test_pools_on_shared_hardware_slow_each_other_while_both_work() -> None:
    arrivals = make_arrivals(WORKLOAD, 8, 300, 0, reference_rules())
    apart = Simulation(PROFILE, reference_rules()).run(arrivals)
    together = Simulation(SHARED, reference_rules()).run(arrivals)
    assert {r.pool for r in apart} == {"standard", "speculative"}  # the rules use both pools
    assert summarise(together).mean_s > 1.3 * summarise(apart).mean_s


def _cross_terms(profile: object, seed: int) -> dict[str, float]:
    arrivals = make_arrivals(WORKLOAD, 4, 1200, seed, reference_rules())
    learner = Learner()
    Simulation(profile, default_rules(), seed, learner).run(arrivals)  # type: ignore[arg-type]
    return {name: pool.cross for name, pool in learner.model().pools.items()}


def test_the_adaptive_policy_learns_the_cross_term_on_shared_hardware_only() -> None:
    """EMULATED, a100-70b-draft at ~8 % of one pool's capacity: each pool is sometimes idle while the other
    works, which is what tells the two apart (both always busy, as under load, cannot)."""
    for seed in (0, 1):
        assert _cross_terms(PROFILE, seed) == {"standard": 0.0, "speculative": 0.0}
        shared = _cross_terms(SHARED, seed)
        assert max(shared.values()) > 0.2, shared
