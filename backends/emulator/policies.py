"""The policies ``specgate simulate`` compares, as runs to make: each one's rules and :class:`Simulation` options.

:func:`simulations` says how each policy's run is made (fresh engines, a cold learner; ``adaptive-warm`` and
``perfect-predictor`` first learn from serving warm-up arrivals), :func:`run_policies` runs those asked for on
the same arrivals, :func:`after_warmup` keeps what arrived after the warm-up, and :func:`fixed_pool_rules` is
a fixed policy's rules (``always-standard``, ``always-speculative``, the single-pool baselines). What each
policy is: :mod:`backends.emulator.simulate`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backends.emulator.profiles import Profile, with_dynamic_k
from backends.emulator.simulate import (
    ADAPTIVE,
    ADAPTIVE_WARM,
    ALWAYS_SPECULATIVE,
    ALWAYS_STANDARD,
    BOTH,
    DYNAMIC_POOL,
    MYOPIC,
    PERFECT,
    POLICIES,
    RULES,
    Arrival,
    RequestResult,
    Simulation,
)
from backends.emulator.telemetry import FULL, Telemetry
from gateway.adaptive.learner import Learner
from gateway.rules import RoutingRules
from gateway.snapshot import SPECULATIVE, STANDARD


def fixed_pool_rules(base: RoutingRules, pool: str) -> RoutingRules:
    """The base rules' task cues and defaults, no rules, and ``pool`` as the default: a fixed policy."""
    return base.model_copy(update={"rules": (), "default_pool": pool})


@dataclass(frozen=True, slots=True)
class PolicySet:
    """The rules each policy runs: ``reference`` for ``rules``, ``adaptive`` (with ``fastest``) for ``adaptive``."""

    reference: RoutingRules
    adaptive: RoutingRules | None = None


def run_policies(
    profile: Profile,
    arrivals: Sequence[Arrival],
    policies: PolicySet,
    seed: int,
    *,
    replicas: int = 1,
    scrape_interval_s: float = 1.0,
    gateways: int = 1,
    telemetry: Telemetry = FULL,
    include: Sequence[str] = POLICIES,
    warm_arrivals: Sequence[Arrival] | None = None,
    perfect_knows: str = BOTH,
) -> dict[str, list[RequestResult]]:
    """Every policy in ``include`` on the same arrivals, each against fresh engines (and a cold learner);
    the options are :func:`simulations`'."""
    sims = simulations(
        profile, policies, seed, replicas=replicas, scrape_interval_s=scrape_interval_s, gateways=gateways,
        telemetry=telemetry, warm_arrivals=warm_arrivals, perfect_knows=perfect_knows,
    )  # fmt: skip
    return {name: make().run(arrivals) for name, make in sims.items() if name in include}


def simulations(
    profile: Profile,
    policies: PolicySet,
    seed: int,
    *,
    replicas: int = 1,
    scrape_interval_s: float = 1.0,
    gateways: int = 1,
    telemetry: Telemetry = FULL,
    warm_arrivals: Sequence[Arrival] | None = None,
    perfect_knows: str = BOTH,
) -> dict[str, Callable[[], Simulation]]:
    """How each policy's run is made. With ``warm_arrivals``, ``adaptive-warm`` and ``perfect-predictor``
    first learn from serving them, each on engines of its own and as it routes (without them neither runs:
    a cold bound is no bound); ``perfect-predictor`` reads the engines at every decision and is fed the truth
    ``perfect_knows`` names (each request's acceptance and output length, or one of them, the other estimated
    as the adaptive gateway estimates it)."""

    def sim(
        rules: RoutingRules, at_seed: int = seed, learner: Learner | None = None, *, myopic: bool = False,
        perfect: bool = False,
    ) -> Simulation:  # fmt: skip
        return Simulation(
            profile, rules, at_seed, learner, myopic=myopic, perfect=perfect, perfect_knows=perfect_knows,
            replicas=replicas, gateways=gateways, scrape_interval_s=0.0 if perfect else scrape_interval_s,
            telemetry=telemetry,
        )  # fmt: skip

    reference, adaptive = policies.reference, policies.adaptive
    sims: dict[str, Callable[[], Simulation]] = {
        ALWAYS_STANDARD: lambda: sim(fixed_pool_rules(reference, STANDARD)),
        ALWAYS_SPECULATIVE: lambda: sim(fixed_pool_rules(reference, SPECULATIVE)),
        RULES: lambda: sim(reference),
        MYOPIC: lambda: sim(reference, myopic=True),
        # what users could run instead at equal hardware: no second pool, speculation turned down by batch size
        DYNAMIC_POOL: lambda: Simulation(
            with_dynamic_k(profile), fixed_pool_rules(reference, SPECULATIVE), seed, replicas=replicas,
            layout={SPECULATIVE: 2 * replicas, STANDARD: 0}, scrape_interval_s=scrape_interval_s, gateways=gateways,
            telemetry=telemetry,
        ),
    }
    if adaptive is not None:
        rate, forget, shared = (
            adaptive.adaptive.learning_rate, adaptive.adaptive.stale_s, adaptive.adaptive.shared_device
        )
        sims[ADAPTIVE] = lambda: sim(adaptive, learner=Learner(rate, forget, shared))

        def warm(perfect: bool = False) -> Simulation:
            learner = Learner(rate, forget, shared)
            sim(adaptive, seed + 1, learner, perfect=perfect).run(warm_arrivals or ())
            return sim(adaptive, seed, learner, perfect=perfect)

        if warm_arrivals is not None:
            sims[ADAPTIVE_WARM] = warm
            sims[PERFECT] = lambda: warm(perfect=True)
    return sims


def after_warmup(results: dict[str, list[RequestResult]], cutoff_s: float) -> dict[str, list[RequestResult]]:
    return {policy: [r for r in runs if r.arrival_s >= cutoff_s] for policy, runs in results.items()}
