"""``fastest`` in decide(): pure, warm-up by the rules, pins first, SLO headroom, bounded exploration."""

from __future__ import annotations

import dataclasses
import random

import pytest

from gateway.adaptive.learner import Learner, Observation
from gateway.adaptive.model import LatencyModel
from gateway.decide import decide
from gateway.features import RequestFeatures
from gateway.rules import default_rules, parse_rules
from gateway.snapshot import SPECULATIVE, STANDARD, PoolSnapshot, Snapshot, pool_load

RULES = default_rules()  # pins, then `fastest`, then the reference rules as the warm-up policy


def feats(task: str = "chat", max_tokens: int = 256, draw: float = 0.5, **extra: object) -> RequestFeatures:
    headers = extra.pop("headers", {})
    return RequestFeatures("m", max_tokens, 100, task, False, 1, None, headers, draw=draw, **extra)  # type: ignore[arg-type]


def trained(spec_tpot: float, std_tpot: float, samples: int = 200, spec_ttft: float = 0.05) -> LatencyModel:
    """A model that saw both pools at load 0..4 with the given times per output token (200 tokens each)."""
    learner = Learner()
    rng = random.Random(0)
    for _ in range(samples):
        for pool, tpot, ttft in (("speculative", spec_tpot, spec_ttft), ("standard", std_tpot, 0.05)):
            load = rng.randint(0, 4)
            learner.observe(Observation(pool, "chat", 100, load, ttft, ttft + 199 * tpot, 200, at_s=1.0))
    return learner.model(1.0)


def snap(model: LatencyModel | None, spec_running: float = 0, std_running: float = 0, **spec: object) -> Snapshot:
    return Snapshot(
        pools={
            STANDARD: PoolSnapshot(STANDARD, 1, 1, running=std_running, waiting=0),
            SPECULATIVE: PoolSnapshot(SPECULATIVE, 1, 1, running=spec_running, waiting=0, **spec),  # type: ignore[arg-type]
        },
        model=model,
    )


def test_with_no_samples_the_rules_below_fastest_decide() -> None:
    for model in (None, trained(0.01, 0.03, samples=5)):  # 5 < min_samples (20)
        code = decide(feats("code"), snap(model), RULES)
        expected = (SPECULATIVE, "draft-friendly-task (warm-up)", "draft-friendly-task")
        assert (code.pool, code.reason, code.rule) == expected
        chat = decide(feats("chat"), snap(model), RULES)
        assert (chat.pool, chat.reason) == (STANDARD, "default (warm-up)")
        assert code.learning and chat.learning and not chat.predictions


def test_a_warm_model_picks_the_faster_pool_and_explains_it() -> None:
    model = trained(spec_tpot=0.01, std_tpot=0.03)
    decision = decide(feats("chat"), snap(model), RULES)  # the reference rules would say standard
    assert (decision.pool, decision.reason, decision.rule) == (SPECULATIVE, "fastest", "learned")
    assert decision.predicted is not None and decision.predicted.pool == SPECULATIVE
    by_pool = {p.pool: p for p in decision.predictions}
    assert by_pool[SPECULATIVE].e2e_s < by_pool[STANDARD].e2e_s / 2
    assert by_pool[SPECULATIVE].low_s < by_pool[SPECULATIVE].e2e_s < by_pool[SPECULATIVE].high_s
    slower = decide(feats("code"), snap(trained(spec_tpot=0.04, std_tpot=0.02)), RULES)
    assert slower.pool == STANDARD  # the reference rules would say speculative


def test_pins_beat_fastest() -> None:
    model = trained(spec_tpot=0.01, std_tpot=0.03)
    pinned = decide(feats(headers={"x-specgate-pool": "standard"}), snap(model), RULES)
    assert (pinned.pool, pinned.reason) == (STANDARD, "pinned-standard")


def test_decide_is_pure_same_inputs_same_decision() -> None:
    model = trained(spec_tpot=0.02, std_tpot=0.021)
    snapshot = snap(model, spec_running=3)
    for draw in (0.0, 0.01, 0.3, 0.5, 0.99):
        features = feats(draw=draw)
        assert decide(features, snapshot, RULES) == decide(features, snapshot, RULES)


def test_near_balance_the_draw_splits_traffic_between_the_pools() -> None:
    model = trained(spec_tpot=0.02, std_tpot=0.0205)
    pools = [decide(feats(draw=i / 1000), snap(model), RULES).pool for i in range(1000)]
    share = pools.count(SPECULATIVE) / len(pools)
    assert 0.3 < share < 0.9, share  # a split, not everything to the marginally faster pool
    clear = trained(spec_tpot=0.01, std_tpot=0.03)
    pools = [decide(feats(draw=i / 1000), snap(clear), RULES).pool for i in range(1000)]
    assert pools.count(SPECULATIVE) >= 980


