"""``fastest`` in decide(): pure, warm-up by the rules, pins first, SLO headroom, bounded exploration."""

from __future__ import annotations

import dataclasses
import random

import pytest

from gateway.adaptive.learner import Learner, Observation
from gateway.adaptive.model import LatencyModel
from gateway.adaptive.policy import MEMO_LIMIT, predictions, unseen_share
from gateway.decide import decide, replica_worth
from gateway.features import RequestFeatures
from gateway.pools import request_blocks
from gateway.rules import default_rules, parse_rules
from gateway.snapshot import SPECULATIVE, STANDARD, PoolSnapshot, Snapshot, other_pool, pool_load

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
    for model in (None, trained(0.01, 0.03, samples=3)):  # 3 < min_samples (5)
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


def shares(snapshot: Snapshot) -> float:
    """The speculative pool's share of 1,000 requests with evenly spread draws."""
    pools = [decide(feats(draw=i / 1000), snapshot, RULES).pool for i in range(1000)]
    return pools.count(SPECULATIVE) / len(pools)


def others(model: LatencyModel, gateways: int = 1, own: int = 0) -> Snapshot:
    """Both pools running 5 requests as last scraped, ``own`` of them (per pool) this gateway's."""
    pools = {
        name: PoolSnapshot(name, 1, 1, running=5, waiting=0, inflight=own, inflight_base=own)
        for name in (STANDARD, SPECULATIVE)
    }
    return Snapshot(pools=pools, model=model, gateways=gateways)


def test_near_balance_the_draw_splits_traffic_between_replicas_that_cannot_see_each_other() -> None:
    model = trained(spec_tpot=0.02, std_tpot=0.0205)
    share = shares(others(model))  # the engines run requests this gateway did not send
    assert 0.3 < share < 0.9, share  # a split, not everything to the marginally faster pool
    assert 0.3 < shares(snap(model, spec_running=None)) < 0.9  # type: ignore[arg-type]  # no engine stats
    clear = trained(spec_tpot=0.01, std_tpot=0.03)
    assert shares(others(clear)) >= 0.98


def test_a_gateway_that_sent_every_request_on_the_pools_picks_the_cheaper_one() -> None:
    """Its own bookings move the loads it reads at once, so it cannot herd: no split, the cheaper pool."""
    model = trained(spec_tpot=0.02, std_tpot=0.0205)
    assert shares(snap(model)) == 1.0  # idle pools, nothing unseen
    assert shares(others(model, own=5)) == 1.0  # all five on each pool are its own
    slower = trained(spec_tpot=0.0205, std_tpot=0.02)
    assert shares(others(slower, own=5)) == 0.0


def test_the_split_grows_with_the_share_of_requests_this_gateway_did_not_send() -> None:
    model = trained(spec_tpot=0.02, std_tpot=0.0205)
    mostly_own, half, none_own = (shares(others(model, own=own)) for own in (4, 2, 0))
    assert 1.0 > mostly_own > half > none_own > 0.5, (mostly_own, half, none_own)
    assert unseen_share(others(model, own=2)) == pytest.approx(0.6)
    # replicas known to be several (Redis) split at least as much as their count says, whatever they sent
    assert unseen_share(others(model, gateways=4, own=5)) == pytest.approx(0.75)
    assert shares(others(model, gateways=2, own=5)) < 0.9


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


def test_a_segment_unseen_on_a_pool_for_stale_s_is_explored_there_though_the_pool_is_fresh() -> None:
    learner = Learner(forget_s=RULES.adaptive.stale_s)
    rng = random.Random(0)
    models = {}
    for i in range(400):  # both pools see chat at first; after 100 s only the speculative pool does
        at = float(i)
        load = rng.randint(0, 4)
        learner.observe(Observation(SPECULATIVE, "chat", 100, load, 0.05, 0.05 + 199 * 0.01, 200, at_s=at))
        segment = "chat" if at < 100 else "code"  # the standard pool stays busy with code: the pool is fresh
        learner.observe(Observation(STANDARD, segment, 100, load, 0.05, 0.05 + 199 * 0.03, 200, at_s=at))
        models[i] = learner.model(at)
    # 150 s: chat last seen on the standard pool 51 s ago; 399 s: 300 s ago, past stale_s (120 s)
    assert not decide(feats("chat", draw=0.001), snap(models[150]), RULES).explored
    explored = decide(feats("chat", draw=0.001), snap(models[399]), RULES)
    assert (explored.pool, explored.reason, explored.explored) == (STANDARD, "fastest: explore", True)
    assert decide(feats("chat", draw=0.5), snap(models[399]), RULES).pool == SPECULATIVE  # past the share
    assert models[399].pools[STANDARD].last_observed_s == 399.0  # the pool-level check alone would not explore


