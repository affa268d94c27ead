"""Virtual-time simulation: the gateway's own ``decide()`` routing a workload between two emulated pools.

No HTTP and no sleeping: a Poisson arrival process draws prompts from the shipped workload, each arrival is
turned into the gateway's :class:`RequestFeatures` by the gateway's ``extract_features`` (so the gateway's
classifier's mistakes count), routed by ``decide(features, snapshot, rules)`` against a snapshot of the
emulated engines, and served by the same :class:`Engine` the emulator server runs. Deterministic for a seed.

Policies: ``always-standard`` and ``always-speculative`` are rules with no rule and that default pool (so they
too go through ``decide()``); ``rules`` is the shipped reference policy (or ``--rules FILE``); ``oracle`` is a
hindsight bound, not a schedulable policy: each request's better latency of its always-standard and its
always-speculative run at the same load.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.emulator.profiles import Profile
from backends.emulator.timing import Engine, EngineRequest, StepOutcome, TimingModel
from backends.workloads.loader import Workload, WorkloadItem
from gateway.decide import decide
from gateway.features import Classifier, RequestFeatures, extract_features
from gateway.qps import LocalQps
from gateway.rules import RoutingRules
from gateway.snapshot import POOL_NAMES, SPECULATIVE, STANDARD, PoolSnapshot, Snapshot

ALWAYS_STANDARD = "always-standard"
ALWAYS_SPECULATIVE = "always-speculative"
RULES = "rules"
ORACLE = "oracle"
POLICIES = (ALWAYS_STANDARD, ALWAYS_SPECULATIVE, RULES, ORACLE)


@dataclass(frozen=True, slots=True)
class Arrival:
    index: int
    at_s: float
    item: WorkloadItem
    features: RequestFeatures


@dataclass(frozen=True, slots=True)
class RequestResult:
    index: int
    item_id: str
    task: str  # ground truth
    classified_task: str  # what the gateway's classifier said
    pool: str
    reason: str
    arrival_s: float
    acceptance: float
    output_tokens: int
    ttft_s: float
    latency_s: float


def fixed_pool_rules(base: RoutingRules, pool: str) -> RoutingRules:
    """The base rules' task cues and defaults, no rules, and ``pool`` as the default: a fixed policy."""
    return base.model_copy(update={"rules": (), "default_pool": pool})


def make_arrivals(workload: Workload, qps: float, count: int, seed: int, rules: RoutingRules) -> list[Arrival]:
    """``count`` Poisson arrivals at ``qps``, prompts drawn uniformly from the workload."""
    rng = random.Random(f"{seed}:{qps}")
    classifier = Classifier(rules)
    arrivals, now = [], 0.0
    for index in range(count):
        now += rng.expovariate(qps)
        item = rng.choice(workload.items)
        features = extract_features(item.request_body("emulated"), "chat", {}, rules, classifier)
        arrivals.append(Arrival(index, now, item, features))
    return arrivals


@dataclass(eq=False)
class _Pool:
    engine: Engine
    step_end_s: float = math.inf
    outcome: StepOutcome | None = None

    def start_step(self, now: float) -> None:
        self.outcome = self.engine.step()
        self.step_end_s = now + self.outcome.duration_s

    def snapshot(self, name: str) -> PoolSnapshot:
        counters = self.engine.counters
        acceptance = counters.accepted_tokens / counters.draft_tokens if counters.draft_tokens else None
        length = 1 + counters.accepted_tokens / counters.drafts if counters.drafts else None
        return PoolSnapshot(
            name,
            healthy_replicas=1,
            total_replicas=1,
            running=self.engine.num_running,
            waiting=self.engine.num_waiting,
            kv_cache_usage=self.engine.kv_usage,
            acceptance_rate=acceptance,
            acceptance_length=length,
            stats_age_s=0.0,
        )


@dataclass(eq=False)
class _Progress:
    arrival: Arrival
    pool: str
    reason: str
    request: EngineRequest
    first_token_s: float | None = None


