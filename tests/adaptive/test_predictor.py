"""The per-request predictor: learns acceptance and output length from content on one system prompt, does
better than the task's mean on requests it never saw, stays bounded, knows what it has not seen, and is
shared through the learner's export."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.adaptive import quality
from gateway.adaptive.content import SLOTS, Content, ContentReader
from gateway.adaptive.learner import Learner, Observation
from gateway.adaptive.predictor import RECENT, Predictor, PredictorModel
from tests.adaptive import synthetic

READER = ContentReader()


def content(user: str, max_tokens: int = 1024) -> Content:
    return READER.read(synthetic.SYSTEM, user, "chat", False, 60, max_tokens)


def taught(count: int = 600, seed: int = 0) -> Predictor:
    rng, predictor = random.Random(seed), Predictor()
    for _ in range(count):
        asked = synthetic.learned(rng)
        length = synthetic.tokens_per_step(asked.acceptance) * math.exp(rng.gauss(0, 0.05))
        predictor.observe(content(asked.user), length, asked.output_tokens)
    return predictor


def test_it_tells_a_transform_from_new_text_on_requests_it_never_saw() -> None:
    """One system prompt, one task: the task's mean cannot tell a rewrite of a pasted passage from a story.
    On unseen topics and phrasings the predictor's acceptance error is well under the task mean's."""
    model = taught().freeze()
    rng = random.Random(7)
    asked = [synthetic.unseen(rng) for _ in range(300)]
    truth = [synthetic.tokens_per_step(r.acceptance) for r in asked]
    mean = statistics.fmean(synthetic.tokens_per_step(synthetic.learned(rng).acceptance) for _ in range(2000))
    predicted = [math.exp(model.absolute(content(r.user))["acc"]) for r in asked]
    error = statistics.fmean(abs(p - t) for p, t in zip(predicted, truth, strict=True))
    task_error = statistics.fmean(abs(mean - t) for t in truth)
    assert error < 0.7 * task_error, (error, task_error)
    transforms = [p for p, r in zip(predicted, asked, strict=True) if r.transform]
    others = [p for p, r in zip(predicted, asked, strict=True) if not r.transform]
    assert min(transforms) > max(others)


def test_it_predicts_longer_answers_for_longer_passages_to_rewrite() -> None:
    model = taught().freeze()
    rng = random.Random(3)
    asked = [synthetic.unseen(rng) for _ in range(200)]
    errors = [abs(model.absolute(content(r.user))["len"] - math.log(r.output_tokens)) for r in asked]
    mean = statistics.fmean(math.log(synthetic.learned(rng).output_tokens) for _ in range(2000))
    task_errors = [abs(mean - math.log(r.output_tokens)) for r in asked]
    assert statistics.fmean(errors) < 0.8 * statistics.fmean(task_errors)


def test_content_never_seen_is_predicted_as_its_segment() -> None:
    """Words of a script the predictor never learned: no deviation from the segment beyond what the shared
    structure slots say, and its certainty is low where a learned request's is high."""
    model = taught().freeze()
    known = content("Rewrite the following paragraph in a more formal tone:\n\nThe ocean was quiet in the morning "
                    "and nobody expected anything to change. Many people think about the ocean differently.")
    strange = content("Перепиши этот абзац более официально: море было тихим утром.")
    assert model.absolute(strange)["acc_certainty"] < 0.5 < model.absolute(known)["acc_certainty"]
    assert abs(model.estimate(strange)[0]) < abs(model.estimate(known)[0]) / 2
    empty = Predictor().freeze()
    assert empty.estimate(known) == (0.0, 0.0)


def test_a_reply_cut_at_max_tokens_only_says_the_answer_was_at_least_that_long() -> None:
    """Censoring: half the requests allow 64 tokens and are cut there, half allow 1,024. A learner that
    read the cut lengths as exact would learn that stories run shorter than they do."""
    rng, censored, naive = random.Random(1), Predictor(), Predictor()
    for index in range(600):
        asked = synthetic.learned(rng)
        cap = 64 if index % 2 else 1024
        tokens = min(asked.output_tokens, cap)
        censored.observe(content(asked.user, max_tokens=cap), None, tokens)
        naive.observe(content(asked.user, max_tokens=10**6), None, tokens)  # never seen as cut
    stories = [synthetic.request(rng, False, synthetic.TOPICS[:12], synthetic.NEW[:3]) for _ in range(100)]
    truth = statistics.fmean(math.log(r.output_tokens) for r in stories)
    said = statistics.fmean(censored.freeze().absolute(content(r.user))["len"] for r in stories)
    said_naively = statistics.fmean(naive.freeze().absolute(content(r.user, max_tokens=10**6))["len"] for r in stories)
    assert abs(said - truth) < 0.25 < truth - said_naively, (said, truth, said_naively)