def test_a_segment_back_on_a_pool_after_a_long_absence_relearns_quickly() -> None:
    """Its cell's weight fell while unseen, so the first observations after the absence move it further."""
    offsets = {}
    for forget in (None, RULES.adaptive.stale_s):
        learner = Learner(forget_s=forget)
        for i in range(100):  # chat on the standard pool, 0.03 s per token, for 100 s
            learner.observe(Observation(STANDARD, "chat", 100, 1, 0.05, 0.05 + 199 * 0.03, 200, at_s=float(i)))
            learner.observe(Observation(STANDARD, "code", 100, 1, 0.05, 0.05 + 199 * 0.03, 200, at_s=float(i)))
        for i in range(100, 700):  # then only code for 600 s
            learner.observe(Observation(STANDARD, "code", 100, 1, 0.05, 0.05 + 199 * 0.03, 200, at_s=float(i)))
        for i in range(700, 705):  # chat comes back, now twice as fast per token there
            learner.observe(Observation(STANDARD, "chat", 100, 1, 0.05, 0.05 + 199 * 0.015, 200, at_s=float(i)))
        offsets[forget] = learner.model(705.0).pools[STANDARD].tpot_offsets["chat"].value
    # the truth moved chat's offset by log(0.5) = -0.69 against code; remembering all of the old 20 samples
    # moves it a fifth of the way in 5 observations; fading them (e^-4: 600 s unseen, 480 s past stale_s)
    # nearly all the way
    assert offsets[None] > -0.25
    assert offsets[RULES.adaptive.stale_s] < -0.5


def test_a_segment_seen_within_stale_s_keeps_all_its_samples() -> None:
    learner = Learner(forget_s=RULES.adaptive.stale_s)
    for i in range(40):
        learner.observe(Observation(STANDARD, "chat", 100, 1, 0.05, 0.05 + 199 * 0.03, 200, at_s=float(i)))
    learner.observe(Observation(STANDARD, "code", 100, 1, 0.05, 0.05 + 199 * 0.03, 200, at_s=100.0))
    learner.observe(Observation(STANDARD, "chat", 100, 1, 0.05, 0.05 + 199 * 0.03, 200, at_s=150.0))  # 111 s gap
    assert learner.model(150.0).pools[STANDARD].tpot_offsets["chat"].weight == 20.0  # the cap: nothing faded


@pytest.mark.parametrize("n", [1, 3])
def test_the_decision_learns_against_the_chosen_pools_load_without_the_requests_extra_choices(n: int) -> None:
    """The load a fastest decision records (what its outcome is learned against) is ``pool_load`` of the pool
    that answers, read once for the prediction; ``n - 1`` extra choices count in the prediction only."""
    model = trained(spec_tpot=0.01, std_tpot=0.03)
    for spec_running, std_running in ((0, 0), (7, 2), (40, 1)):
        snapshot = snap(model, spec_running, std_running)
        decision = decide(dataclasses.replace(feats("chat"), n=n), snapshot, RULES)
        assert decision.rule == "learned"
        assert decision.load == pool_load(snapshot, decision.pool)
        assert decision.other_load == pool_load(snapshot, other_pool(decision.pool))  # what a cross term reads
        assert decision.predicted is not None and decision.predicted.load == decision.load + n - 1
    down = dataclasses.replace(snap(model, 0, 5), pools={
        STANDARD: PoolSnapshot(STANDARD, 1, 1, running=5, waiting=0),
        SPECULATIVE: PoolSnapshot(SPECULATIVE, 0, 1, running=0, waiting=0),  # no healthy replica
    })  # fmt: skip
    fallback = decide(dataclasses.replace(feats("chat"), n=n), down, RULES)
    assert fallback.fallback and fallback.pool == STANDARD and fallback.load == pool_load(down, STANDARD)


