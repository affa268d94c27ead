"""Arrival processes for the simulator: steady Poisson load, a ramp, a task-mix shift, an acceptance drift.

Each scenario draws prompts from the shipped workload, turns each into the gateway's features with the
gateway's own ``extract_features`` (and a seeded uniform draw per request, as the gateway makes one per
request), and keeps the ground truth the engines serve. Load levels are given as shares of one pool's
capacity (:func:`capacity_qps`), so every profile is evaluated from light to beyond saturation.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backends.emulator.policies import PolicySet, after_warmup, run_policies
from backends.emulator.profiles import Profile
from backends.emulator.simulate import Arrival, RequestResult
from backends.emulator.timing import TimingModel
from backends.workloads.loader import Workload, WorkloadItem
from gateway.features import Classifier, RequestFeatures, extract_features
from gateway.rules import RoutingRules

STEADY, RAMP, MIX_SHIFT, DRIFT = "steady", "ramp", "mix-shift", "drift"
SCENARIOS = (STEADY, RAMP, MIX_SHIFT, DRIFT)
STREAM_SHARE = 0.5  # of simulated requests that stream
DRIFT_ACCEPTANCE = 0.3  # what the drifting task's acceptance collapses to (from ~0.8)
LOAD_SHARES = (0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0, 1.25, 1.5, 1.75, 2.0)


def capacity_qps(profile: Profile, workload: Workload) -> float:
    """Requests per second one standard pool sustains with a full batch: ``max_num_seqs`` requests decoding
    together, each for the workload's mean output length, plus their prefills."""
    model = TimingModel(profile, speculative=False)
    batch = profile.max_num_seqs
    mean_out = statistics.fmean(min(i.output_tokens, i.max_tokens) for i in workload.items)
    mean_prompt = statistics.fmean(i.prompt_tokens for i in workload.items)
    per_request_s = mean_out * model.step_s(batch) / batch + profile.step.prefill_s_per_token * mean_prompt
    return 1.0 / per_request_s


@dataclass(frozen=True, slots=True)
class Scenario:
    """How arrivals come: a rate over time, a task mix over time, and acceptance drift."""

    name: str
    duration_s: float
    rate: Callable[[float], float]  # requests per second at time t
    peak_rate: float
    mix: Callable[[float], dict[str, float]] | None = None  # task weights at time t; None: uniform over items
    drift_task: str | None = None
    drift_at_s: float = math.inf


def steady(qps: float, duration_s: float) -> Scenario:
    return Scenario(STEADY, duration_s, lambda t: qps, qps)


def ramp(peak: float, duration_s: float, low_share: float = 0.1) -> Scenario:
    """Load rising linearly from ``low_share * peak`` to ``peak`` over the first half, then back down."""

    def rate(t: float) -> float:
        phase = 1.0 - abs(2.0 * t / duration_s - 1.0)
        return peak * (low_share + (1.0 - low_share) * phase)

    return Scenario(RAMP, duration_s, rate, peak)