def test_memory_is_bounded_whatever_the_traffic() -> None:
    rng, predictor = random.Random(2), Predictor()
    for index in range(RECENT + 500):
        words = " ".join(f"w{rng.randrange(10**9)}" for _ in range(30))
        predictor.observe(content(f"request {index}: {words}"), 1 + 4 * rng.random(), rng.randint(1, 900))
    assert all(len(table) == SLOTS for table in (*predictor.weights, *predictor.variances, *predictor.shrunk))
    assert len(predictor.packed) == SLOTS and len(predictor._dirty) <= SLOTS
    assert len(predictor._recent) <= RECENT
    assert len(predictor.export()) <= 2 * SLOTS + 4


def test_replays_do_not_teach_it_to_trust_its_memory() -> None:
    """Items drawn at random around one mean (no content signal) and replayed: the calibration must not
    rise above its prior, as it would if replays counted as honest tests."""
    rng, predictor = random.Random(4), Predictor()
    items = [(synthetic.learned(rng).user, 1 + 4 * rng.random()) for _ in range(40)]
    for _ in range(30):
        for user, length in items:
            predictor.observe(content(user), length, 200)
    assert predictor.calibration(0) <= 1.0


def test_the_packed_estimate_is_the_sum_of_both_targets_weights() -> None:
    predictor = taught(200)
    model = predictor.freeze()
    probe = content("Fix the grammar in this text:\n\nThe cat were on the roof.")
    acc, length = model.estimate(probe)
    expected = [sum(predictor.shrunk[t][s] for s in probe.slots) * predictor.calibration(t) for t in (0, 1)]
    # fixed point: 1/65536 per slot at most
    assert acc == pytest.approx(expected[0], abs=len(probe.slots) / 65536)
    assert length == pytest.approx(expected[1], abs=len(probe.slots) / 65536)


def test_the_learner_shares_the_predictor_through_its_export() -> None:
    """A replica that absorbs another's export predicts what the other predicts (sharing through Redis)."""
    rng, teacher = random.Random(5), Learner()
    for _ in range(300):
        asked = synthetic.learned(rng)
        length = synthetic.tokens_per_step(asked.acceptance)
        teacher.observe(Observation("speculative", "chat", 60, 1, 0.05, 2.0, asked.output_tokens, length,
                                    content=content(asked.user)))  # fmt: skip
    exported = teacher.export()
    assert sum(1 for name in exported if "|prd|" in name) <= 2 * SLOTS + 4
    student = Learner()
    student.absorb(exported)
    probe = content("Polish the passage below without changing its meaning:\n\nThe jazz music was loud.")
    mine, theirs = teacher.model().predictor, student.model().predictor
    assert isinstance(mine, PredictorModel) and isinstance(theirs, PredictorModel)
    assert abs(mine.estimate(probe)[0]) > 0.05
    assert theirs.estimate(probe)[0] == pytest.approx(mine.estimate(probe)[0], abs=1e-3)
    assert theirs.absolute(probe)["acc"] == pytest.approx(mine.absolute(probe)["acc"], abs=1e-3)


@dataclass(frozen=True, slots=True)
class _Item:
    id: str
    task: str
    acceptance: float
    output_tokens: int
    max_tokens: int
    messages: tuple[dict[str, str], ...]


def _content_items(rng: random.Random) -> list[_Item]:
    """80 requests on one system prompt whose acceptance follows their content: rewrites of pasted text against
    new text, alternately."""
    asked = [synthetic.request(rng, i % 2 == 0, synthetic.TOPICS, synthetic.TRANSFORM if i % 2 == 0 else
                               synthetic.NEW) for i in range(80)]  # fmt: skip
    messages = [({"role": "system", "content": synthetic.SYSTEM}, {"role": "user", "content": r.user}) for r in asked]
    return [_Item(f"i{i}", "chat", r.acceptance, max(r.output_tokens, 20), 512, m)
            for i, (r, m) in enumerate(zip(asked, messages, strict=True))]  # fmt: skip


def test_the_quality_report_finds_the_content_signal_and_not_a_random_one() -> None:
    """``python -m gateway.adaptive.quality`` on items whose acceptance follows their content: well over 30 %
    below the task mean's error on the held-out half; on the same items with acceptance shuffled between them
    (no content signal left) it cannot beat the task mean by much."""
    rng = random.Random(9)
    items = _content_items(rng)
    assert quality.evaluate(items).gain > 0.3
    shuffled = [item.acceptance for item in items]
    rng.shuffle(shuffled)
    noise = [dataclasses.replace(item, acceptance=a) for item, a in zip(items, shuffled, strict=True)]
    assert quality.evaluate(noise).gain < 0.15


