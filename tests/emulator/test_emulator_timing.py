"""The timing model's calibration targets (issue 3), asserted as properties of the model."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest
import yaml

from backends.emulator.profiles import PROFILE_DIR, Profile, SpeculativeConfig, dynamic_profile, load_profile
from backends.emulator.timing import (
    Engine,
    EngineRequest,
    TimingModel,
    draft_acceptance_rate,
    draw_accepted,
    expected_tokens_per_step,
    profiled_table,
    zero_k_overhead,
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


def _golden_run(model: TimingModel) -> tuple[str, int, int, int, int, int, int, int, int]:
    engine = Engine(model, random.Random(11))
    rng = random.Random(5)
    total, steps, tokens = 0.0, 0, 0
    for index in range(60):
        prompt, output = rng.randint(20, 900), rng.randint(1, 400)
        engine.add(EngineRequest(str(index), prompt_tokens=prompt, output_tokens=output, acceptance=rng.random()))
        while index % 3 == 0 or (index == 59 and engine.has_work):
            outcome = engine.step()
            total, steps, tokens = total + outcome.duration_s, steps + 1, tokens + outcome.batch_tokens
            if index != 59:
                break
    c = engine.counters
    return (repr(total), steps, tokens, c.prompt_tokens, c.generation_tokens, c.drafts, c.draft_tokens,
            c.accepted_tokens, c.preemptions)  # fmt: skip


@pytest.mark.parametrize(
    ("speculative", "expected"),
    [
        (False, ("30.8775000000004", 916, 10977, 33975, 10977, 0, 0, 0, 19)),
        (True, ("27.1784000000004", 522, 34767, 37034, 10977, 5781, 28905, 5182, 21)),
    ],
    ids=["standard", "speculative"],
)
def test_without_prefix_info_or_a_table_every_figure_is_as_before(speculative: bool, expected: tuple) -> None:
    """Golden figures computed with the engine as it was before the prefix cache and dynamic speculation
    (commit c0fbc36): a loaded run with KV preemptions, to the last digit."""
    profile = _small(load_profile("a100-70b-draft"), kv_capacity_tokens=9000, max_num_seqs=24)
    assert _golden_run(TimingModel(profile, speculative)) == expected


# --- dynamic speculation (num_speculative_tokens_per_batch_size) ---------------------------------------------

TABLE = ((1, 2, 5), (3, 8, 2), (9, 256, 0))


def _dynamic(table: tuple[tuple[int, int, int], ...] = TABLE) -> TimingModel:
    profile = load_profile("a100-70b-draft")
    spec = profile.speculative.model_copy(update={"num_speculative_tokens_per_batch_size": table})
    return TimingModel(_small(profile, speculative=spec), True)


def test_the_table_picks_k_by_batch_size_as_vllm_does() -> None:
    model = _dynamic(((1, 2, 5), (5, 8, 2), (20, 30, 4)))  # a gap at 3-4 and 9-19, a tail past 30
    batches = (1, 2, 3, 4, 5, 8, 19, 20, 30, 31, 500)
    assert [model.k_for(batch) for batch in batches] == [5, 5, 5, 5, 2, 2, 2, 4, 4, 4, 4]
    assert TimingModel(load_profile("a100-70b-draft"), False).k_for(1) == 0


@pytest.mark.parametrize("batch", [1, 4, 16, 64, 256])
def test_a_step_with_k_from_the_table_costs_what_a_static_engine_with_that_k_costs(batch: int) -> None:
    dynamic = _dynamic()
    k = dynamic.k_for(batch)
    if k == 0:
        return
    profile = load_profile("a100-70b-draft")
    static = TimingModel(_small(profile, speculative=profile.speculative.model_copy(
        update={"num_speculative_tokens": k})), True)  # fmt: skip
    assert dynamic.step_s(batch) == static.step_s(batch)


@pytest.mark.parametrize("batch", [9, 16, 64, 189, 256])
def test_k_zero_is_a_plain_step_plus_the_measured_overhead(batch: int) -> None:
    plain = TimingModel(load_profile("a100-70b-draft"), False)
    dynamic = _dynamic()
    assert dynamic.k_for(batch) == 0
    assert dynamic.step_s(batch) == pytest.approx(plain.step_s(batch) * (1 + zero_k_overhead(batch)))
    assert dynamic.time_per_output_token_s(batch, 0.9) > plain.time_per_output_token_s(batch, 0.9)


def test_the_k_zero_overhead_is_the_issues_two_points_interpolated_in_log_batch() -> None:
    assert zero_k_overhead(1) == zero_k_overhead(2) == pytest.approx(0.0656)
    assert zero_k_overhead(189) == zero_k_overhead(4096) == pytest.approx(0.2158)
    middle = round(math.sqrt(2 * 189))  # 19: halfway in log batch size
    assert zero_k_overhead(middle) == pytest.approx((0.0656 + 0.2158) / 2, abs=0.002)
    values = [zero_k_overhead(batch) for batch in range(1, 300)]
    assert values == sorted(values)


def test_dynamic_counters_stay_consistent_and_k_zero_steps_draft_nothing() -> None:
    engine = Engine(_dynamic(), random.Random(4))
    drafted_by_step: list[int] = []
    for index in range(12):
        engine.add(EngineRequest(str(index), prompt_tokens=30, output_tokens=60 + 20 * index, acceptance=0.8))
    while engine.has_work:
        batch = engine.num_running + min(engine.num_waiting, engine.model.profile.max_num_seqs)
        outcome = engine.step()
        drafted = [e.draft_tokens for e in outcome.emissions if e.drafted]
        assert set(drafted) <= {engine.model.k_for(batch)}
        assert all(e.accepted == 0 for e in outcome.emissions if not e.drafted)
        drafted_by_step.append(sum(drafted))
    counters = engine.counters
    assert counters.draft_tokens == sum(drafted_by_step)
    assert counters.accepted_tokens == sum(counters.accepted_per_position) <= counters.draft_tokens
    assert drafted_by_step[1:20] == [0] * 19  # 12 running: k = 0, nothing drafted
    assert drafted_by_step[-1] == 5  # the last request alone: k = 5
    assert 2 * counters.drafts < counters.draft_tokens < 5 * counters.drafts  # k = 2 and k = 5 steps


@pytest.mark.parametrize(
    ("table", "error"),
    [
        (((2, 8, 3),), "must start at 1"),
        (((1, 8, 3), (8, 16, 2)), "overlap"),
        (((1, 8, 6),), "between 0 and num_speculative_tokens"),
        (((1, 8, 2), (12, 10, 1)), "start must be <= end"),
    ],
    ids=["no-start-at-1", "overlap", "k-above-max", "reversed"],
)
def test_a_profile_with_a_table_vllm_would_refuse_does_not_load(table: tuple, error: str) -> None:
    spec = load_profile("a100-70b-draft").speculative.model_dump()
    with pytest.raises(ValueError, match=error):
        SpeculativeConfig.model_validate({**spec, "num_speculative_tokens_per_batch_size": table})


def test_a_profile_table_loads_from_yaml_sorted(tmp_path: Path) -> None:
    data = yaml.safe_load((PROFILE_DIR / "a100-70b-draft.yaml").read_text())
    data["speculative"]["num_speculative_tokens_per_batch_size"] = [[9, 256, 0], [1, 8, 3]]
    path = tmp_path / "dynamic.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = load_profile(path).speculative
    assert spec.num_speculative_tokens_per_batch_size == ((1, 8, 3), (9, 256, 0))
    assert (spec.k_at(8), spec.k_at(9)) == (3, 0)


@pytest.mark.parametrize("name", ["a100-70b-draft", "h100-8b", "cpu-smollm2"])
def test_the_profiled_table_picks_the_fastest_k_at_every_batch_size(name: str) -> None:
    profile = load_profile(name)
    table = profiled_table(profile, 0.7)
    assert table[0][0] == 1 and table[-1][1] == profile.max_num_seqs  # every batch size, in vLLM's ranges
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(table))
    with_table = TimingModel(dynamic_profile(profile, table), speculative=True)
    for batch in (1, 4, 16, 64, 256):
        chosen = with_table.k_for(batch)
        rate = expected_tokens_per_step(0.7 * profile.speculative.acceptance_scale, chosen) / with_table.step_s(batch)
        for k in range(profile.speculative.num_speculative_tokens + 1):  # no fixed k is faster at this batch
            fixed = TimingModel(dynamic_profile(profile, ((1, 1, k),)), speculative=True)
            other = expected_tokens_per_step(0.7 * profile.speculative.acceptance_scale, k) / fixed.step_s(batch)
            assert rate >= other * (1 - 1e-9), (batch, chosen, k)


def test_the_profiled_table_drafts_less_as_the_batch_grows_and_more_when_drafts_are_accepted() -> None:
    profile = load_profile("h100-8b")
    low, middle, high = (profiled_table(profile, a) for a in (0.4, 0.6, 0.9))
    for table in (low, middle, high):
        assert [k for _, _, k in table] == sorted((k for _, _, k in table), reverse=True)
    assert middle[-1][2] == 0 and high[-1][2] == 1  # past the knee, only drafts right 9 times in 10 still pay
    assert low[0][2] < middle[0][2] < high[0][2]  # at batch 1, better drafts are worth more of them