@dataclass
class Simulation:
    """One policy (as rules for ``decide()``) against two fresh emulated pools."""

    profile: Profile
    rules: RoutingRules
    seed: int = 0
    _pools: dict[str, _Pool] = field(init=False)
    _qps: LocalQps = field(init=False, default_factory=LocalQps)

    def __post_init__(self) -> None:
        self._pools = {
            name: _Pool(Engine(TimingModel(self.profile, name == SPECULATIVE), random.Random(f"{self.seed}:{name}")))
            for name in POOL_NAMES
        }

    def run(self, arrivals: Sequence[Arrival]) -> list[RequestResult]:
        live: dict[EngineRequest, _Progress] = {}
        results: list[RequestResult] = []
        pending = list(arrivals)
        position = 0
        while position < len(pending) or any(p.outcome is not None for p in self._pools.values()):
            next_arrival = pending[position].at_s if position < len(pending) else math.inf
            pool = min(self._pools.values(), key=lambda candidate: candidate.step_end_s)
            if next_arrival <= pool.step_end_s:
                self._admit(pending[position], live)
                position += 1
            else:
                self._finish_step(pool, live, results)
        return sorted(results, key=lambda result: result.index)

    def _admit(self, arrival: Arrival, live: dict[EngineRequest, _Progress]) -> None:
        self._qps.record(arrival.at_s)
        snapshot = Snapshot(
            pools={name: pool.snapshot(name) for name, pool in self._pools.items()},
            qps=self._qps.rate(arrival.at_s),
            qps_age_s=0.0,
        )
        decision = decide(arrival.features, snapshot, self.rules)
        item = arrival.item
        request = EngineRequest(
            request_id=str(arrival.index),
            prompt_tokens=item.prompt_tokens,
            output_tokens=min(item.output_tokens, item.max_tokens),
            acceptance=item.acceptance,
            finish_reason="length" if item.max_tokens < item.output_tokens else "stop",
        )
        pool = self._pools[decision.pool]
        pool.engine.add(request)
        live[request] = _Progress(arrival, decision.pool, decision.reason, request)
        if pool.outcome is None:
            pool.start_step(arrival.at_s)

    def _finish_step(self, pool: _Pool, live: dict[EngineRequest, _Progress], results: list[RequestResult]) -> None:
        now, outcome = pool.step_end_s, pool.outcome
        assert outcome is not None
        for emission in outcome.emissions:
            progress = live[emission.request]
            if progress.first_token_s is None:
                progress.first_token_s = now
            if emission.finished:
                results.append(_result(live.pop(emission.request), now))
        pool.outcome, pool.step_end_s = None, math.inf
        if pool.engine.has_work:
            pool.start_step(now)


def _result(progress: _Progress, finished_s: float) -> RequestResult:
    arrival = progress.arrival
    first = progress.first_token_s if progress.first_token_s is not None else finished_s
    return RequestResult(
        index=arrival.index,
        item_id=arrival.item.id,
        task=arrival.item.task,
        classified_task=arrival.features.task,
        pool=progress.pool,
        reason=progress.reason,
        arrival_s=arrival.at_s,
        acceptance=arrival.item.acceptance,
        output_tokens=progress.request.generated,
        ttft_s=first - arrival.at_s,
        latency_s=finished_s - arrival.at_s,
    )


def oracle(standard: Sequence[RequestResult], speculative: Sequence[RequestResult]) -> list[RequestResult]:
    """Per request, the better of its two fixed-policy outcomes (a hindsight bound)."""
    best = []
    for on_standard, on_speculative in zip(standard, speculative, strict=True):
        assert on_standard.index == on_speculative.index
        winner = on_standard if on_standard.latency_s <= on_speculative.latency_s else on_speculative
        best.append(dataclasses.replace(winner, reason="oracle"))
    return best


def simulate_level(
    profile: Profile,
    workload: Workload,
    rules: RoutingRules,
    qps: float,
    duration_s: float,
    seed: int,
    warmup_s: float = 10.0,
) -> dict[str, list[RequestResult]]:
    """All four policies at one load level, on the same arrivals, for ``duration_s`` of virtual arrivals.

    Requests that arrive in the first ``warmup_s`` load the pools but are left out of the results (the
    gateway's 10-second QPS window is still filling then).
    """
    arrivals = make_arrivals(workload, qps, max(1, round(qps * duration_s)), seed, rules)
    runs = {
        ALWAYS_STANDARD: fixed_pool_rules(rules, STANDARD),
        ALWAYS_SPECULATIVE: fixed_pool_rules(rules, SPECULATIVE),
        RULES: rules,
    }
    results = {policy: Simulation(profile, policy_rules, seed).run(arrivals) for policy, policy_rules in runs.items()}
    results[ORACLE] = oracle(results[ALWAYS_STANDARD], results[ALWAYS_SPECULATIVE])
    cutoff = min(warmup_s, arrivals[-1].at_s / 2)
    return {policy: [r for r in runs_ if r.arrival_s >= cutoff] for policy, runs_ in results.items()}
