"""The routing decision: a pure function of the request's features, a snapshot and the rules.

No I/O, no clock reads, no randomness: the same inputs always give the same :class:`Decision`, so the
HTTP gateway, the tests and the simulator all run exactly this code.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.features import RequestFeatures
from gateway.rules import RoutingRules, When
from gateway.snapshot import Snapshot, other_pool


@dataclass(frozen=True, slots=True)
class Decision:
    pool: str
    reason: str  # the rule's name, "default", plus a fallback note when the chosen pool was down
    rule: str | None  # the matching rule's name, or None for the default pool
    fallback: bool = False


def decide(features: RequestFeatures, snapshot: Snapshot, rules: RoutingRules) -> Decision:
    pool, rule_name = rules.default_pool, None
    for rule in rules.rules:
        if matches(rule.when, features, snapshot):
            pool, rule_name = rule.pool, rule.name
            break
    reason = rule_name or "default"
    if not snapshot.pool(pool).available:
        alternative = other_pool(pool)
        if snapshot.pool(alternative).available:
            return Decision(alternative, f"{reason}; fallback: {pool} unavailable", rule_name, fallback=True)
    return Decision(pool, reason, rule_name)


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
