"""The routing decision: a pure function of the request's features, a snapshot and the rules.

No I/O, no clock reads, no randomness: the same inputs always give the same :class:`Decision`, so the
HTTP gateway, the tests and the simulator all run exactly this code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.features import RequestFeatures
from gateway.rules import Comparison, PoolCondition, RoutingRules, Scalar, When
from gateway.snapshot import PoolSnapshot, Snapshot, other_pool


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
    request_checks = (
        (when.max_tokens, features.max_tokens),
        (when.prompt_tokens, features.prompt_tokens),
        (when.task, features.task),
        (when.model, features.model),
        (when.n, features.n),
        (when.temperature, features.temperature),
        (when.qps, snapshot.qps),
    )
    if not all(cmp is None or cmp.matches(value) for cmp, value in request_checks):
        return False
    if when.stream is not None and when.stream != features.stream:
        return False
    if not _all_match(when.headers, features.headers):
        return False
    if not _all_match(when.signals, snapshot.signals):
        return False
    return all(_pool_matches(cond, snapshot.pool(name)) for name, cond in when.pools.items())


def _all_match(conditions: Mapping[str, Comparison], values: Mapping[str, Scalar]) -> bool:
    return all(cmp.matches(values.get(key)) for key, cmp in conditions.items())


def _pool_matches(cond: PoolCondition, pool: PoolSnapshot) -> bool:
    checks = (
        (cond.healthy_replicas, pool.healthy_replicas),
        (cond.running, pool.running),
        (cond.waiting, pool.waiting),
        (cond.kv_cache_usage, pool.kv_cache_usage),
        (cond.acceptance_rate, pool.acceptance_rate),
        (cond.acceptance_length, pool.acceptance_length),
    )
    return all(cmp is None or cmp.matches(value) for cmp, value in checks)
