"""``specgate simulate --speculative-k learned``: the speculative pool's k table as a gateway would suggest it.

Per profile, before the measured runs: the adaptive policy serves a day's worth of traffic in miniature, a
ramp from the run's lowest level up to its busiest and back (twice ``--duration``; its own arrivals, on a seed
none of the measured runs uses), with the speculative pool at its fixed ``k``, as a deployment would before an
operator adopts a table; ``specgate backends suggest-k``'s rule (:mod:`gateway.adaptive.suggest_k`) then reads
that gateway's learned model. The measured runs use the
table on specgate's speculative pool, and the one-pool baselines the same table (as with any table).
"""

from __future__ import annotations

from backends.emulator.profiles import Profile
from backends.emulator.scenarios import capacity_qps, make_scenario_arrivals, ramp
from backends.emulator.simulate import Simulation
from backends.workloads.loader import Workload
from gateway.adaptive.learner import Learner
from gateway.adaptive.suggest_k import KSuggestion, suggest_k
from gateway.adaptive.views import model_view
from gateway.rules import RoutingRules

SEED_OFFSET = 10_000  # the learning run's seed: the first measured seed plus this


def learned_table(
    profile: Profile, workload: Workload, adaptive: RoutingRules, low: float, top: float, duration_s: float,
    seed: int, replicas: int = 1,
) -> KSuggestion:  # fmt: skip
    """What the gateway suggests after a ramp from ``low`` to ``top`` (shares of one pool's capacity) and back
    over ``2 x duration_s``."""
    truth = workload.with_model(profile.acceptance_model)
    peak = top * capacity_qps(profile, truth)
    arrivals = make_scenario_arrivals(truth, ramp(peak, 2.0 * duration_s, min(low / top, 1.0)), seed + SEED_OFFSET,
                                      adaptive)  # fmt: skip
    knobs = adaptive.adaptive
    learner = Learner(knobs.learning_rate, knobs.stale_s, knobs.shared_device)
    Simulation(profile, adaptive, seed + SEED_OFFSET, learner, replicas=replicas).run(arrivals)
    now = arrivals[-1].at_s
    view = model_view(learner.model(now), adaptive, now, warm=True)
    return suggest_k(view, profile.speculative.num_speculative_tokens, replicas, replicas)