def test_exploration_is_bounded_by_its_share_and_only_for_uncertain_pools() -> None:
    model = trained(spec_tpot=0.01, std_tpot=0.03)
    # "summarization" was never seen: its prediction rests on too few samples, so it may be explored.
    decisions = [decide(feats("summarization", draw=i / 10_000), snap(model), RULES) for i in range(10_000)]
    explored = [d for d in decisions if d.explored]
    assert explored and len(explored) <= 0.02 * len(decisions)
    assert all(d.pool == STANDARD and d.reason == "fastest: explore" for d in explored)
    known = [decide(feats("chat", draw=i / 10_000), snap(model), RULES) for i in range(10_000)]
    assert not any(d.explored for d in known)  # chat is well known on both pools and fresh


def test_a_stale_pool_is_explored() -> None:
    model = trained(spec_tpot=0.01, std_tpot=0.03)
    stale = dataclasses.replace(model, built_s=1.0 + RULES.adaptive.stale_s + 1)
    assert decide(feats("chat", draw=0.001), snap(stale), RULES).explored


def test_exploration_during_warm_up_and_never_with_an_slo() -> None:
    assert decide(feats("chat", draw=0.001), snap(None), RULES).pool == SPECULATIVE
    assert decide(feats("chat", draw=0.5), snap(None), RULES).pool == STANDARD
    slo = feats("chat", draw=0.001, slo_e2e_ms=10_000.0)
    assert decide(slo, snap(None), RULES).pool == STANDARD
    assert not decide(feats("chat", draw=0.001, slo_e2e_ms=1e6), snap(trained(0.01, 0.03)), RULES).explored


def test_slo_headers_choose_the_pool_with_most_headroom() -> None:
    # speculative: fast per token but slow to start; standard: quick first token, slower tokens
    model = trained(spec_tpot=0.01, std_tpot=0.02, spec_ttft=0.6)
    e2e = decide(feats(), snap(model), RULES)
    assert e2e.pool == SPECULATIVE
    ttft_slo = decide(feats(slo_ttft_ms=300.0), snap(model), RULES)
    assert (ttft_slo.pool, ttft_slo.reason) == (STANDARD, "fastest: slo")
    objective = decide(feats(objective="ttft"), snap(model), RULES)
    assert objective.pool == STANDARD
    impossible = decide(feats(slo_ttft_ms=1.0), snap(model), RULES)  # nobody meets it: the fastest
    assert impossible.pool == SPECULATIVE and impossible.reason == "fastest"


def test_load_counts_the_gateways_own_requests_since_the_scrape() -> None:
    pool = PoolSnapshot(SPECULATIVE, 1, 1, running=10, waiting=2, inflight=9, inflight_base=5)
    assert pool_load(Snapshot(pools={SPECULATIVE: pool}), SPECULATIVE) == 16
    assert pool_load(Snapshot(pools={SPECULATIVE: pool}, gateways=3), SPECULATIVE) == 24
    unscraped = PoolSnapshot(SPECULATIVE, 1, 1, inflight=7)
    assert pool_load(Snapshot(pools={SPECULATIVE: unscraped}), SPECULATIVE) == 7


def test_a_loaded_pool_sends_requests_to_the_other() -> None:
    learner = Learner()
    for load in range(0, 60):
        for _ in range(5):
            # speculative: fast when idle, far slower per token under load; standard: flat
            spec_tpot = 0.01 * (1 + load / 6)
            learner.observe(Observation("speculative", "chat", 100, load, 0.05, 0.05 + 199 * spec_tpot, 200))
            learner.observe(Observation("standard", "chat", 100, load, 0.05, 0.05 + 199 * 0.03, 200))
    model = learner.model()
    assert decide(feats(), snap(model, spec_running=0), RULES).pool == SPECULATIVE
    assert decide(feats(), snap(model, spec_running=50), RULES).pool == STANDARD


@pytest.mark.parametrize("default_pool", ["fastest"])
def test_default_pool_fastest_warms_up_on_the_warmup_pool(default_pool: str) -> None:
    rules = parse_rules({"default_pool": default_pool, "adaptive": {"warmup_pool": "speculative"}})
    assert rules.uses_fastest
    cold = decide(feats(), snap(None), rules)
    assert (cold.pool, cold.reason) == (SPECULATIVE, "default (warm-up)")
    warm = decide(feats(), snap(trained(0.04, 0.01)), rules)
    assert (warm.pool, warm.reason) == (STANDARD, "fastest")


def test_fastest_is_rejected_where_a_real_pool_is_needed() -> None:
    from gateway.errors import RulesError

    with pytest.raises(RulesError, match=r"adaptive\.explore_share"):
        parse_rules({"adaptive": {"explore_share": 0.5}})
    with pytest.raises(RulesError, match="objective"):
        parse_rules({"objective": "throughput"})
