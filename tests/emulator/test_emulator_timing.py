"""The timing model's calibration targets (issue 3), asserted as properties of the model."""

from __future__ import annotations

import random

import pytest

from backends.emulator.profiles import Profile, load_profile
from backends.emulator.timing import (
    Engine,
    EngineRequest,
    TimingModel,
    draft_acceptance_rate,
    draw_accepted,
    expected_tokens_per_step,
)


def _models(name: str) -> tuple[TimingModel, TimingModel]:
    profile = load_profile(name)
    return TimingModel(profile, speculative=False), TimingModel(profile, speculative=True)


def _speedup(name: str, batch: int, acceptance: float) -> float:
    standard, speculative = _models(name)
    return standard.time_per_output_token_s(batch, acceptance) / speculative.time_per_output_token_s(batch, acceptance)


@pytest.mark.parametrize(
    ("acceptance", "low", "high"),
    [(0.85, 2.7, 2.9), (0.75, 2.1, 2.3), (0.80, 2.4, 2.6), (0.55, 1.4, 1.6)],
    ids=["code-0.85", "summary-0.75", "translation-0.80", "chat-0.55"],
)
def test_a100_speedup_at_concurrency_one(acceptance: float, low: float, high: float) -> None:
    assert low <= _speedup("a100-70b-draft", 1, acceptance) <= high


@pytest.mark.parametrize("acceptance", [0.75, 0.80, 0.85])
def test_a100_speculative_is_1_4_to_1_8x_slower_at_high_load(acceptance: float) -> None:
    profile = load_profile("a100-70b-draft")
    slowdown = 1 / _speedup("a100-70b-draft", profile.max_num_seqs, acceptance)
    assert 1.4 <= slowdown <= 1.8


def test_a100_speculation_stops_paying_as_the_batch_grows() -> None:
    speedups = [_speedup("a100-70b-draft", batch, 0.8) for batch in (1, 16, 64, 128, 256)]
    assert speedups == sorted(speedups, reverse=True)
    assert speedups[0] > 2 and speedups[-1] < 1


@pytest.mark.parametrize(("batch", "step_ms"), [(1, 6.5), (4, 6.5), (16, 11.0)])
def test_h100_8b_step_times(batch: int, step_ms: float) -> None:
    standard, _ = _models("h100-8b")
    assert standard.step_s(batch) * 1000 == pytest.approx(step_ms, rel=0.02)


@pytest.mark.parametrize(("streams", "total_tok_s"), [(1, 92), (4, 292), (16, 601)])
def test_cpu_smollm2_throughput_matches_the_real_cpu_engine(streams: int, total_tok_s: float) -> None:
    standard, _ = _models("cpu-smollm2")
    assert streams / standard.time_per_output_token_s(streams, 0.0) == pytest.approx(total_tok_s, rel=0.02)


def test_cpu_smollm2_ngram_on_code_gives_134_tok_s_at_half_acceptance() -> None:
    _, speculative = _models("cpu-smollm2")
    code_acceptance = 0.85
    assert 1 / speculative.time_per_output_token_s(1, code_acceptance) == pytest.approx(134, rel=0.03)
    per_token = speculative.effective_acceptance(code_acceptance)
    assert draft_acceptance_rate(per_token, speculative.k) == pytest.approx(0.5, abs=0.02)


def test_expected_tokens_per_step_formula() -> None:
    assert expected_tokens_per_step(0.85, 5) == pytest.approx((1 - 0.85**6) / 0.15)
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0


def test_acceptance_draws_are_truncated_geometric() -> None:
    rng = random.Random(7)
    draws = [draw_accepted(rng, 0.8, 5) for _ in range(40_000)]
    assert max(draws) == 5 and min(draws) == 0
    assert 1 + sum(draws) / len(draws) == pytest.approx(expected_tokens_per_step(0.8, 5), rel=0.02)


def _run_to_completion(engine: Engine) -> tuple[float, int]:
    elapsed, steps = 0.0, 0
    while engine.has_work:
        elapsed += engine.step().duration_s
        steps += 1
    return elapsed, steps


@pytest.mark.parametrize("speculative", [False, True], ids=["standard", "speculative"])
def test_engine_single_stream_time_follows_the_formula(speculative: bool) -> None:
    model = TimingModel(load_profile("a100-70b-draft"), speculative)
    engine = Engine(model, random.Random(3))
    request = EngineRequest("r", prompt_tokens=100, output_tokens=4000, acceptance=0.85)
    engine.add(request)
    elapsed, _ = _run_to_completion(engine)
    expected = 100 * 1e-4 + model.step_s(0, 1) + 3999 * model.time_per_output_token_s(1, 0.85)
    assert elapsed == pytest.approx(expected, rel=0.03)
    assert request.generated == 4000


def _small(profile: Profile, **changes: object) -> Profile:
    return profile.model_copy(update=changes)


def test_engine_caps_the_batch_at_max_num_seqs() -> None:
    profile = _small(load_profile("h100-8b"), max_num_seqs=2)
    engine = Engine(TimingModel(profile, False), random.Random(0))
    for index in range(5):
        engine.add(EngineRequest(str(index), prompt_tokens=10, output_tokens=50, acceptance=0.5))
    engine.step()
    assert (engine.num_running, engine.num_waiting) == (2, 3)


def test_engine_waits_for_kv_capacity_and_preempts_on_overflow() -> None:
    profile = _small(load_profile("h100-8b"), kv_capacity_tokens=300)
    engine = Engine(TimingModel(profile, False), random.Random(0))
    for index in range(3):
        engine.add(EngineRequest(str(index), prompt_tokens=100, output_tokens=150, acceptance=0.5))
    engine.step()
    assert (engine.num_running, engine.num_waiting) == (2, 1)  # the third prompt does not fit yet
    _run_to_completion(engine)
    assert engine.counters.preemptions > 0
    assert engine.counters.generation_tokens == 450


def test_speculative_counters_are_consistent() -> None:
    engine = Engine(TimingModel(load_profile("a100-70b-draft"), True), random.Random(1))
    for index in range(8):
        engine.add(EngineRequest(str(index), prompt_tokens=20, output_tokens=300, acceptance=0.8))
    _run_to_completion(engine)
    counters = engine.counters
    assert counters.draft_tokens == 5 * counters.drafts
    assert counters.accepted_tokens == sum(counters.accepted_per_position)
    assert counters.accepted_per_position == sorted(counters.accepted_per_position, reverse=True)
    rate = counters.accepted_tokens / counters.draft_tokens
    assert rate == pytest.approx(draft_acceptance_rate(0.8, 5), abs=0.04)


def test_prefill_cost_grows_with_the_prompt() -> None:
    model = TimingModel(load_profile("a100-70b-draft"), False)
    assert model.step_s(0, 1, 2000) - model.step_s(0, 1, 0) == pytest.approx(0.2)