def test_predictions_are_remembered_per_model_and_only_for_the_same_question() -> None:
    model = trained(spec_tpot=0.02, std_tpot=0.03)
    snapshot = snap(model, spec_running=3)
    first = predictions(feats(), snapshot, RULES)
    assert predictions(feats(draw=0.9), snapshot, RULES) is first  # the draw is not part of the question
    fresh = dataclasses.replace(model)  # the same model with an empty memo: computed anew, the same answer
    assert fresh.memo == {} and predictions(feats(), snap(fresh, spec_running=3), RULES) == first
    base = feats()
    ttft = RULES.model_copy(update={"objective": "ttft"})
    heavier = RULES.model_copy(update={"adaptive": RULES.adaptive.model_copy(update={"externality": 2.0})})
    for features, spec_running, rules in (  # anything a prediction depends on asks a new question
        (base, 4, RULES), (feats(max_tokens=64), 3, RULES), (feats("code"), 3, RULES), (feats(copy=True), 3, RULES),
        (feats(template="t1"), 3, RULES), (feats(objective="ttft"), 3, RULES), (base, 3, heavier),
        (dataclasses.replace(base, prompt_tokens=5000), 3, RULES), (dataclasses.replace(base, n=2), 3, RULES),
    ):  # fmt: skip
        remembered = len(model.memo)
        again = predictions(features, snap(model, spec_running=spec_running), rules)
        assert len(model.memo) == remembered + 1  # not answered from another question's entry
        assert again == predictions(features, snap(dataclasses.replace(model), spec_running=spec_running), rules)
    # the objective as resolved: the rules file's, or the request's header
    assert predictions(base, snapshot, ttft) is predictions(feats(objective="ttft"), snapshot, RULES)
    for load in range(MEMO_LIMIT + 10):  # bounded: request data keys it
        predictions(feats(), snap(model, spec_running=load), RULES)
    assert 0 < len(model.memo) <= MEMO_LIMIT


def test_while_warming_up_a_request_the_rules_give_the_busier_pool_goes_to_the_other() -> None:
    cold = trained(0.01, 0.03, samples=3)  # 3 < min_samples: warming up
    busy = snap(cold, spec_running=6, std_running=2)
    code = decide(feats("code"), busy, RULES)  # the rules say speculative, which runs more
    assert (code.pool, code.reason, code.rule) == (STANDARD, "draft-friendly-task (warm-up); shorter queue",
                                                   "draft-friendly-task")  # fmt: skip
    assert code.learning and not code.explored and not code.predictions
    assert decide(feats("chat"), busy, RULES).pool == STANDARD  # already the shorter queue: the rules' choice
    even = decide(feats("code"), snap(cold, spec_running=4, std_running=4), RULES)
    assert (even.pool, even.reason) == (SPECULATIVE, "draft-friendly-task (warm-up)")  # equal: the rules decide
    pinned = decide(feats("code", headers={"x-specgate-pool": "speculative"}), busy, RULES)
    assert pinned.pool == SPECULATIVE  # pins are above `fastest`: never balanced
    off = RULES.model_copy(update={"adaptive": RULES.adaptive.model_copy(update={"warmup_balance": False})})
    assert decide(feats("code"), busy, off).pool == SPECULATIVE
    warm = decide(feats("code"), snap(trained(0.01, 0.03), spec_running=6, std_running=2), RULES)
    assert "shorter queue" not in warm.reason  # once warm, the model decides


