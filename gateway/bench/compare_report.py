"""Output of ``specgate bench compare``: the rich table, the JSON document and the PNG plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gateway.bench.compare import CategoryResult


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}{suffix}"


def results_table(results: Sequence[CategoryResult], title: str) -> Table:
    table = Table(title=title)
    for header in (
        "conc",
        "category",
        "n",
        "accept",
        "std mean s",
        "std p95 s",
        "spec mean s",
        "spec p95 s",
        "TTFT std/spec ms",
        "TPOT std/spec ms",
        "out tok std/spec",
        "speedup lat",
        "speedup TPOT",
        "errors",
    ):
        table.add_column(header, justify="left" if header == "category" else "right")
    for r in results:
        std, spec = r.standard, r.speculative
        table.add_row(
            str(r.concurrency),
            r.category,
            str(std.requests),
            _fmt(r.acceptance_rate, 100, 1, "%"),
            _fmt(std.mean_latency_s),
            _fmt(std.p95_latency_s),
            _fmt(spec.mean_latency_s),
            _fmt(spec.p95_latency_s),
            f"{_fmt(std.mean_ttft_s, 1000, 0)}/{_fmt(spec.mean_ttft_s, 1000, 0)}",
            f"{_fmt(std.mean_tpot_s, 1000, 1)}/{_fmt(spec.mean_tpot_s, 1000, 1)}",
            f"{_fmt(std.mean_output_tokens, digits=0)}/{_fmt(spec.mean_output_tokens, digits=0)}",
            _fmt(r.speedup_latency, suffix="x"),
            _fmt(r.speedup_tpot, suffix="x"),
            f"{std.errors}/{spec.errors}",
        )
    return table


def print_table(results: Sequence[CategoryResult], meta: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(width=180)
    title = (
        f"bench compare: {meta['model']} (served by {meta['served_by']}), "
        f"{meta['items']} prompts, temperature {meta['temperature']}, {meta['duration_s']:.0f} s"
    )
    console.print(results_table(results, title))


def write_json(path: Path, results: Sequence[CategoryResult], meta: dict[str, Any]) -> None:
    document = {"meta": meta, "results": [r.to_json() for r in results]}
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def write_plot(path: Path, results: Sequence[CategoryResult], meta: dict[str, Any]) -> None:
    """Speedup (TPOT and latency) per category, one group of bars per concurrency level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = sorted({r.category for r in results})
    levels = sorted({r.concurrency for r in results})
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    width = 0.8 / max(1, len(levels))
    for axis, metric in zip(axes, ("speedup_tpot", "speedup_latency"), strict=True):
        for offset, level in enumerate(levels):
            row = {r.category: r for r in results if r.concurrency == level}
            values = [getattr(row[c], metric) or 0.0 if c in row else 0.0 for c in categories]
            positions = [i + offset * width for i in range(len(categories))]
            bars = axis.bar(positions, values, width, label=f"concurrency {level}")
            for bar, category in zip(bars, categories, strict=True):
                rate = row[category].acceptance_rate if category in row else None
                if rate is not None:
                    axis.annotate(
                        f"{rate:.0%}",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center",
                        va="bottom",
                        fontsize=7,
                    )
        axis.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        axis.set_xticks([i + width * (len(levels) - 1) / 2 for i in range(len(categories))], categories)
        axis.set_title("speedup, time per output token" if metric == "speedup_tpot" else "speedup, mean latency")
    axes[0].set_ylabel("standard / speculative (labels: acceptance)")
    axes[0].legend(fontsize=8)
    figure.suptitle(f"{meta['model']} served by {meta['served_by']}: speculative vs standard pool", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
