"""The simulator's summaries and tables: the per-second split that shows herding, tables that fit an 80-column
terminal, the progress bars, and figures that do not depend on the workers."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from backends.emulator.evaluate import Level, ScenarioRun
from backends.emulator.report import levels_table, ratios_table, scenarios_table, shares_per_second, summarise
from backends.emulator.simulate import (
    ADAPTIVE,
    ADAPTIVE_WARM,
    ALWAYS_SPECULATIVE,
    ALWAYS_STANDARD,
    MYOPIC,
    PERFECT,
    RULES,
    RequestResult,
)


def results(pools: list[str], per_second: int) -> list[RequestResult]:
    """One result per pool given, ``per_second`` arrivals in each virtual second."""
    return [RequestResult(i, f"item-{i}", "chat", "chat", pool, "fastest", i / per_second, 0.5, 64, 0.1, 1.0)
            for i, pool in enumerate(pools)]  # fmt: skip


def test_a_steady_split_has_no_spread_and_a_herd_has_the_widest() -> None:
    steady = results(["speculative", "standard"] * 50, per_second=10)  # half and half in every second
    herd = results((["speculative"] * 10 + ["standard"] * 10) * 5, per_second=10)  # all, then none, ...
    assert [share for _, share in shares_per_second(steady)] == [0.5] * 10
    assert summarise(steady).speculative_share == summarise(herd).speculative_share == 0.5
    assert summarise(steady).share_spread == 0.0
    assert summarise(herd).share_spread == pytest.approx(0.5)


def test_seconds_with_too_few_arrivals_are_left_out_of_the_spread() -> None:
    sparse = results(["speculative", "standard", "standard", "speculative"], per_second=1)  # one a second
    assert shares_per_second(sparse) == [] and summarise(sparse).share_spread == 0.0


def _levels(seeds: int = 2) -> list[list[Level]]:
    """Levels with every policy, and means as wide as they get (over 100 s)."""
    from backends.emulator.report import Summary

    values = {ALWAYS_STANDARD: 54.8, ALWAYS_SPECULATIVE: 127.53, RULES: 54.63, ADAPTIVE: 14.06, ADAPTIVE_WARM: 12.82,
              PERFECT: 12.0, MYOPIC: 12.24}  # fmt: skip
    summaries = {p: Summary(100, m, m, 2 * m, 0.1, 0.2, 0.45, 0.1) for p, m in values.items()}
    return [[Level(share, 92.6 * share, seed, summaries, 0.012, 100, 9, []) for share in (0.1, 1.0, 2.0)]
            for seed in range(seeds)]  # fmt: skip


def _render(table: object, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text().splitlines()


def test_the_level_tables_fit_an_80_column_terminal_with_distinct_column_names() -> None:
    runs = _levels()
    cold_start = {p: s for p, s in runs[0][0].summaries.items() if p not in (ADAPTIVE_WARM, PERFECT)}
    scenario = ScenarioRun("mix-shift", 0.7, 32.4, 0, cold_start, [], 1000, 690, 0.001)
    tables = [levels_table("a100-70b-draft", 46.3, runs), ratios_table("a100-70b-draft", runs),
              scenarios_table("a100-70b-draft", [[scenario], [scenario]])]  # fmt: skip
    for table in tables:
        lines = _render(table)
        assert max(len(line) for line in lines) <= 80
        assert not any("…" in line for line in lines), "\n".join(lines)
    header = next(line for line in _render(tables[0]) if "load" in line)
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")] == [
        "load", "QPS", "std", "spec", "rules", "cold", "warm", "perfect", "myopic"
    ]  # fmt: skip
    assert "128" in "".join(_render(tables[0]))  # 127.53 s in five characters


def test_a_progress_bar_per_profile_shows_in_a_terminal_and_nowhere_else() -> None:
    from backends.emulator.cli_simulate import progress_bars
    from backends.emulator.policies import PolicySet
    from backends.emulator.profiles import load_profile
    from backends.emulator.sweep import Plan
    from backends.workloads.loader import load_workload
    from gateway.rules import reference_rules

    plans = [Plan(load_profile(name), load_workload(), PolicySet(reference_rules()), (0.1, 1.0), (0, 1), ("drift",))
             for name in ("a100-70b-draft", "h100-8b")]  # fmt: skip
    for terminal in (True, False):
        out = io.StringIO()
        with progress_bars(plans, Console(file=out, force_terminal=terminal, width=100)) as done:
            for job in plans[1].jobs():
                done(job)
        text = out.getvalue()
        if terminal:
            assert "6/6" in text and "h100-8b: drift, seed 1" in text and "0/6" in text  # a100 has not moved
        else:
            assert text == ""


def test_the_figures_do_not_depend_on_how_many_workers_ran_them() -> None:
    from backends.emulator.evaluate import Options
    from backends.emulator.policies import PolicySet
    from backends.emulator.profiles import load_profile
    from backends.emulator.sweep import Plan, by_seed, run_jobs
    from backends.workloads.loader import load_workload
    from gateway.rules import default_rules, reference_rules

    plan = Plan(load_profile("h100-8b"), load_workload(), PolicySet(reference_rules(), default_rules()), (0.2, 1.0),
                (3, 4), ("drift",), 0.7, 20.0, Options(duration_s=10.0, warmup_s=2.0))  # fmt: skip
    jobs = list(plan.jobs())
    serial, spread = run_jobs(jobs, 1), run_jobs(jobs, 2)
    assert serial == spread
    levels, runs = by_seed(plan, serial)
    assert [[lv.share for lv in seed] for seed in levels] == [[0.2, 1.0], [0.2, 1.0]]
    assert [lv.seed for seed in levels for lv in seed] == [3, 3, 4, 4] and [r[0].seed for r in runs] == [3, 4]
    assert levels[0][0].summaries != levels[1][0].summaries  # the seeds differ
