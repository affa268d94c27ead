from __future__ import annotations

import pytest

from gateway.decide import decide
from gateway.features import RequestFeatures
from gateway.rules import parse_rules, reference_rules
from gateway.snapshot import SPECULATIVE, STANDARD, PoolSnapshot, Snapshot

RULES = reference_rules()  # the static table; the shipped rules.yaml's `fastest` is in tests/adaptive


def feats(max_tokens: int = 256, task: str = "chat", headers: dict[str, str] | None = None) -> RequestFeatures:
    return RequestFeatures("m", max_tokens, 100, task, False, 1, None, headers or {})


def snap(qps: float = 0.0, standard: int = 1, speculative: int = 1, **pool: float) -> Snapshot:
    return Snapshot(
        pools={
            STANDARD: PoolSnapshot(STANDARD, standard, 1),
            SPECULATIVE: PoolSnapshot(SPECULATIVE, speculative, 1, **pool),  # type: ignore[arg-type]
        },
        qps=qps,
    )


REFERENCE = [
    # (max_tokens, task, qps, pool, reason)
    (49, "code", 0, STANDARD, "short-output"),
    (50, "code", 0, SPECULATIVE, "draft-friendly-task"),
    (50, "chat", 0, STANDARD, "default"),
    (256, "translation", 20, SPECULATIVE, "draft-friendly-task"),
    (256, "translation", 20.5, STANDARD, "high-load"),
    (256, "translation", 21, STANDARD, "high-load"),
    (256, "summarization", 0, SPECULATIVE, "draft-friendly-task"),
    (256, "code", 0, SPECULATIVE, "draft-friendly-task"),
    (256, "chat", 0, STANDARD, "default"),
    (10, "chat", 50, STANDARD, "short-output"),
]


@pytest.mark.parametrize(
    ("max_tokens", "task", "qps", "pool", "reason"), REFERENCE, ids=[f"{m}-{t}-qps{q}" for m, t, q, *_ in REFERENCE]
)
def test_reference_policy(max_tokens: int, task: str, qps: float, pool: str, reason: str) -> None:
    decision = decide(feats(max_tokens, task), snap(qps), RULES)
    assert (decision.pool, decision.reason) == (pool, reason)
    assert not decision.fallback


def test_fallback_when_the_chosen_pool_is_down() -> None:
    decision = decide(feats(task="code"), snap(speculative=0), RULES)
    assert decision.pool == STANDARD
    assert decision.fallback and decision.rule == "draft-friendly-task"
    assert "fallback: speculative unavailable" in decision.reason


def test_fallback_to_speculative_when_standard_is_down() -> None:
    decision = decide(feats(task="chat"), snap(standard=0), RULES)
    assert (decision.pool, decision.fallback) == (SPECULATIVE, True)


def test_no_pool_up_keeps_the_choice() -> None:
    decision = decide(feats(task="chat"), snap(standard=0, speculative=0), RULES)
    assert (decision.pool, decision.fallback) == (STANDARD, False)


def test_header_pins_a_pool() -> None:
    decision = decide(feats(10, headers={"x-specgate-pool": "speculative"}), snap(), RULES)
    assert (decision.pool, decision.rule) == (SPECULATIVE, "pinned-speculative")


CUSTOM = parse_rules(
    {
        "rules": [
            {"name": "spec-queue", "when": {"pools": {"speculative": {"waiting": {"gt": 8}}}}, "pool": "standard"},
            {
                "name": "low-accept",
                "when": {"pools": {"speculative": {"acceptance_rate": {"lt": 0.4}}}},
                "pool": "standard",
            },
            {
                "name": "kv-full",
                "when": {"pools": {"speculative": {"kv_cache_usage": {"ge": 0.95}}}},
                "pool": "standard",
            },
            {"name": "busy-cluster", "when": {"signals": {"cluster_waiting": {"gt": 100}}}, "pool": "standard"},
            {"name": "tenant", "when": {"headers": {"X-Tenant": "batch"}, "model": "m"}, "pool": "standard"},
            {"name": "streams", "when": {"stream": False, "prompt_tokens": {"le": 1000}}, "pool": "speculative"},
        ],
        "default_pool": "standard",
    }
)


@pytest.mark.parametrize(
    ("pool_state", "signals", "headers", "rule"),
    [
        ({"waiting": 9.0}, {}, {}, "spec-queue"),
        ({"waiting": 8.0}, {}, {}, "streams"),
        ({"acceptance_rate": 0.3}, {}, {}, "low-accept"),
        ({"acceptance_rate": 0.6}, {}, {}, "streams"),
        ({"kv_cache_usage": 0.97}, {}, {}, "kv-full"),
        ({}, {"cluster_waiting": 101.0}, {}, "busy-cluster"),
        ({}, {"cluster_waiting": 100.0}, {}, "streams"),
        ({}, {}, {"x-tenant": "batch"}, "tenant"),
    ],
)
def test_conditions_on_live_state(
    pool_state: dict[str, float], signals: dict[str, float], headers: dict[str, str], rule: str
) -> None:
    base = snap(**pool_state)
    snapshot = Snapshot(pools=base.pools, qps=0, signals=signals)
    assert decide(feats(headers=headers), snapshot, CUSTOM).rule == rule


def test_unknown_values_match_nothing() -> None:
    # No acceptance figure yet (never scraped): the low-acceptance rule must not fire.
    assert decide(feats(), snap(), CUSTOM).rule == "streams"


def test_decide_is_deterministic_over_many_requests() -> None:
    snapshot = snap(qps=5)
    first = [decide(feats(m, t), snapshot, RULES) for m in range(1, 200) for t in ("code", "chat", "translation")]
    second = [decide(feats(m, t), snapshot, RULES) for m in range(1, 200) for t in ("code", "chat", "translation")]
    assert first == second


def test_compiled_checks_name_real_fields() -> None:
    from dataclasses import fields

    from gateway.rules import POOL_FIELDS, REQUEST_FIELDS, PoolCondition
    from gateway.snapshot import PoolSnapshot

    assert set(POOL_FIELDS) == set(PoolCondition.model_fields)
    assert set(POOL_FIELDS) <= {f.name for f in fields(PoolSnapshot)}
    assert set(REQUEST_FIELDS) | {"stream"} <= {f.name for f in fields(RequestFeatures)}
    # every `when` field is compiled into some check
    when = (
        parse_rules(
            {
                "rules": [
                    {
                        "name": "all",
                        "pool": "standard",
                        "when": {
                            "max_tokens": 1,
                            "prompt_tokens": 1,
                            "task": "chat",
                            "model": "m",
                            "n": 1,
                            "temperature": 0,
                            "stream": True,
                            "qps": 1,
                            "headers": {"a": "b"},
                            "signals": {"s": 1},
                            "pools": {"speculative": dict.fromkeys(POOL_FIELDS, 1)},
                        },
                    }
                ]
            }
        )
        .rules[0]
        .when
    )
    assert len(when.checks) == len(REQUEST_FIELDS) + 1 + 1 + 1 + 1 + len(POOL_FIELDS)
