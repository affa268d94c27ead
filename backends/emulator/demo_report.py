"""The demo's per-task table and chart. All figures are EMULATED and measured through the gateway."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from backends.emulator.demo import PHASES, DemoPlan, LoadLevel, Sample

ALL = "all"


def _mean_ms(samples: Sequence[Sample]) -> float:
    return 1000 * statistics.fmean(s.latency_s for s in samples) if samples else float("nan")


def _route(samples: Sequence[Sample]) -> str:
    counts = Counter(s.pool for s in samples)
    pool, count = counts.most_common(1)[0] if counts else ("-", 0)
    share = count / len(samples) if samples else 0.0
    return pool if share == 1.0 else f"{pool} {share:.0%}"


TaskRow = tuple[str, str, float, float, float, float, float, int]


def task_rows(samples: Sequence[Sample], level: str) -> list[TaskRow]:
    """Per workload category: the adaptive route, acceptance, standard/speculative/rules/adaptive mean latency
    (ms), requests."""
    ok = [s for s in samples if s.level == level and s.status == 200]
    categories = sorted({s.arrival.item.category for s in ok})
    rows: list[TaskRow] = []
    for category in [*categories, ALL]:
        chosen = [s for s in ok if category in (ALL, s.arrival.item.category)]
        standard, speculative, rules, adaptive = ([s for s in chosen if s.phase == phase] for phase in PHASES)
        acceptance = statistics.fmean(s.arrival.item.acceptance for s in adaptive) if adaptive else float("nan")
        rows.append((
            category, _route(adaptive), acceptance, _mean_ms(standard), _mean_ms(speculative), _mean_ms(rules),
            _mean_ms(adaptive), len(adaptive),
        ))  # fmt: skip
    return rows


def demo_table(samples: Sequence[Sample], level: LoadLevel, plan: DemoPlan) -> Table:
    table = Table(
        title=f"EMULATED through the gateway: {level.name} load, {level.qps:g} QPS "
        f"(profile {plan.profile}, speed x{plan.speed:g}, wall-clock ms)"
    )
    columns = ("task", "adaptive route", "acceptance", "standard ms", "speculative ms", "rules ms", "adaptive ms",
               "adaptive vs rules", "n")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column in ("task", "adaptive route") else "right")
    for task, route, acceptance, standard, speculative, rules, adaptive, count in task_rows(samples, level.name):
        table.add_row(
            task, route, f"{acceptance:.2f}", f"{standard:.0f}", f"{speculative:.0f}", f"{rules:.0f}",
            f"{adaptive:.0f}", f"{rules / adaptive:.2f}x", str(count), style="bold" if task == ALL else None,
        )  # fmt: skip
    return table


def plot_demo(path: Path, samples: Sequence[Sample], plan: DemoPlan) -> None:
    """Grouped bars per task: standard, speculative, rules and adaptive mean latency, one panel per load level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(plan.levels), figsize=(6 * len(plan.levels), 4.2), squeeze=False)
    for axis, level in zip(axes[0], plan.levels, strict=True):
        rows = task_rows(samples, level.name)
        positions = range(len(rows))
        for offset, label in enumerate(PHASES):
            axis.bar(
                [p + (offset - 1.5) * 0.2 for p in positions], [row[3 + offset] for row in rows], width=0.2, label=label
            )
        axis.set_xticks(list(positions), [row[0] for row in rows], rotation=20)
        axis.set_title(f"EMULATED {level.name} load, {level.qps:g} QPS ({plan.profile} x{plan.speed:g})")
        axis.set_ylabel("mean latency through the gateway, ms")
        axis.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
