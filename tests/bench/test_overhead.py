"""The overhead benchmark runs end to end (tiny scale; the real figures come from `specgate bench overhead`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from gateway import cli
from gateway.bench.overhead import (
    REPO_ROOT,
    Result,
    Scenario,
    busy_warnings,
    main,
    proxy_env,
    render,
    run,
    scenarios,
)
from gateway.bench.overhead_compare import PAIRED_MIN_S, order, paired_seconds, render_compare
from gateway.rules import reference_rules_path


def test_overhead_benchmark_runs_every_target_kind() -> None:
    plan = [Scenario("non-stream c2", False, 2, 8, 0.0, 30), Scenario("stream c2", True, 2, 8, 0.001, 30)]
    console = Console(record=True, width=200)
    results = run(["direct", "minimal-aiohttp-proxy", "specgate"], plan, console)
    assert len(results) == 6
    assert all(r.errors == 0 and r.requests == 30 for r in results)
    proxied = [r for r in results if r.target != "direct"]
    assert all(r.cpu_ms_per_request is not None and r.cpu_ms_per_request >= 0 for r in proxied)
    assert all(r.apparatus_busy is None or 0 < r.apparatus_busy < 2 for r in results)
    assert all(r.others_busy is None or -1 < r.others_busy < 1 for r in results)
    render(results, console)
    assert "vs direct" in console.export_text()


def test_vllm_router_is_measured_as_a_peer_on_the_same_apparatus() -> None:
    plan = [Scenario("non-stream c2", False, 2, 8, 0.0, 30), Scenario("paced c4", True, 4, 8, 0.002, 30)]
    results = run(["vllm-router"], plan, Console(record=True, width=200))
    assert [r.target for r in results] == ["vllm-router", "vllm-router"]
    assert all(r.errors == 0 and r.requests == 30 for r in results)
    assert all(r.cpu_ms_per_request is not None and r.cpu_ms_per_request > 0 for r in results)


def test_the_paced_scenarios_take_the_pace_they_are_given() -> None:
    paced = [s for s in scenarios(1.0, [256], pace_s=0.01) if s.interval_s]
    assert [(s.name, s.interval_s) for s in paced] == [("paced stream 64x10ms c256", 0.01)]


def test_scenarios_cover_paced_streams_at_high_concurrency() -> None:
    plan = scenarios(1.0, [1, 64, 256])
    assert any(s.interval_s > 0 and s.concurrency == 256 for s in plan)
    assert {s.stream for s in plan} == {True, False}
    assert all(s.requests >= 300 for s in scenarios(0.01, [1, 64]))  # enough CPU to average, however quick


def result(target: str, busy: float, others: float | None = None) -> Result:
    return Result(target, "paced", 10, 0, 1.0, 1.0, 1.0, 1.0, 1.0, None, busy, others)


def test_busy_warnings_name_the_targets_whose_apparatus_was_saturated() -> None:
    assert busy_warnings([result("direct", 0.5), result("specgate", 0.79, 0.1)]) == []
    [warning] = busy_warnings([result("direct", 0.5), result("specgate", 0.93), result("minimal", 0.85)])
    assert "up to 93%" in warning and "specgate 93%" in warning and "minimal 85%" in warning
    assert "direct" not in warning and "apparatus-bound" in warning


def test_busy_warnings_name_the_targets_other_processes_disturbed() -> None:
    [warning] = busy_warnings([result("direct", 0.5, None), result("specgate", 0.3, 0.45), result("raw", 0.3, 0.1)])
    assert "other processes took up to 45%" in warning and "specgate 45%" in warning
    assert "raw" not in warning and "direct" not in warning


def test_the_logging_and_tracing_targets_run() -> None:
    """`--targets specgate+json-logs,specgate+otel`: the default gateway with those switched on, no errors."""
    plan = [Scenario("stream c2", True, 2, 8, 0.0, 30)]
    results = run(["specgate+json-logs", "specgate+otel"], plan, Console(record=True, width=200))
    outcomes = [(r.target, r.errors, r.requests) for r in results]
    assert outcomes == [("specgate+json-logs", 0, 30), ("specgate+otel", 0, 30)]


def test_the_reference_rules_target_routes_by_the_reference_rules_whatever_rules_says() -> None:
    """`specgate/reference-rules` beside `specgate` shows what the adaptive policy costs per request."""
    assert proxy_env("specgate/reference-rules", "http://127.0.0.1:9") == {
        "SPECGATE_RULES_FILE": str(reference_rules_path())
    }
    plan = [Scenario("non-stream c2", False, 2, 8, 0.0, 30)]
    results = run(["specgate/reference-rules"], plan, Console(record=True, width=200), rules=Path("no-such.yaml"))
    assert [(r.target, r.errors, r.requests) for r in results] == [("specgate/reference-rules", 0, 30)]


def test_compare_alternates_which_side_goes_first() -> None:
    assert order(3) == ["base", "head", "head", "base", "base", "head"]


def test_compare_table_gives_the_ratio_of_the_medians_and_the_rounds_range() -> None:
    def cpu(target: str, ms: float) -> Result:
        return Result(target, "non-stream c64", 10, 0, 1.0, 1.0, 1.0, 1.0, 1.0, ms, 0.5, 0.0)

    results = {"base": [cpu("base", 0.10), cpu("base", 0.20), cpu("base", 0.12)],
               "head": [cpu("head", 0.11), cpu("head", 0.30), cpu("head", 0.18)]}  # fmt: skip
    console = Console(record=True, width=200)
    render_compare(results, "abc123", console)
    text = console.export_text()
    assert "0.120" in text and "0.180" in text and "1.50" in text  # medians 0.12 and 0.18
    assert "1.10-1.50" in text  # per-round ratios 1.10, 1.50, 1.50


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists(), reason="needs the git checkout to export a revision")
def test_compare_runs_this_tree_against_a_revision(tmp_path: Path) -> None:
    code = main(["specgate"], [1], 0.01, tmp_path / "out.json", compare_to="HEAD", rounds=1)
    assert code == 0
    saved = json.loads((tmp_path / "out.json").read_text())
    assert set(saved) == {"base", "head"}
    assert all(r["errors"] == 0 and r["cpu_ms_per_request"] > 0 for side in saved.values() for r in side)


def test_a_paired_round_drives_every_worker_through_several_requests() -> None:
    paced = Scenario("paced stream 64x20ms c64", True, 64, 64, 0.02, 256)
    assert paired_seconds(paced, 1.0) >= 4 * 64 * 0.02  # a stream lasts 1.28 s: several per worker
    assert paired_seconds(Scenario("non-stream c64", False, 64, 16, 0.0, 3000), 1.0) == PAIRED_MIN_S
    assert paired_seconds(Scenario("non-stream c1", False, 1, 16, 0.0, 600), 0.01) == 0.5  # a quick run's floor


def test_paired_needs_a_revision_or_two_proxy_targets_to_pair() -> None:
    with pytest.raises(SystemExit, match="two proxy targets"):
        cli.main(["bench", "overhead", "--paired"])  # every target: more than two proxies
    with pytest.raises(SystemExit, match="two proxy targets"):
        cli.main(["bench", "overhead", "--paired", "--targets", "direct,specgate"])


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists(), reason="needs the git checkout to export a revision")
def test_paired_runs_both_gateways_at_once(tmp_path: Path) -> None:
    code = main(["specgate"], [1], 0.01, tmp_path / "out.json", compare_to="HEAD", rounds=1, paired=True)
    assert code == 0
    saved = json.loads((tmp_path / "out.json").read_text())
    assert set(saved) == {"base", "head"}
    for side in saved.values():
        assert [r["scenario"] for r in side] == ["non-stream c1", "stream 64 chunks c1"]
        assert all(r["errors"] == 0 and r["requests"] > 10 and r["cpu_ms_per_request"] > 0 for r in side)


def test_paired_runs_two_targets_of_this_tree_at_once(tmp_path: Path) -> None:
    targets = ["specgate/reference-rules", "specgate"]
    code = main(targets, [1], 0.01, tmp_path / "out.json", rounds=1, paired=True)
    assert code == 0
    saved = json.loads((tmp_path / "out.json").read_text())
    assert all(r["errors"] == 0 and r["requests"] > 10 for side in saved.values() for r in side)


def test_paired_runs_vllm_router_beside_the_gateway(tmp_path: Path) -> None:
    """The peer's ratio measured both at once, on one CPU under one load (sequential runs here move by tens of %)."""
    code = main(["vllm-router", "specgate"], [1], 0.01, tmp_path / "out.json", rounds=1, paired=True)
    assert code == 0
    saved = json.loads((tmp_path / "out.json").read_text())
    assert set(saved) == {"base", "head"}
    assert all(r["errors"] == 0 and r["requests"] > 10 and r["cpu_ms_per_request"] > 0
               for side in saved.values() for r in side)  # fmt: skip


@pytest.mark.slow
def test_paired_runs_the_compiled_build_beside_the_source(image_wheel: Path, tmp_path: Path) -> None:
    """``--compare-to compiled``: the head side is the wheel's compiled package, the base this tree's source."""
    code = main(["specgate"], [1], 0.01, tmp_path / "out.json", compare_to="compiled", rounds=1, paired=True,
                wheel=image_wheel)  # fmt: skip
    assert code == 0
    saved = json.loads((tmp_path / "out.json").read_text())
    assert set(saved) == {"base", "head"}
    assert all(r["errors"] == 0 and r["requests"] > 10 and r["cpu_ms_per_request"] > 0
               for side in saved.values() for r in side)  # fmt: skip
