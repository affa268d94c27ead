"""The demo's per-task table and chart. All figures are EMULATED and measured through the gateway."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from backends.emulator.demo import DemoPlan, LoadLevel, Sample

ALL = "all"


def _mean_ms(samples: Sequence[Sample]) -> float:
    return 1000 * statistics.fmean(s.latency_s for s in samples) if samples else float("nan")


def _route(samples: Sequence[Sample]) -> str:
    counts = Counter(s.pool for s in samples)
    pool, count = counts.most_common(1)[0] if counts else ("-", 0)
    share = count / len(samples) if samples else 0.0
    return pool if share == 1.0 else f"{pool} {share:.0%}"


def task_rows(samples: Sequence[Sample], level: str) -> list[tuple[str, str, float, float, float, float, int]]:
    """Per workload category: route, acceptance, standard/speculative/routed mean latency (ms), requests."""
    ok = [s for s in samples if s.level == level and s.status == 200]
    categories = sorted({s.arrival.item.category for s in ok})
    rows = []
    for category in [*categories, ALL]:
        chosen = [s for s in ok if category in (ALL, s.arrival.item.category)]
        by_phase = {phase: [s for s in chosen if s.phase == phase] for phase in ("standard", "speculative", "routed")}
        routed = by_phase["routed"]
        acceptance = statistics.fmean(s.arrival.item.acceptance for s in routed) if routed else float("nan")
        rows.append(
            (
                category,
                _route(routed),
                acceptance,
                _mean_ms(by_phase["standard"]),
                _mean_ms(by_phase["speculative"]),
                _mean_ms(routed),
                len(routed),
            )
        )
    return rows


def demo_table(samples: Sequence[Sample], level: LoadLevel, plan: DemoPlan) -> Table:
    table = Table(
        title=f"EMULATED through the gateway: {level.name} load, {level.qps:g} QPS "
        f"(profile {plan.profile}, speed x{plan.speed:g}, wall-clock ms)"
    )
    for column in (
        "task",
        "route chosen",
        "acceptance",
        "standard ms",
        "speculative ms",
        "routed ms",
        "speedup vs standard",
        "n",
    ):
        table.add_column(column, justify="left" if column in ("task", "route chosen") else "right")
    for task, route, acceptance, standard, speculative, routed, count in task_rows(samples, level.name):
        table.add_row(
            task,
            route,
            f"{acceptance:.2f}",
            f"{standard:.0f}",
            f"{speculative:.0f}",
            f"{routed:.0f}",
            f"{standard / routed:.2f}x",
            str(count),
            style="bold" if task == ALL else None,
        )
    return table


def plot_demo(path: Path, samples: Sequence[Sample], plan: DemoPlan) -> None:
    """Grouped bars per task: standard, speculative and routed mean latency, one panel per load level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(plan.levels), figsize=(6 * len(plan.levels), 4.2), squeeze=False)
    for axis, level in zip(axes[0], plan.levels, strict=True):
        rows = task_rows(samples, level.name)
        positions = range(len(rows))
        for offset, (label, column) in enumerate((("standard", 3), ("speculative", 4), ("routed", 5))):
            axis.bar(
                [p + (offset - 1) * 0.27 for p in positions], [row[column] for row in rows], width=0.27, label=label
            )
        axis.set_xticks(list(positions), [row[0] for row in rows], rotation=20)
        axis.set_title(f"EMULATED {level.name} load, {level.qps:g} QPS ({plan.profile} x{plan.speed:g})")
        axis.set_ylabel("mean latency through the gateway, ms")
        axis.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