def test_on_one_device_a_split_gives_way_to_the_pool_best_alone() -> None:
    """Two pools nearly as fast, both busy: on separate hardware the draws split between them; once the model
    learned that they slow each other, every request goes to the pool that would serve it best with all the
    traffic (the other pool drains)."""
    model = trained(spec_tpot=0.0105, std_tpot=0.01)
    apart = snap(model, spec_running=3, std_running=3)
    pools = {name: dataclasses.replace(pool, cross=0.7) for name, pool in model.pools.items()}
    shared = dataclasses.replace(apart, model=dataclasses.replace(model, pools=pools))
    draws = [i / 50 + 0.01 for i in range(50)]
    split = [decide(feats("chat", draw=d), apart, RULES) for d in draws]
    assert {d.pool for d in split} == {STANDARD, SPECULATIVE}
    assert all(d.reason != "fastest: one device" for d in split)
    together = [decide(feats("chat", draw=d), shared, RULES) for d in draws]
    assert {(d.pool, d.reason) for d in together if not d.explored} == {(STANDARD, "fastest: one device")}


# -- the prompt each pool is expected to prefill (features.cached_tokens, from the prefix index) ----------------


def trained_by_prompt(spec_tpot: float, std_tpot: float, samples: int = 200, cached: bool = True) -> LatencyModel:
    """Both pools: the first token after 10 ms plus 0.1 ms per prompt token left to prefill (100 tokens: 20 ms;
    3,000: 310 ms). With ``cached``, the gateway read the expected hit (prefix index) for every request, and
    3,000-token prompts held 0, 1,000 or 2,900 tokens: each pool learns its prefill rate from them."""
    learner = Learner()
    rng = random.Random(0)
    for _ in range(samples):
        for pool, tpot in (("speculative", spec_tpot), ("standard", std_tpot)):
            for prompt, held in ((100, 0), (3000, 0), (3000, 1000), (3000, 2900)):
                if held and not cached:
                    continue
                ttft = 0.01 + 0.0001 * (prompt - held)
                load = rng.randint(0, 4)
                learner.observe(Observation(
                    pool, "chat", prompt, load, ttft, ttft + 199 * tpot, 200, at_s=1.0,
                    cached_tokens=held if cached else None,
                ))  # fmt: skip
    return learner.model(1.0)


def test_each_pool_learns_what_a_cached_prompt_token_saves_and_nothing_without_the_index() -> None:
    model = trained_by_prompt(0.020, 0.021)
    for pool in (STANDARD, SPECULATIVE):
        assert model.pools[pool].prefill_rate == pytest.approx(0.0001, rel=0.25)
        whole = model.predict(pool, "chat", 3000, 256, 0)
        held = model.predict(pool, "chat", 3000, 256, 0, cached=2900)
        least = model.predict(pool, "chat", 100, 256, 0)
        assert whole is not None and held is not None and least is not None
        assert whole.ttft_s == pytest.approx(0.31, rel=0.3) and held.ttft_s < whole.ttft_s / 5
        assert held.ttft_s >= least.ttft_s  # never below a short prompt's first token
    blind = trained_by_prompt(0.020, 0.021, cached=False)
    assert all(pool.prefill_rate == 0.0 for pool in blind.pools.values())


def long_prompt(draw: float = 0.5, **extra: object) -> RequestFeatures:
    return dataclasses.replace(feats(draw=draw, **extra), prompt_tokens=3000)


def test_the_pool_holding_the_history_wins_unless_the_other_gains_more_than_the_re_prefill() -> None:
    """3,000 prompt tokens, 2,900 expected held on the standard pool: leaving it costs ~0.28 s of prefill."""
    held = {STANDARD: 2900, SPECULATIVE: 0}
    close = snap(trained_by_prompt(spec_tpot=0.020, std_tpot=0.021))  # speculation saves ~0.2 s over 200 tokens
    assert decide(long_prompt(), close, RULES).pool == SPECULATIVE  # cache-blind: the faster decode
    stay = decide(long_prompt(cached_tokens=held), close, RULES)
    assert stay.pool == STANDARD and stay.reason == "fastest"
    by_pool = {p.pool: p for p in stay.predictions}
    assert by_pool[STANDARD].ttft_s < by_pool[SPECULATIVE].ttft_s / 5  # the standard pool prefills 100 tokens
    far = snap(trained_by_prompt(spec_tpot=0.010, std_tpot=0.021))  # speculation saves ~2.2 s: worth the move
    assert decide(long_prompt(cached_tokens=held), far, RULES).pool == SPECULATIVE