def mix_shift(qps: float, duration_s: float, workload: Workload) -> Scenario:
    """The first half mostly the tasks with the lowest acceptance, the second mostly those with the highest."""
    ranked = _tasks_by_acceptance(workload)
    low, high = ranked[: len(ranked) // 2], ranked[len(ranked) // 2 :]

    def mix(t: float) -> dict[str, float]:
        heavy = low if t < duration_s / 2 else high
        return {task: (4.0 if task in heavy else 1.0) for task in ranked}

    return Scenario(MIX_SHIFT, duration_s, lambda t: qps, qps, mix=mix)


def drift(qps: float, duration_s: float, workload: Workload) -> Scenario:
    """Mid-run, the task with the highest acceptance collapses to ``DRIFT_ACCEPTANCE`` (a new draft model,
    a changed prompt template): the learner must notice and move that task."""
    task = _tasks_by_acceptance(workload)[-1]
    return Scenario(DRIFT, duration_s, lambda t: qps, qps, drift_task=task, drift_at_s=duration_s / 2)


def _tasks_by_acceptance(workload: Workload) -> list[str]:
    by_task: dict[str, list[float]] = {}
    for item in workload.items:
        by_task.setdefault(item.task, []).append(item.acceptance)
    return sorted(by_task, key=lambda task: statistics.fmean(by_task[task]))


def make_scenario_arrivals(workload: Workload, scenario: Scenario, seed: int, rules: RoutingRules) -> list[Arrival]:
    """Arrivals by thinning a Poisson process at the peak rate; prompts drawn by the scenario's mix."""
    rng = random.Random(f"{seed}:{scenario.name}:{scenario.peak_rate}")
    classifier = Classifier(rules, read_content=True)
    by_task: dict[str, list[WorkloadItem]] = {}
    for item in workload.items:
        by_task.setdefault(item.task, []).append(item)
    arrivals: list[Arrival] = []
    now = 0.0
    while True:
        now += rng.expovariate(scenario.peak_rate)
        if now >= scenario.duration_s:
            return arrivals
        if rng.random() * scenario.peak_rate > scenario.rate(now):
            continue
        item = _pick(rng, workload, by_task, scenario.mix(now) if scenario.mix else None)
        features = request_features(item, rng, rules, classifier)
        acceptance = item.acceptance
        if item.task == scenario.drift_task and now >= scenario.drift_at_s:
            acceptance = DRIFT_ACCEPTANCE
        arrivals.append(Arrival(len(arrivals), now, item, features, acceptance))


def _pick(
    rng: random.Random, workload: Workload, by_task: dict[str, list[WorkloadItem]], mix: dict[str, float] | None
) -> WorkloadItem:
    if mix is None:
        return rng.choice(workload.items)
    tasks = list(mix)
    task = rng.choices(tasks, weights=[mix[t] for t in tasks])[0]
    return rng.choice(by_task[task])


def request_features(
    item: WorkloadItem, rng: random.Random, rules: RoutingRules, classifier: Classifier
) -> RequestFeatures:
    """The gateway's features of one request. Half the requests stream (a chat UI), half do not (API calls):
    for those the gateway learns only the whole reply's time, as it would in a deployment."""
    body = item.request_body("emulated", stream=rng.random() < STREAM_SHARE)
    return extract_features(body, "chat", {}, rules, classifier, draw=rng.random())


def make_arrivals(workload: Workload, qps: float, count: int, seed: int, rules: RoutingRules) -> list[Arrival]:
    """``count`` Poisson arrivals at ``qps``, prompts drawn uniformly from the workload."""
    rng = random.Random(f"{seed}:{qps}")
    classifier = Classifier(rules, read_content=True)
    arrivals, now = [], 0.0
    for index in range(count):
        now += rng.expovariate(qps)
        item = rng.choice(workload.items)
        features = request_features(item, rng, rules, classifier)
        arrivals.append(Arrival(index, now, item, features, item.acceptance))
    return arrivals


def simulate_level(
    profile: Profile,
    workload: Workload,
    rules: RoutingRules,
    qps: float,
    duration_s: float,
    seed: int,
    warmup_s: float = 10.0,
    adaptive: RoutingRules | None = None,
    **options: float,
) -> dict[str, list[RequestResult]]:
    """Every policy at one steady load level, on the same arrivals, for ``duration_s`` of virtual arrivals.

    ``rules`` is the reference policy; ``adaptive`` (optional) the rules with ``fastest``. Requests that
    arrive in the first ``warmup_s`` load the pools but are left out of the results (the pools are filling
    then; the adaptive policy's cold start is shown by its learning curve instead).
    """
    arrivals = make_arrivals(workload, qps, max(1, round(qps * duration_s)), seed, rules)
    results = run_policies(profile, arrivals, PolicySet(rules, adaptive), seed, **options)  # type: ignore[arg-type]
    return after_warmup(results, min(warmup_s, arrivals[-1].at_s / 2))


def learning_curve(
    adaptive: Sequence[RequestResult], bound: Sequence[RequestResult], window: int = 100
) -> list[tuple[int, float]]:
    """Per window of ``window`` requests (in arrival order): adaptive mean latency / the bound's mean latency
    on the same requests. The bound (clairvoyant) carries the load's noise, so the ratio shows the learning."""
    curve = []
    for start in range(0, len(adaptive) - window + 1, window):
        ours = statistics.fmean(r.latency_s for r in adaptive[start : start + window])
        theirs = statistics.fmean(r.latency_s for r in bound[start : start + window])
        curve.append((start + window, ours / theirs))
    return curve


def requests_to_learn(
    curve: Sequence[tuple[int, float]],
    tolerance: float = 0.10,
    since: int = 0,
    span: int = 3,
    steady_ratio: float | None = None,
) -> int | None:
    """Requests (counted from ``since``: the start, or a drift) after which the adaptive policy is within
    ``tolerance`` of its steady state: the first window end ``n`` such that the mean ratio over the next
    ``span`` windows is at most ``(1 + tolerance)`` x the steady ratio. None when it never gets there.

    ``steady_ratio`` is given when the curve's bound is the steady state itself (the cold run against a warm
    run on the same arrivals: 1.0). Without it the steady ratio is the median over the run's last third,
    which assumes that third is settled and as loaded as the rest (a scenario after its drift)."""
    ratios = [ratio for _, ratio in curve]
    if steady_ratio is None:
        tail = ratios[len(ratios) * 2 // 3 :]
        if not tail:
            return None
        steady_ratio = statistics.median(tail)
    ends = [end for end, _ in curve]
    for i, end in enumerate(ends):
        start = end - (ends[1] - ends[0] if len(ends) > 1 else end)
        if start < since or i + span > len(ratios):
            continue
        if statistics.fmean(ratios[i : i + span]) <= steady_ratio * (1 + tolerance):
            return start - since
    return None
