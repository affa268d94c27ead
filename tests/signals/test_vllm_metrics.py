"""The vLLM /metrics parser on real vLLM 0.32.0 texts, and the windowed acceptance math."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.signals.vllm_metrics import (
    AcceptanceWindow,
    MetricsParseError,
    SpecCounters,
    acceptance_from,
    parse_vllm_metrics,
    spec_delta,
)
from tests.signals._paths import fixture_text

FIXTURES = ("plain", "ngram", "draft")


# Values read by hand from the fixture files.
EXPECTED = {
    "plain": dict(running=0.0, waiting=0.0, kv=0.0, spec=None),
    "ngram": dict(
        running=0.0,
        waiting=0.0,
        kv=0.0,
        spec=SpecCounters(317.0, 1262.0, 701.0, (214.0, 190.0, 162.0, 135.0)),
    ),
    "draft": dict(
        running=0.0,
        waiting=0.0,
        kv=0.0,
        spec=SpecCounters(435.0, 1740.0, 1698.0, (435.0, 425.0, 425.0, 413.0)),
    ),
}


@pytest.mark.parametrize("kind", FIXTURES)
def test_parses_real_vllm_fixture(kind: str) -> None:
    stats = parse_vllm_metrics(fixture_text(kind))
    want = EXPECTED[kind]
    assert stats.running == want["running"]
    assert stats.waiting == want["waiting"]
    assert stats.kv_cache_usage == want["kv"]
    assert stats.spec == want["spec"]
    assert stats.speculative is (want["spec"] is not None)
    assert stats.generation_tokens > 0 and stats.prompt_tokens > 0 and stats.finished_requests > 0


def test_per_position_counters_sum_to_accepted_tokens() -> None:
    for kind in ("ngram", "draft"):
        spec = parse_vllm_metrics(fixture_text(kind)).spec
        assert spec is not None
        assert sum(spec.accepted_per_position) == spec.accepted_tokens
        # k = 4 positions; n-gram may propose fewer than k tokens in a draft
        assert spec.draft_tokens <= len(spec.accepted_per_position) * spec.drafts


@pytest.mark.parametrize("kind", FIXTURES)
def test_fast_parser_agrees_with_prometheus_client(kind: str) -> None:
    text = fixture_text(kind)
    ours = parse_vllm_metrics(text)
    samples = {
        (s.name, s.labels.get("position")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("vllm:num_requests_running", None)] == ours.running
    assert samples[("vllm:kv_cache_usage_perc", None)] == ours.kv_cache_usage
    assert samples[("vllm:generation_tokens_total", None)] == ours.generation_tokens
    if ours.spec is not None:
        assert samples[("vllm:spec_decode_num_draft_tokens_total", None)] == ours.spec.draft_tokens
        assert (
            samples[("vllm:spec_decode_num_accepted_tokens_per_pos_total", "3")] == (ours.spec.accepted_per_position[3])
        )


def test_fast_parser_is_faster_than_building_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    text = fixture_text("draft")
    rounds = 30
    start = time.perf_counter()
    for _ in range(rounds):
        parse_vllm_metrics(text)
    ours = (time.perf_counter() - start) / rounds
    start = time.perf_counter()
    for _ in range(rounds):
        list(text_string_to_metric_families(text))
    generic = (time.perf_counter() - start) / rounds
    with capsys.disabled():
        print(f"\nparse draft fixture: ours {ours * 1e3:.3f} ms, prometheus_client {generic * 1e3:.3f} ms")
    assert ours < generic


def test_sums_engines_and_averages_kv_use() -> None:
    text = "\n".join(
        [
            'vllm:num_requests_running{engine="0",model_name="m"} 3',
            'vllm:num_requests_running{engine="1",model_name="m"} 4',
            'vllm:num_requests_waiting{engine="0",model_name="m"} 1',
            'vllm:num_requests_waiting{engine="1",model_name="m"} 2 1700000000000',
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2',
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6',
        ]
    )
    stats = parse_vllm_metrics(text)
    assert (stats.running, stats.waiting) == (7.0, 3.0)
    assert stats.kv_cache_usage == pytest.approx(0.4)
    assert stats.spec is None


def test_legacy_gpu_cache_name_and_unusual_label_values() -> None:
    text = (
        'vllm:num_requests_running{model_name="a} b"} 1\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.5\n'
    )
    stats = parse_vllm_metrics(text)
    assert (stats.running, stats.kv_cache_usage) == (1.0, 0.5)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "<html>502 Bad Gateway</html>",
        'vllm:num_requests_running{engine="0"} abc\nvllm:num_requests_waiting 0',
    ],
    ids=["empty", "html", "bad-value"],
)
def test_rejects_texts_that_are_not_vllm_metrics(text: str) -> None:
    with pytest.raises(MetricsParseError):
        parse_vllm_metrics(text)


def test_acceptance_is_ratio_of_deltas_not_of_totals() -> None:
    window = AcceptanceWindow(window_s=10.0)
    window.observe(SpecCounters(100, 400, 400), now=0.0)  # lifetime acceptance 1.0
    window.observe(SpecCounters(110, 440, 410), now=1.0)  # recent: 10 of 40 accepted
    acc = window.acceptance(now=1.0)
    assert acc is not None
    assert acc.rate == pytest.approx(0.25)
    assert acc.length == pytest.approx(1 + 10 / 10)


def test_window_forgets_old_deltas_and_reports_unknown_when_idle() -> None:
    window = AcceptanceWindow(window_s=5.0)
    window.observe(SpecCounters(0, 0, 0), now=0.0)
    window.observe(SpecCounters(10, 40, 30), now=1.0)
    assert window.acceptance(now=2.0) is not None
    window.observe(SpecCounters(10, 40, 30), now=7.0)  # no new drafts
    assert window.acceptance(now=7.0) is None  # unknown, not zero


def test_counter_reset_counts_the_new_values_as_the_increase() -> None:
    before = SpecCounters(1000, 4000, 3000)
    after_restart = SpecCounters(5, 20, 5)
    delta = spec_delta(before, after_restart, at=3.0)
    assert (delta.drafts, delta.draft_tokens, delta.accepted_tokens) == (5, 20, 5)
    acc = acceptance_from([delta])
    assert acc is not None and acc.rate == pytest.approx(0.25)


def test_partial_reset_keeps_ratios_consistent() -> None:
    # Only one counter visibly went down (the others happened to climb past their old values).
    delta = spec_delta(SpecCounters(10, 40, 30), SpecCounters(12, 48, 20), at=1.0)
    assert (delta.drafts, delta.draft_tokens, delta.accepted_tokens) == (12, 48, 20)


def test_pool_acceptance_is_token_weighted() -> None:
    busy = spec_delta(SpecCounters(0, 0, 0), SpecCounters(100, 400, 360), at=1.0)  # 0.9 on 400 tokens
    quiet = spec_delta(SpecCounters(0, 0, 0), SpecCounters(1, 4, 0), at=1.0)  # 0.0 on 4 tokens
    acc = acceptance_from([busy, quiet])
    assert acc is not None and acc.rate == pytest.approx(360 / 404)


def test_gap_longer_than_the_window_restarts_from_the_new_sample() -> None:
    window = AcceptanceWindow(window_s=5.0)
    window.observe(SpecCounters(0, 0, 0), now=0.0)
    window.observe(SpecCounters(100, 400, 400), now=60.0)  # a minute unreachable: no delta from that
    assert window.acceptance(now=60.0) is None
    window.observe(SpecCounters(110, 440, 420), now=61.0)
    acc = window.acceptance(now=61.0)
    assert acc is not None and acc.rate == pytest.approx(0.5)
