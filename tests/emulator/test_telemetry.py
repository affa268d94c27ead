"""What the simulated gateway learns from, as deployments report it: usage on streams or not, per-request
spec-decode metrics or not, and the gateway's own count of a stream that carried no usage."""

from __future__ import annotations

import statistics

import pytest

from backends.emulator.policies import fixed_pool_rules
from backends.emulator.profiles import load_profile
from backends.emulator.scenarios import make_arrivals
from backends.emulator.simulate import RequestResult, Simulation
from backends.emulator.telemetry import TELEMETRY, estimated_tokens, has_usage, usage_draw
from backends.workloads.loader import load_workload
from gateway.adaptive.learner import Learner, Observation
from gateway.rules import reference_rules

PROFILE = load_profile("a100-70b-draft")
WORKLOAD = load_workload()


def _taught(pool: str, telemetry: str, count: int = 300) -> list[tuple[bool, RequestResult, Observation]]:
    """(streamed, result, what the learner was taught) for each request of a fixed-pool run."""
    taught = []

    class Spy(Simulation):
        def _observation(self, progress, result, finished_s, run_shift):  # type: ignore[no-untyped-def]
            observation = super()._observation(progress, result, finished_s, run_shift)
            taught.append((progress.arrival.features.stream, result, observation))
            return observation

    rules = fixed_pool_rules(reference_rules(), pool)
    arrivals = make_arrivals(WORKLOAD, 10, count, 0, rules)
    Spy(PROFILE, rules, learner=Learner(), telemetry=TELEMETRY[telemetry]).run(arrivals)
    assert len(taught) == count
    return taught


def test_full_telemetry_teaches_exact_tokens_and_every_speculative_requests_acceptance() -> None:
    for streamed, result, observation in _taught("speculative", "full"):
        assert observation.output_tokens == result.output_tokens
        assert observation.acceptance_length is not None or result.output_tokens == 1
        assert (observation.ttft_s is not None) == streamed  # a whole reply shows only its end


def test_without_per_request_metrics_no_acceptance_is_known_and_tokens_stay_exact() -> None:
    taught = _taught("speculative", "no-spec-metrics")
    assert all(obs.acceptance_length is None and obs.output_tokens == result.output_tokens for _, result, obs in taught)


def test_a_stream_without_usage_is_counted_from_its_events_and_its_acceptance_is_unknown() -> None:
    """vLLM sends the role event, then one per engine step: on the standard pool (one token a step) the
    gateway's count reads one too many (the role event); on the speculative pool each step is worth the
    acceptance length learned so far, so the count is off either way. Whole replies carry usage always."""
    standard = _taught("standard", "no-usage")
    assert all(obs.output_tokens == result.output_tokens + (1 if streamed else 0) for streamed, result, obs in standard)
    speculative = _taught("speculative", "no-usage")
    streams = [(result, obs) for streamed, result, obs in speculative if streamed]
    assert streams and all(obs.acceptance_length is None for _, obs in streams)
    assert sum(obs.output_tokens != result.output_tokens for result, obs in streams) > 0.5 * len(streams)
    whole = [(result, obs) for streamed, result, obs in speculative if not streamed]
    assert all(
        obs.output_tokens == result.output_tokens and (obs.acceptance_length is not None or result.output_tokens == 1)
        for result, obs in whole
    )  # a one-token answer is never drafted for, so no acceptance is reported


def test_mixed_clients_half_the_streams_carry_usage_the_same_ones_in_every_run() -> None:
    first, again = _taught("speculative", "mixed"), _taught("speculative", "mixed")
    streams = [obs for streamed, _, obs in first if streamed]
    with_usage = sum(obs.acceptance_length is not None for obs in streams)
    assert 0.3 * len(streams) < with_usage < 0.7 * len(streams)
    assert [obs.acceptance_length for _, _, obs in first] == [obs.acceptance_length for _, _, obs in again]


def test_the_usage_draw_is_per_request_uniform_and_stable() -> None:
    draws = [usage_draw(0, index) for index in range(2000)]
    assert all(0.0 <= d < 1.0 for d in draws) and abs(statistics.fmean(draws) - 0.5) < 0.03
    assert draws[:50] == [usage_draw(0, index) for index in range(50)]
    assert draws[:50] != [usage_draw(1, index) for index in range(50)]


@pytest.mark.parametrize(
    ("telemetry", "stream", "draw", "expected"),
    [("full", True, 0.99, True), ("no-usage", True, 0.0, False), ("no-usage", False, 0.5, True),
     ("mixed", True, 0.49, True), ("mixed", True, 0.51, False), ("bare", False, 0.0, True)],
    ids=["full", "no-usage-stream", "no-usage-whole-reply", "mixed-asked", "mixed-not", "bare-whole-reply"],
)  # fmt: skip
def test_which_replies_carry_usage(telemetry: str, stream: bool, draw: float, expected: bool) -> None:
    assert has_usage(TELEMETRY[telemetry], stream, draw) is expected


def test_the_gateways_count_uses_the_learned_acceptance_then_the_scraped_one_then_one() -> None:
    learner = Learner()
    for _ in range(5):
        learner.observe(Observation("speculative", "code", 100, 1.0, 0.1, 2.0, 100, acceptance_length=3.0))
    model = learner.model()
    assert estimated_tokens(11, model, "speculative", "code", 2.0) == 31  # 1 + 10 steps x 3.0 learned
    assert estimated_tokens(11, model, "speculative", "chat", 2.0) == 21  # the segment unknown: the pool's 2.0
    assert estimated_tokens(11, None, "standard", "chat", None) == 11  # nothing known: one token per event
    assert estimated_tokens(0, None, "standard", "chat", None) == 1
