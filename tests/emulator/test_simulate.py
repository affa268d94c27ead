"""The virtual-time simulator: deterministic, uses the gateway's decide(), oracle is a per-request bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.emulator.cli import register_simulate  # noqa: F401  (the CLI module imports cleanly)
from backends.emulator.profiles import load_profile
from backends.emulator.report import summarise
from backends.emulator.simulate import (
    ALWAYS_SPECULATIVE,
    ALWAYS_STANDARD,
    ORACLE,
    RULES,
    simulate_level,
)
from backends.workloads.loader import load_workload
from gateway.cli import main
from gateway.rules import default_rules, parse_rules

PROFILE = load_profile("a100-70b-draft")
WORKLOAD = load_workload()


def _level(qps: float, seed: int = 0, duration_s: float = 30.0) -> dict[str, list]:  # type: ignore[type-arg]
    return simulate_level(PROFILE, WORKLOAD, default_rules(), qps, duration_s, seed, warmup_s=5.0)


def test_same_seed_same_results_different_seed_different() -> None:
    assert _level(6, seed=1) == _level(6, seed=1)
    assert _level(6, seed=1)[RULES] != _level(6, seed=2)[RULES]


@pytest.mark.parametrize("qps", [4.0, 30.0])
def test_oracle_is_never_worse_than_either_fixed_policy_per_request(qps: float) -> None:
    runs = _level(qps)
    for best, on_standard, on_speculative in zip(
        runs[ORACLE], runs[ALWAYS_STANDARD], runs[ALWAYS_SPECULATIVE], strict=True
    ):
        assert best.index == on_standard.index == on_speculative.index
        assert best.latency_s <= min(on_standard.latency_s, on_speculative.latency_s)


def test_fixed_policies_send_everything_to_their_pool() -> None:
    runs = _level(4)
    assert {result.pool for result in runs[ALWAYS_STANDARD]} == {"standard"}
    assert {result.pool for result in runs[ALWAYS_SPECULATIVE]} == {"speculative"}


def test_the_shipped_rules_route_through_the_gateway_decide() -> None:
    low = _level(4)[RULES]
    assert all(r.pool == "standard" for r in low if r.reason == "short-output")
    assert {r.reason for r in low} >= {"short-output", "draft-friendly-task", "default"}
    high = _level(30)[RULES]
    assert summarise(high).speculative_share < 0.05  # qps > 20: the high-load rule holds


def test_a_custom_rules_file_changes_the_routing() -> None:
    rules = parse_rules({"rules": [{"name": "all-spec", "pool": "speculative"}], "default_pool": "standard"})
    runs = simulate_level(PROFILE, WORKLOAD, rules, 4, 20, 0, warmup_s=2)
    assert {result.reason for result in runs[RULES]} == {"all-spec"}


def test_speculation_wins_at_low_load_and_loses_at_saturation() -> None:
    low, high = _level(4), _level(40, duration_s=40)
    assert summarise(low[ALWAYS_SPECULATIVE]).mean_s < 0.7 * summarise(low[ALWAYS_STANDARD]).mean_s
    assert summarise(high[ALWAYS_SPECULATIVE]).mean_s > 1.5 * summarise(high[ALWAYS_STANDARD]).mean_s


def test_simulate_cli_prints_emulated_tables_and_writes_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "sim.png"
    assert main(["simulate", "--qps", "2,30", "--duration", "15", "--warmup", "2", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert out.count("EMULATED simulation") == 2
    assert plot.stat().st_size > 10_000


def test_simulate_cli_rejects_bad_levels(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--qps", "0"]) == 2
    assert "positive" in capsys.readouterr().out


def test_a_lone_request_takes_prefill_plus_one_step_per_token() -> None:
    from backends.emulator.simulate import Simulation, fixed_pool_rules, make_arrivals
    from backends.emulator.timing import TimingModel

    rules = fixed_pool_rules(default_rules(), "standard")
    arrivals = make_arrivals(WORKLOAD, 0.001, 3, 0, rules)  # ~1000 s apart: each request runs alone
    model = TimingModel(PROFILE, speculative=False)
    for arrival, result in zip(arrivals, Simulation(PROFILE, rules).run(arrivals), strict=True):
        item = arrival.item
        tokens = min(item.output_tokens, item.max_tokens)
        prefill = model.step_s(0, 1, item.prompt_tokens)
        assert result.ttft_s == pytest.approx(prefill)
        assert result.latency_s == pytest.approx(prefill + (tokens - 1) * model.step_s(1))