def test_without_cached_tokens_or_with_none_cached_every_decision_is_as_before() -> None:
    """A request without blocks has no cached tokens (None); one whose blocks no replica holds reads 0 on each
    pool: the same predictions and the same decision for every draw, load, task and prompt size."""
    models = (trained_by_prompt(0.020, 0.021), trained(0.01, 0.03), trained(0.03, 0.02))
    for model in models:
        for spec_running, std_running in ((0, 0), (3, 0), (8, 12), (40, 40)):
            snapshot = snap(model, spec_running=spec_running, std_running=std_running)
            for task in ("chat", "code"):
                for prompt in (10, 300, 1000, 5000):
                    for draw in (0.0, 0.03, 0.4, 0.77, 0.99):
                        plain = dataclasses.replace(feats(task, draw=draw), prompt_tokens=prompt)
                        zero = dataclasses.replace(plain, cached_tokens={STANDARD: 0, SPECULATIVE: 0})
                        model.memo.clear()
                        before = decide(plain, snapshot, RULES)
                        model.memo.clear()
                        assert decide(zero, snapshot, RULES) == before
                        assert predictions(zero, snapshot, RULES) == predictions(plain, snapshot, RULES)


def test_remembered_predictions_are_told_apart_by_each_pools_uncached_prompt() -> None:
    model = trained_by_prompt(0.020, 0.021)
    snapshot = snap(model)
    assert model.pools[STANDARD].prefill_rate > 0
    blind = predictions(long_prompt(), snapshot, RULES)
    held = predictions(long_prompt(cached_tokens={STANDARD: 2900, SPECULATIVE: 0}), snapshot, RULES)
    assert blind != held and predictions(long_prompt(), snapshot, RULES) is blind  # each its own memo entry


def test_the_replica_choice_is_priced_by_the_model_the_decision_read() -> None:
    """``replica_worth``: None without blocks or before the pool has a prefill rate; else the delay one more
    request adds to this one (its prediction) against a block's prefill, as gateway.pools.request_blocks."""
    model = trained_by_prompt(0.020, 0.021)
    snapshot = snap(model, spec_running=4, std_running=4)
    blocks = tuple(range(1, 11))  # ten 512-byte blocks
    request = long_prompt(blocks=blocks, prefix_bytes=5120)
    decision = decide(request, snapshot, RULES)
    predicted = decision.predicted
    assert predicted is not None and predicted.per_request_s > 0
    expected = request_blocks(predicted.per_request_s, model.pools[decision.pool].prefill_rate, 2, 3000, 5120)
    assert replica_worth(decision, request, snapshot, RULES, 2) == pytest.approx(expected)
    assert replica_worth(decide(long_prompt(), snapshot, RULES), long_prompt(), snapshot, RULES, 2) is None
    blind = snap(trained_by_prompt(0.020, 0.021, cached=False), spec_running=4, std_running=4)
    assert replica_worth(decide(request, blind, RULES), request, blind, RULES, 2) is None


def test_a_fresh_learner_takes_the_prefill_rate_the_others_learned() -> None:
    learner = Learner()
    for pool, tpot in (("speculative", 0.020), ("standard", 0.021)):
        for i in range(200):
            held = (0, 1000, 2900)[i % 3]
            ttft = 0.01 + 0.0001 * (3000 - held)
            learner.observe(Observation(pool, "chat", 3000, i % 4, ttft, ttft + 199 * tpot, 200, cached_tokens=held))
    exported = learner.export()
    assert exported["standard|prefill|-|-"][0] == pytest.approx(0.1, rel=0.25)  # seconds per 1,000 tokens
    fresh = Learner()
    fresh.absorb(exported)
    assert fresh.model().pools["standard"].prefill_rate == pytest.approx(learner.model().pools["standard"].prefill_rate)
