"""The routing decision: a pure function of the request's features, a snapshot and the rules.

No I/O, no clock reads, no randomness: the same inputs always give the same :class:`Decision`, so the
HTTP gateway, the tests and the simulator all run exactly this code. A rule (or the default) whose pool is
``fastest`` asks the learned model (:mod:`gateway.adaptive.policy`); while the model is warming up that rule
does not match and the rules below it decide, exploring a small share of requests on the other pool, and
(``adaptive.warmup_balance``) sending a request the rules give to the busier pool to the other one.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.adaptive.model import Prediction, prediction_for
from gateway.adaptive.policy import choose_fastest, explore_during_warmup
from gateway.features import RequestFeatures
from gateway.pools import request_blocks
from gateway.rules import RoutingRules, When
from gateway.snapshot import Snapshot, other_pool, pool_load


@dataclass(slots=True)  # not frozen: made per request, and a frozen __init__ costs ~2x; never mutated
class Decision:
    pool: str
    reason: str  # the rule's name, "default", plus a fallback note when the chosen pool was down
    rule: str | None  # the matching rule's name, or None for the default pool
    fallback: bool = False
    predictions: tuple[Prediction, ...] = ()  # both pools' predictions when `fastest` decided
    explored: bool = False  # sent to the other pool to keep its model current
    learning: bool = False  # the rules route by the model: the outcome is worth learning from
    load: float = 0.0  # the chosen pool's load as the decision saw it (what the outcome is learned against)
    other_load: float = 0.0  # the other pool's, likewise (what a cross term is learned against)

    def __init__(
        self, pool: str, reason: str, rule: str | None, fallback: bool = False,
        predictions: tuple[Prediction, ...] = (), explored: bool = False, learning: bool = False, load: float = 0.0,
        other_load: float = 0.0,
    ) -> None:  # fmt: skip
        # written out: see RequestFeatures.__init__
        self.pool, self.reason, self.rule, self.fallback, self.predictions = pool, reason, rule, fallback, predictions
        self.explored, self.learning, self.load, self.other_load = explored, learning, load, other_load

    @property
    def predicted(self) -> Prediction | None:
        return prediction_for(self.predictions, self.pool)


def decide(features: RequestFeatures, snapshot: Snapshot, rules: RoutingRules) -> Decision:
    pool, rule_name = rules.default_pool, None
    warming = False
    for rule in rules.rules:
        if matches(rule.when, features, snapshot):
            if rule.pool == "fastest":
                choice = choose_fastest(features, snapshot, rules)
                if choice is None:
                    warming = True
                    continue  # warming up: the rules below decide
                return _checked(choice.pool, choice.reason, rule.name, snapshot, choice.predictions, choice.explored,
                                extra=features.n - 1)  # fmt: skip
            pool, rule_name = rule.pool, rule.name
            break
    else:
        if pool == "fastest":
            choice = choose_fastest(features, snapshot, rules)
            if choice is not None:
                return _checked(choice.pool, choice.reason, None, snapshot, choice.predictions, choice.explored,
                                extra=features.n - 1)  # fmt: skip
            pool, warming = rules.adaptive.warmup_pool, True
    reason = rule_name or "default"
    if warming and rules.adaptive.warmup_balance:
        # load-blind rules could pile a warm-up into overload onto one pool; until the model knows each pool's
        # speed, a request goes where fewer requests are (the faster pool drains its queue sooner, so takes more)
        other = other_pool(pool)
        if pool_load(snapshot, pool) > pool_load(snapshot, other):
            return _checked(other, f"{reason} (warm-up); shorter queue", rule_name, snapshot, (), False)
    if warming:
        if explore_during_warmup(features, snapshot, rules, pool):
            return _checked(other_pool(pool), f"{reason} (warm-up); explore", rule_name, snapshot, (), True)
        reason = f"{reason} (warm-up)"
    return _checked(pool, reason, rule_name, snapshot, (), False, learning=rules.uses_fastest)


def replica_worth(
    decision: Decision, features: RequestFeatures, snapshot: Snapshot, rules: RoutingRules, replicas: int
) -> float | None:  # fmt: skip
    """:func:`gateway.pools.request_blocks` for the decided pool: how many of the request's cached blocks one more
    request in flight on a replica is worth to it, priced by the model the decision read (None without blocks,
    without the model's prediction, or where the pool has no learned prefill rate yet)."""
    predicted = decision.predicted
    model = snapshot.model
    if not features.blocks or predicted is None or model is None:
        return None
    found = model.pools.get(decision.pool)
    if found is None:
        return None
    return request_blocks(
        predicted.per_request_s, found.prefill_rate, replicas, features.prompt_tokens, features.prefix_bytes,
        rules.adaptive.externality,
    )  # fmt: skip


def _checked(
    pool: str, reason: str, rule: str | None, snapshot: Snapshot, predictions: tuple[Prediction, ...],
    explored: bool, learning: bool = True, extra: int = 0,
) -> Decision:  # fmt: skip
    """The decision, or the other pool when this one has no healthy replica (both serve the same model).
    ``extra``: what the predictions added to each pool's load for this request (``n - 1``)."""
    fallback = False
    if not snapshot.pool(pool).available:
        alternative = other_pool(pool)
        if snapshot.pool(alternative).available:
            pool, reason, fallback = alternative, f"{reason}; fallback: {pool} unavailable", True
    load = other_load = 0.0
    if learning:  # both pools' loads were read once already, for their predictions
        predicted = prediction_for(predictions, pool)
        load = predicted.load - extra if predicted is not None else pool_load(snapshot, pool)
        alternative = other_pool(pool)
        predicted = prediction_for(predictions, alternative)
        other_load = predicted.load - extra if predicted is not None else pool_load(snapshot, alternative)
    return Decision(pool, reason, rule, fallback, predictions, explored, learning, load, other_load)


def matches(when: When, features: RequestFeatures, snapshot: Snapshot) -> bool:
    """All of ``when``'s conditions hold. Only the conditions the rule sets are evaluated."""
    for source, key, field, test in when.checks:
        if source == "request":
            value = getattr(features, key)
        elif source == "qps":
            value = snapshot.qps
        elif source == "header":
            value = features.headers.get(key)
        elif source == "signal":
            value = snapshot.signals.get(key)
        else:
            value = getattr(snapshot.pool(key), field)
        if not test(value):
            return False
    return True
