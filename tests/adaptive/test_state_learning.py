"""GatewayState.learn queues observations and the snapshot refresh folds them in: the learner ends up exactly
where learning at once would have left it."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from prometheus_client import CollectorRegistry

from gateway.adaptive.learner import Learner, Observation
from gateway.adaptive.model import segment_of
from gateway.config import Settings
from gateway.decide import Decision
from gateway.features import RequestFeatures
from gateway.state import GatewayState

SEGMENTS = (("chat", False), ("code", True), ("summarize", False))


def _state(learn_max_per_s: float = 1e6, registry: CollectorRegistry | None = None) -> GatewayState:
    settings = Settings(
        _env_file=None, standard_urls=["http://127.0.0.1:9"], speculative_urls=["http://127.0.0.1:9"],
        learn_max_per_s=learn_max_per_s,
    )  # fmt: skip
    return GatewayState(settings, registry or CollectorRegistry())


def _outcomes(count: int) -> list[tuple[RequestFeatures, Decision, float, float, int, float | None]]:
    rng = random.Random(3)
    out = []
    for _ in range(count):
        task, copy = rng.choice(SEGMENTS)
        stream = rng.random() < 0.5
        features = RequestFeatures("m", 256, rng.randint(1, 4000), task, stream, 1, None, {}, copy=copy)
        pool = rng.choice(("standard", "speculative"))
        decision = Decision(pool, "fastest", "learned", learning=True, load=float(rng.randint(0, 80)))
        ttft = rng.uniform(0.01, 0.3)
        tokens = rng.randint(1, 400)
        acceptance = rng.uniform(1.0, 3.5) if pool == "speculative" and rng.random() < 0.5 else None
        out.append((features, decision, ttft, ttft + tokens * rng.uniform(0.005, 0.04), tokens, acceptance))
    return out


def _learn_both(state: GatewayState, direct: Learner, count: int) -> None:
    """The same outcomes through the state's queue and straight into ``direct``."""
    for features, decision, ttft, total, tokens, acceptance in _outcomes(count):
        state.learn(features, decision, ttft, total, tokens, "e2e", acceptance=acceptance)
        stamped = state._pending[-1].at_s  # the gateway's clock when the request finished (forgetting reads it)
        direct.observe(Observation(
            decision.pool, segment_of(features.task, features.copy), features.prompt_tokens, decision.load,
            ttft if features.stream else None, total, tokens, acceptance, at_s=stamped,
        ))  # fmt: skip


def test_queued_observations_teach_what_learning_at_once_would() -> None:
    state = _state()
    direct = Learner(state.learner.floor, state.learner.forget_s)
    _learn_both(state, direct, 500)
    assert state.learner.observations == 0  # queued: nothing learned on the request path
    state.refresh_snapshot()
    assert state.learner.observations == 500
    assert state.learner.export() == direct.export()
    assert state.snapshot.model is not None and state.snapshot.model.version == 500


def test_a_stream_without_usage_counts_its_events_with_the_acceptance_of_the_last_refresh() -> None:
    state = _state()
    for features, decision, ttft, total, tokens, acceptance in _outcomes(200):
        state.learn(features, decision, ttft, total, tokens, "e2e", acceptance=acceptance)
    state.refresh_snapshot()
    model = state.snapshot.model
    assert model is not None
    segment, learned = next(
        (seg, a) for seg in ("chat", "code/copy", "summarize")
        if (a := model.acceptance_length("speculative", seg)) is not None
    )  # fmt: skip
    assert learned > 1.0
    task, copy = segment.split("/")[0], segment.endswith("/copy")
    features = RequestFeatures("m", 256, 100, task, True, 1, None, {}, copy=copy)
    decision = Decision("speculative", "fastest", "learned", learning=True, load=3.0)
    for _, earlier, ttft, total, tokens, acceptance in _outcomes(50):  # queued, not folded in before the count
        state.learn(features, earlier, ttft, total, tokens, "e2e", acceptance=acceptance)
    state.learn(features, decision, 0.05, 1.0, 10, "e2e", counted=False)
    assert state.learner.observations == 200  # nothing was folded in on the request path
    assert state._pending[-1].output_tokens == round(1 + 9 * learned)
    state.refresh_snapshot()
    assert state.learner.observations == 251


def test_past_learn_max_per_s_a_stream_without_usage_is_not_learned_either() -> None:
    """A stream without usage used to fold the queue in to read the latest acceptance, so the queue never
    filled and the cap never held for such streams."""
    registry = CollectorRegistry()
    state = _state(learn_max_per_s=40, registry=registry)
    for features, decision, ttft, total, tokens, _ in _outcomes(30):
        state.learn(features, decision, ttft, total, tokens, "e2e", counted=False)
    state.refresh_snapshot()
    assert state.learner.observations == 10
    assert registry.get_sample_value("specgate_unlearned_requests_total") == 20


