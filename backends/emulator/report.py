"""Summaries, rich tables and matplotlib charts for simulated and demo runs. Every title says EMULATED."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from backends.emulator.simulate import POLICIES, RequestResult


@dataclass(frozen=True, slots=True)
class Summary:
    requests: int
    mean_s: float
    p50_s: float
    p95_s: float
    mean_ttft_s: float
    p95_ttft_s: float
    speculative_share: float


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summarise(results: Sequence[RequestResult]) -> Summary:
    latencies = [result.latency_s for result in results]
    ttfts = [result.ttft_s for result in results]
    speculative = sum(1 for result in results if result.pool == "speculative")
    return Summary(
        len(results),
        statistics.fmean(latencies),
        percentile(latencies, 0.5),
        percentile(latencies, 0.95),
        statistics.fmean(ttfts),
        percentile(ttfts, 0.95),
        speculative / len(results),
    )


def level_table(qps: float, profile: str, runs: Mapping[str, Sequence[RequestResult]]) -> Table:
    table = Table(title=f"EMULATED simulation, profile {profile}, {qps:g} QPS (virtual time)")
    for column in (
        "policy",
        "requests",
        "mean s",
        "p50 s",
        "p95 s",
        "mean TTFT s",
        "p95 TTFT s",
        "to speculative",
        "mean vs always-standard",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    baseline = summarise(runs["always-standard"]).mean_s
    for policy in POLICIES:
        if policy not in runs:
            continue
        s = summarise(runs[policy])
        table.add_row(
            policy,
            str(s.requests),
            f"{s.mean_s:.2f}",
            f"{s.p50_s:.2f}",
            f"{s.p95_s:.2f}",
            f"{s.mean_ttft_s:.3f}",
            f"{s.p95_ttft_s:.3f}",
            f"{s.speculative_share:.0%}",
            f"{baseline / s.mean_s:.2f}x",
        )
    return table


def plot_levels(path: Path, profile: str, levels: Mapping[float, Mapping[str, Sequence[RequestResult]]]) -> None:
    """Mean and p95 latency against QPS, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    qps = sorted(levels)
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for policy in POLICIES:
        summaries = [summarise(levels[level][policy]) for level in qps]
        axes[0].plot(qps, [s.mean_s for s in summaries], marker="o", label=policy)
        axes[1].plot(qps, [s.p95_s for s in summaries], marker="o", label=policy)
    for axis, title in zip(axes, ("mean latency", "p95 latency"), strict=True):
        axis.set_title(f"{title} (EMULATED, {profile})")
        axis.set_xlabel("offered load, requests/s")
        axis.set_ylabel("seconds")
        axis.set_yscale("log")
        axis.grid(True, alpha=0.3)
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
