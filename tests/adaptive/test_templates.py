"""What the learner keeps per system-prompt template: each template's acceptance within its segment, shrunk
to the segment's for a template seen a few times, bounded in number, shared, and used by ``fastest``."""

from __future__ import annotations

import math
import random

import pytest

from backends.emulator.profiles import load_profile
from backends.emulator.timing import TimingModel, expected_tokens_per_step
from gateway.adaptive import cells as cells_module
from gateway.adaptive.learner import Learner, Observation
from gateway.adaptive.model import LatencyModel, template_key
from gateway.adaptive.views import model_view
from gateway.decide import decide
from gateway.features import RequestFeatures
from gateway.rules import default_rules
from gateway.snapshot import SPECULATIVE, STANDARD, PoolSnapshot, Snapshot

PROFILE = load_profile("a100-70b-draft")
STANDARD_MODEL = TimingModel(PROFILE, speculative=False)
SPECULATIVE_MODEL = TimingModel(PROFILE, speculative=True)
# two applications in one segment: an editor that copies most of its input, a writer that copies little
TEMPLATES = {"editor": 0.92, "writer": 0.30}


def tpot(pool: str, acceptance: float) -> float:
    model = SPECULATIVE_MODEL if pool == SPECULATIVE else STANDARD_MODEL
    return model.time_per_output_token_s(1, acceptance)


def trained(with_acceptance: bool) -> LatencyModel:
    return taught(with_acceptance).model(1.0)


def taught(with_acceptance: bool, count: int = 1200, seed: int = 3) -> Learner:
    learner = Learner(learning_rate=0.05)
    rng = random.Random(seed)
    for _ in range(count):
        pool = rng.choice((STANDARD, SPECULATIVE))
        template = rng.choice(list(TEMPLATES))
        per_token = tpot(pool, TEMPLATES[template]) * math.exp(rng.gauss(0, 0.05))
        acceptance = None
        if with_acceptance and pool == SPECULATIVE:
            acceptance = expected_tokens_per_step(TEMPLATES[template], SPECULATIVE_MODEL.k)
        learner.observe(Observation(pool, "code", 100, 0, 0.05, 0.05 + 199 * per_token, 200, acceptance,
                                    at_s=1.0, template=template))  # fmt: skip
    return learner


@pytest.mark.parametrize("with_acceptance", [True, False], ids=["per-request-acceptance", "timing-only"])
def test_each_template_is_predicted_at_its_own_speed_within_one_segment(with_acceptance: bool) -> None:
    model = trained(with_acceptance)
    for template, acceptance in TEMPLATES.items():
        for pool in (STANDARD, SPECULATIVE):
            predicted = model.predict(pool, "code", 100, 256, 0, template=template_key("code", template))
            assert predicted is not None
            assert predicted.tpot_s == pytest.approx(tpot(pool, acceptance), rel=0.12), (template, pool)
    editor = model.predict(SPECULATIVE, "code", 100, 256, 0, template=template_key("code", "editor"))
    writer = model.predict(SPECULATIVE, "code", 100, 256, 0, template=template_key("code", "writer"))
    segment = model.predict(SPECULATIVE, "code", 100, 256, 0)
    unknown = model.predict(SPECULATIVE, "code", 100, 256, 0, template=template_key("code", "never-seen"))
    assert editor is not None and writer is not None and segment is not None and unknown is not None
    assert editor.tpot_s < segment.tpot_s < writer.tpot_s  # the segment's is the mix of both
    assert unknown.tpot_s == segment.tpot_s  # a template never seen: the segment's prediction


def test_fastest_routes_two_templates_of_one_segment_to_different_pools() -> None:
    """Per token at load 0 (a100-70b-draft): the editor runs faster on the speculative pool, the writer
    (acceptance 0.3) slower; the segment alone could send only both one way."""
    assert tpot(SPECULATIVE, TEMPLATES["editor"]) < tpot(STANDARD, 0) < tpot(SPECULATIVE, TEMPLATES["writer"])
    model = trained(with_acceptance=True)
    snapshot = Snapshot(
        pools={name: PoolSnapshot(name, 1, 1, running=0, waiting=0) for name in (STANDARD, SPECULATIVE)},
        model=model,
    )
    rules = default_rules()
    for template, expected in (("editor", SPECULATIVE), ("writer", STANDARD)):
        features = RequestFeatures("m", 256, 100, "code", False, 1, None, {}, draw=0.5, template=template)
        decision = decide(features, snapshot, rules)
        assert (decision.pool, decision.reason) == (expected, "fastest"), template


def test_a_template_seen_once_moves_the_prediction_a_little() -> None:
    learner = Learner(learning_rate=0.05)
    for i in range(200):
        learner.observe(Observation(SPECULATIVE, "code", 100, 0, 0.05, 0.05 + 199 * 0.01, 200, 3.0, at_s=1.0,
                                    template=f"t{i % 20}"))  # fmt: skip
    learner.observe(Observation(SPECULATIVE, "code", 100, 0, 0.05, 0.05 + 199 * 0.02, 200, 1.5, at_s=1.0,
                                template="slow"))  # fmt: skip
    model = learner.model(1.0)
    base = model.predict(SPECULATIVE, "code", 100, 256, 0)
    slow = model.predict(SPECULATIVE, "code", 100, 256, 0, template=template_key("code", "slow"))
    assert base is not None and slow is not None
    # its own residual is log 2 (acceptance 3.0 -> 1.5); one sample of SHRINK counts a quarter of it
    assert slow.tpot_s / base.tpot_s == pytest.approx(2 ** 0.25, rel=0.05)


def test_the_template_table_is_bounded_and_keeps_the_recently_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cells_module, "TEMPLATES", 8)
    learner = Learner()
    for i in range(20):
        for template in ("kept", f"flood-{i}"):
            learner.observe(Observation(STANDARD, "chat", 100, 0, 0.05, 1.0, 100, at_s=1.0, template=template))
    templates = learner._pools[STANDARD].templates
    assert len(templates) == 8
    assert "chat#kept" in templates and "chat#flood-19" in templates and "chat#flood-0" not in templates


def test_a_fresh_learner_takes_the_templates_the_others_learned() -> None:
    warm = taught(with_acceptance=True)
    model = warm.model(1.0)
    exported = warm.export()
    assert any("|tpot|tmpl|" in name for name in exported)
    fresh = Learner(learning_rate=0.05)
    fresh.absorb(exported)
    key = template_key("code", "writer")
    theirs = model.predict(SPECULATIVE, "code", 100, 256, 0, template=key)
    ours = fresh.model(1.0).predict(SPECULATIVE, "code", 100, 256, 0, template=key)
    assert theirs is not None and ours is not None
    assert ours.tpot_s == pytest.approx(theirs.tpot_s, rel=0.02)


def test_the_model_view_counts_the_templates_without_naming_their_prompts() -> None:
    view = model_view(trained(with_acceptance=True), default_rules(), 1.0, True)
    templates = view["pools"][SPECULATIVE]["templates"]
    assert templates["count"] == 2 and templates["by_segment"] == {"code": 2}
    low, high = templates["factor_range"]
    assert low < 1.0 < high  # the editor faster than its segment, the writer slower