def test_the_offline_reference_finds_the_content_signal_and_not_a_random_one() -> None:
    """``--offline``: the ridge fitted with hindsight finds the same signal the predictor does, and on shuffled
    acceptance it cannot do better than the task mean by more than its choice of penalty on the asked half."""
    rng = random.Random(9)
    items = _content_items(rng)
    found = quality.offline_reference(items)
    assert found.mae_rate_task == pytest.approx(quality.evaluate(items).mae_rate_task)
    assert found.gain(found.mae_ridge) > 0.3
    assert found.ridge_penalty in quality.RIDGE_PENALTIES
    shuffled = [item.acceptance for item in items]
    rng.shuffle(shuffled)
    noise = quality.offline_reference([dataclasses.replace(item, acceptance=a)
                                       for item, a in zip(items, shuffled, strict=True)])  # fmt: skip
    assert noise.gain(noise.mae_ridge) < 0.15
    assert noise.mae_ridge <= noise.mae_rate_task + 1e-3  # the largest penalty gives the task mean back


def test_a_report_over_few_steps_moves_the_prediction_less_than_one_over_many() -> None:
    """A three-token answer's acceptance length is the mean of one or two steps: it says little."""
    asked = content("Rewrite this paragraph in plain English, keeping every fact.")
    short, long = Predictor(), Predictor()
    short.observe(asked, 5.0, 5)  # one step
    long.observe(asked, 5.0, 500)  # a hundred steps
    said = [p.freeze().absolute(asked)["acc"] for p in (short, long)]
    assert 0.0 < said[0] < said[1] <= math.log(5.0) + 1e-9


def test_short_answers_noisy_reports_do_not_pull_a_segments_acceptance_down() -> None:
    """Reports drawn as an engine makes them (the mean of each step's accepted drafts + 1): a request type
    whose answers are short gets reports over one or two steps, whose log is often far below the truth.
    Weighted by their steps, the prediction for that type stays near the long answers' (same acceptance)."""
    rng, predictor, rate, k = random.Random(3), Predictor(), 0.8, 5
    asked = content("Summarise the following notes for the team.")
    for index in range(400):
        tokens = 3 if index % 2 else 300  # half the answers a few tokens long
        predictor.observe(asked, quality.reported_length(rng, rate, k, tokens), tokens)
    predicted = math.exp(predictor.freeze().absolute(asked)["acc"])
    truth = quality.tokens_per_step(rate, k)
    assert abs(math.log(predicted / truth)) < 0.08, (predicted, truth)


def _segment_request(rng: random.Random, task: str) -> Content:
    topic = rng.choice(synthetic.TOPICS)
    if task == "code":
        user = f"Write a python function that handles {topic}. ```def f():```"
        return READER.read("You are a coding assistant.", user, "code", False, 80, 1024)
    user = f"Tell me in one line what you think of {topic}."
    return READER.read("You are a friendly assistant.", user, "chat", False, 40, 1024)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_expected_length_counts_the_segments_mean_once(seed: int) -> None:
    """Two segments whose prompts differ in their words as well as their task: code answers ~200 tokens, chat
    ~20, neither predicted further by content. The predictor's content terms take part of the difference (the
    words each segment's prompts share), and the sample of a segment's lengths holds all of it: scaled by the
    raw deviation, code was expected at twice its length. Centred on what the segment's requests were given, it
    is expected near its mean."""
    rng, learner = random.Random(seed), Learner()
    for i in range(600):
        task, mean = ("code", 200) if i % 2 else ("chat", 20)
        tokens = round(mean * math.exp(rng.gauss(0, 0.3)))
        learner.observe(Observation("standard", task, 60, 1, 0.05, 1.0, tokens, content=_segment_request(rng, task)))
    model = learner.model()
    assert model.predictor is not None
    for task, mean in (("code", 200), ("chat", 20)):
        truth = mean * math.exp(0.3**2 / 2)  # the mean of the lengths drawn
        probes = [_segment_request(rng, task) for _ in range(100)]
        deviations = [model.predictor.estimate(p)[1] for p in probes]
        raw = statistics.fmean(model.expected_tokens(task, 1024, d)[0] for d in deviations)
        centred = statistics.fmean(model.expected_tokens(task, 1024, model.length_deviation(task, d))[0]
                                   for d in deviations)  # fmt: skip
        assert abs(math.log(centred / truth)) < 0.15, (task, centred, truth)
        if task == "code":
            assert raw > 1.5 * truth  # what the centring is for: the double count is there to remove
    assert model.length_deviation("unseen-segment", 0.5) == pytest.approx(0.5 - model.length_centres[""])
    student = Learner()  # another gateway replica: the centres travel with the lengths and the weights (Redis)
    student.absorb(learner.export())
    assert dict(student.model().length_centres) == pytest.approx(dict(model.length_centres))


def test_the_quality_report_takes_paths_and_says_which_one_is_missing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        quality.main([str(tmp_path / "nowhere.yaml")])
    assert exited.value.code == 2 and "no such workload file or directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        quality.main(["--help"])
    assert exited.value.code == 0 and "--offline" in capsys.readouterr().out
    family = Path(quality.__file__).resolve().parents[2] / "backends" / "workloads" / "families" / "one-prompt" / "dev"
    assert quality.main([str(family)]) == 0
    assert "per-token acceptance MAE" in capsys.readouterr().out
