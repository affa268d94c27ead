"""``specgate simulate``'s evaluation: every policy at each load level and in each scenario, for one seed.

All figures are EMULATED (virtual time against the timing model). A level or a scenario of one seed is the
unit of work (:mod:`backends.emulator.sweep` runs them, :mod:`backends.emulator.targets` judges them over
seeds): measured side by side on the same arrivals, never timed tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backends.emulator.policies import PolicySet, after_warmup, run_policies
from backends.emulator.profiles import Profile
from backends.emulator.report import Summary, shares_per_second, summarise
from backends.emulator.scenarios import (
    DRIFT,
    MIX_SHIFT,
    capacity_qps,
    drift,
    learning_curve,
    make_scenario_arrivals,
    mix_shift,
    ramp,
    requests_to_learn,
    steady,
)
from backends.emulator.simulate import (
    ADAPTIVE,
    ADAPTIVE_WARM,
    ALWAYS_SPECULATIVE,
    ALWAYS_STANDARD,
    BOTH,
    MYOPIC,
    Arrival,
    RequestResult,
)
from backends.emulator.telemetry import FULL, Telemetry
from backends.workloads.loader import Workload


@dataclass(frozen=True, slots=True)
class Options:
    """How every run of one evaluation is set up, beyond its profile, workload, policies and seed."""

    duration_s: float = 90.0  # virtual seconds of arrivals per level
    warmup_s: float = 10.0  # left out of a level's figures (at most a quarter of the level)
    replicas: int = 1  # engines per pool
    scrape_interval_s: float = 1.0
    gateways: int = 1
    telemetry: Telemetry = FULL
    perfect_knows: str = BOTH  # what perfect-predictor is fed (backends/emulator/simulate.py, PERFECT_KNOWS)


@dataclass(frozen=True, slots=True)
class Level:
    share: float  # of one pool's capacity
    qps: float
    seed: int
    summaries: dict[str, Summary]
    explored: float  # share of the adaptive policy's requests sent to explore
    learned_after: int | None  # requests from the cold start until within 10 % of steady state (adaptive-warm)
    windows: int  # learning-curve windows (of 100 requests) the level had
    split: list[tuple[int, float]]  # the cold start's share sent to the speculative pool, second by second

    def over(self, policy: str, bound: str, stat: str = "mean_s") -> float:
        """``policy``'s figure (``mean_s``, ``p95_s``...) over ``bound``'s."""
        return float(getattr(self.summaries[policy], stat)) / float(getattr(self.summaries[bound], stat))

    def vs_best(self, policy: str, stat: str = "mean_s") -> float:
        """``policy``'s figure over the better fixed pool's."""
        return float(getattr(self.summaries[policy], stat)) / self.best_fixed(stat)

    def best_fixed(self, stat: str = "mean_s") -> float:
        return min(float(getattr(self.summaries[pool], stat)) for pool in (ALWAYS_STANDARD, ALWAYS_SPECULATIVE))


@dataclass(frozen=True, slots=True)
class ScenarioRun:
    name: str
    share: float
    qps: float
    seed: int
    summaries: dict[str, Summary]
    curve: list[tuple[int, float]]  # adaptive / myopic mean latency per window of requests
    learned_after: int | None
    relearned_after: int | None  # after the drift point (drift only)
    explored: float


def evaluate_level(
    profile: Profile, workload: Workload, policies: PolicySet, share: float, seed: int, options: Options = Options()
) -> Level:  # fmt: skip
    """Every policy at ``share`` of one pool's capacity, on the same arrivals; the warm policies first
    learn from other arrivals at the same load (``seed + 1``)."""
    qps = capacity_qps(profile, workload) * share
    arrivals = make_scenario_arrivals(workload, steady(qps, options.duration_s), seed, policies.reference)
    earlier = make_scenario_arrivals(workload, steady(qps, options.duration_s), seed + 1, policies.reference)
    results = _run(profile, arrivals, policies, seed, options, warm_arrivals=earlier)
    kept = after_warmup(results, min(options.warmup_s, options.duration_s / 4))
    adaptive = results.get(ADAPTIVE, [])
    return Level(
        share, qps, seed, {policy: summarise(runs) for policy, runs in kept.items()},
        _explored(adaptive), *_settling(adaptive, results), shares_per_second(adaptive),
    )  # fmt: skip


def evaluate_levels(
    profile: Profile, workload: Workload, policies: PolicySet, shares: Sequence[float], seed: int,
    options: Options = Options(),
) -> list[Level]:  # fmt: skip
    return [evaluate_level(profile, workload, policies, share, seed, options) for share in shares]


def evaluate_scenario(
    name: str, profile: Profile, workload: Workload, policies: PolicySet, share: float, duration_s: float, seed: int,
    options: Options = Options(),
) -> ScenarioRun:  # fmt: skip
    """One scenario from a cold start (no warm policies: the scenario is about learning)."""
    qps = capacity_qps(profile, workload) * share
    scenario = {
        "steady": lambda: steady(qps, duration_s),
        "ramp": lambda: ramp(qps, duration_s),
        "mix-shift": lambda: mix_shift(qps, duration_s, workload),
        "drift": lambda: drift(qps, duration_s, workload),
    }[name]()
    arrivals = make_scenario_arrivals(workload, scenario, seed, policies.reference)
    results = _run(profile, arrivals, policies, seed, options)
    adaptive = results[ADAPTIVE]
    curve = learning_curve(adaptive, results[MYOPIC])
    change_s = scenario.drift_at_s if name == DRIFT else duration_s / 2 if name == MIX_SHIFT else None
    change = next((a.index for a in arrivals if change_s is not None and a.at_s >= change_s), None)
    relearned = requests_to_learn(curve, since=change) if change is not None else None
    return ScenarioRun(
        name, share, qps, seed, {policy: summarise(runs) for policy, runs in results.items()}, curve,
        requests_to_learn(curve), relearned, _explored(adaptive),
    )  # fmt: skip


def _run(
    profile: Profile, arrivals: Sequence[Arrival], policies: PolicySet, seed: int, options: Options,
    warm_arrivals: Sequence[Arrival] | None = None,
) -> dict[str, list[RequestResult]]:  # fmt: skip
    return run_policies(
        profile, arrivals, policies, seed, replicas=options.replicas, scrape_interval_s=options.scrape_interval_s,
        gateways=options.gateways, telemetry=options.telemetry, warm_arrivals=warm_arrivals,
        perfect_knows=options.perfect_knows,
    )  # fmt: skip


def _settling(adaptive: Sequence[RequestResult], results: dict[str, list[RequestResult]]) -> tuple[int | None, int]:
    """Requests the cold start took to come within 10 % of steady state, and the windows that was judged on.

    Steady state is the warm run on the same arrivals (``adaptive-warm``: a learner that served earlier
    traffic), window by window, so a busy or a quiet spell of the arrivals weighs on both alike. Without a
    warm run, the cold run's ratio to the myopic reference is read against its own last third."""
    if not adaptive:
        return None, 0
    warm = results.get(ADAPTIVE_WARM)
    if warm:
        curve = learning_curve(adaptive, warm)
        return requests_to_learn(curve, steady_ratio=1.0), len(curve)
    curve = learning_curve(adaptive, results[MYOPIC])
    return requests_to_learn(curve), len(curve)


def _explored(results: Sequence[RequestResult]) -> float:
    return sum(1 for r in results if r.explored) / len(results) if results else 0.0