def test_a_rules_reload_folds_the_queue_in_at_the_old_learning_rate() -> None:
    state = _state()
    direct = Learner(state.learner.floor, state.learner.forget_s)
    _learn_both(state, direct, 100)
    rules = state.ruleset.rules
    state.apply_rules(rules.model_copy(update={"adaptive": rules.adaptive.model_copy(update={"learning_rate": 0.5})}))
    assert state.learner.floor == 0.5
    assert state.learner.export() == direct.export()


def test_past_learn_max_per_s_a_refresh_takes_only_its_share() -> None:
    """learn_max_per_s 40 with the 0.25 s snapshot interval: 10 finished requests a refresh are learned from,
    the rest counted as unlearned (and not checked against their prediction either)."""
    registry = CollectorRegistry()
    state = _state(learn_max_per_s=40, registry=registry)
    outcomes = _outcomes(50)
    for features, decision, ttft, total, tokens, acceptance in outcomes[:30]:
        state.learn(features, decision, ttft, total, tokens, "e2e", acceptance=acceptance)
    state.refresh_snapshot()
    assert state.learner.observations == 10
    assert registry.get_sample_value("specgate_unlearned_requests_total") == 20
    for features, decision, ttft, total, tokens, acceptance in outcomes[30:]:
        state.learn(features, decision, ttft, total, tokens, "e2e", acceptance=acceptance)
    state.refresh_snapshot()
    assert state.learner.observations == 20  # each refresh opens a new share
    assert registry.get_sample_value("specgate_unlearned_requests_total") == 30


def test_what_the_other_pool_was_doing_reaches_the_learner() -> None:
    """A lone gateway learns from its bookings' clock; without one (no booking) from the decision's read of
    the other pool, through ``busy``; with several gateways at least what the decision saw."""
    state = _state()
    features = RequestFeatures("m", 256, 100, "chat", True, 1, None, {})
    decision = Decision("standard", "fastest", "learned", learning=True, load=3.0, other_load=0.5)
    state.learn(features, decision, 0.1, 1.0, 50, "e2e", other_busy=0.25)
    assert state._pending[-1].other_busy == 0.25
    state.learn(features, decision, 0.1, 1.0, 50, "e2e")
    assert state._pending[-1].other_busy == pytest.approx(math.log2(1.5))
    state.snapshot = dataclasses.replace(state.snapshot, gateways=2)
    state.learn(features, decision, 0.1, 1.0, 50, "e2e", other_busy=0.25)
    assert state._pending[-1].other_busy == pytest.approx(math.log2(1.5))
    state.learn(features, decision, 0.1, 1.0, 50, "e2e", other_busy=0.9)
    assert state._pending[-1].other_busy == 0.9


def test_the_rules_declaration_of_one_device_reaches_the_learner_and_a_reload_takes_it_back() -> None:
    state = _state()
    assert state.learner.shared_device is False
    rules = state.ruleset.rules
    declared = rules.model_copy(update={"adaptive": rules.adaptive.model_copy(update={"shared_device": True})})
    state.apply_rules(declared)
    assert state.learner.shared_device is True
    state.apply_rules(rules)
    assert state.learner.shared_device is False


def test_a_prompt_the_decision_read_as_cached_is_learned_with_what_the_pool_was_expected_to_hold() -> None:
    """The whole prompt and, per pool, the tokens the decision expected its replica to hold (what the pool's
    prefill rate learns from); None where the gateway did not read the index for the request."""
    state = _state()
    features = RequestFeatures("m", 256, 3000, "chat", True, 1, None, {}, cached_tokens={"standard": 2900,
                                                                                        "speculative": 0})
    for pool, expected in (("standard", 2900), ("speculative", 0)):
        state.learn(features, Decision(pool, "fastest", "learned", learning=True), 0.05, 1.0, 100, "e2e")
        assert (state._pending[-1].prompt_tokens, state._pending[-1].cached_tokens) == (3000, expected)
    state.learn(dataclasses.replace(features, cached_tokens=None), Decision("standard", "fastest", "learned",
                learning=True), 0.05, 1.0, 100, "e2e")  # fmt: skip
    assert (state._pending[-1].prompt_tokens, state._pending[-1].cached_tokens) == (3000, None)


def test_the_cache_is_read_for_the_decision_only_for_a_request_with_blocks() -> None:
    settings = Settings(
        _env_file=None, standard_urls=["http://127.0.0.1:9", "http://127.0.0.2:9"],
        speculative_urls=["http://127.0.0.1:8"], prefix_index="on",
    )  # fmt: skip
    state = GatewayState(settings, CollectorRegistry())
    plain = RequestFeatures("m", 256, 400, "chat", True, 1, None, {})
    state.see_cache(plain)
    assert plain.cached_tokens is None
    assert state.pools.index is not None
    values = (1 << 41 | 7, 2 << 41 | 8)  # two 512-byte blocks' values (their end offsets above bit 32)
    state.pools.index.record("http://127.0.0.2:9", values)
    held = RequestFeatures("m", 256, 400, "chat", True, 1, None, {}, blocks=values, prefix_bytes=1024)
    state.see_cache(held)
    assert held.cached_tokens == {"standard": 400, "speculative": 0}
