"""An evaluation's units of work (one load level or one scenario, for one profile and one seed) and how they
run: one after another, or spread over worker processes. Each unit builds its own arrivals and engines from
its seed, so the figures do not depend on how many workers ran them or in which order they finished."""

from __future__ import annotations

import dataclasses
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

from backends.emulator.evaluate import Level, Options, ScenarioRun, evaluate_level, evaluate_scenario
from backends.emulator.policies import PolicySet
from backends.emulator.profiles import Profile
from backends.emulator.session_sim import DEFAULT_THINK_S, SessionLevel, evaluate_sessions
from backends.workloads.loader import Workload
from backends.workloads.sessions import SessionSet
from gateway.rules import RoutingRules


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything one profile's evaluation runs."""

    profile: Profile
    workload: Workload
    policies: PolicySet
    shares: tuple[float, ...]
    seeds: tuple[int, ...]
    scenarios: tuple[str, ...] = ()
    scenario_share: float = 0.7
    scenario_duration_s: float = 240.0
    options: Options = field(default_factory=Options)
    sessions: SessionSet | None = None  # a session workload: its levels run the session policies instead
    think_s: float = DEFAULT_THINK_S  # mean think time between a session's turns
    prefix_caching: bool = True  # the engines' prefix caches, for session workloads

    def jobs(self) -> Iterator[Job]:
        for seed in self.seeds:
            yield from (Job(self, seed, share=share) for share in self.shares)
            yield from (Job(self, seed, scenario=name) for name in self.scenarios)


@dataclass(frozen=True, slots=True)
class Job:
    plan: Plan
    seed: int
    share: float | None = None  # a load level, or
    scenario: str | None = None  # a scenario at the plan's scenario share

    def run(self) -> Level | ScenarioRun | SessionLevel:
        plan = self.plan
        if plan.sessions is not None and self.share is not None:
            return evaluate_sessions(
                plan.profile, plan.sessions, plan.policies, self.share, self.seed, plan.options, plan.think_s,
                plan.prefix_caching,
            )  # fmt: skip
        if self.scenario is not None:
            return evaluate_scenario(
                self.scenario, plan.profile, plan.workload, plan.policies, plan.scenario_share,
                plan.scenario_duration_s, self.seed, plan.options,
            )  # fmt: skip
        assert self.share is not None
        return evaluate_level(plan.profile, plan.workload, plan.policies, self.share, self.seed, plan.options)

    @property
    def label(self) -> str:
        what = self.scenario if self.scenario is not None else f"{self.share:.0%} load"
        return f"{self.plan.profile.name}: {what}, seed {self.seed}"


def _portable(plan: Plan) -> Plan:
    """The plan with its rules rebuilt from their fields: rules that have routed carry compiled closures
    (cached properties), which do not pickle."""

    def fresh(rules: RoutingRules | None) -> RoutingRules | None:
        return None if rules is None else RoutingRules.model_validate(rules.model_dump(by_alias=True))

    reference = fresh(plan.policies.reference)
    assert reference is not None
    return dataclasses.replace(plan, policies=PolicySet(reference, fresh(plan.policies.adaptive)))


Result = Level | ScenarioRun | SessionLevel


def _run(job: Job) -> Result:
    return job.run()


def run_jobs(jobs: Sequence[Job], workers: int = 1, done: Callable[[Job], None] | None = None) -> list[Result]:
    """Every job's result, in the jobs' order; ``done`` is told of each as it finishes (a progress bar).
    With more than one worker the jobs run in that many processes (spawned: no fork of a threaded parent)."""
    results: list[Result | None] = [None] * len(jobs)
    if workers <= 1 or len(jobs) <= 1:
        for index, job in enumerate(jobs):
            results[index] = job.run()
            if done is not None:
                done(job)
    else:
        context = multiprocessing.get_context("spawn")
        portable = {id(job.plan): _portable(job.plan) for job in jobs}
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
            futures = {
                pool.submit(_run, dataclasses.replace(job, plan=portable[id(job.plan)])): index
                for index, job in enumerate(jobs)
            }
            for future in as_completed(futures):
                index = futures[future]
                results[index] = future.result()
                if done is not None:
                    done(jobs[index])
    return [result for result in results if result is not None]


def by_seed(plan: Plan, results: Sequence[Result]) -> tuple[list[list[Level]], list[list[ScenarioRun]]]:
    """The results of ``plan.jobs()`` as per seed, its levels (in the plan's order) and its scenario runs."""
    levels = [[r for r in results if isinstance(r, Level) and r.seed == seed] for seed in plan.seeds]
    runs = [[r for r in results if isinstance(r, ScenarioRun) and r.seed == seed] for seed in plan.seeds]
    return levels, runs


def session_levels(plan: Plan, results: Sequence[Result]) -> list[list[SessionLevel]]:
    """The results of a session plan's jobs, per seed, its levels in the plan's order."""
    return [[r for r in results if isinstance(r, SessionLevel) and r.seed == seed] for seed in plan.seeds]
