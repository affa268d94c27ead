"""Summaries, rich tables and matplotlib charts for simulated and demo runs. Every title says EMULATED."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from backends.emulator.simulate import POLICIES, RequestResult

if TYPE_CHECKING:
    from backends.emulator.evaluate import Level, ScenarioRun, Target


@dataclass(frozen=True, slots=True)
class Summary:
    requests: int
    mean_s: float
    p50_s: float
    p95_s: float
    mean_ttft_s: float
    p95_ttft_s: float
    speculative_share: float
    # How much the speculative share moves from second to second (standard deviation across the arrival
    # seconds that had at least SPLIT_MIN_PER_S requests; 0 with fewer than two such seconds). Herding, all
    # of a second's requests to one pool and then back, shows as a spread near 0.5.
    share_spread: float


SPLIT_MIN_PER_S = 5


def shares_per_second(results: Sequence[RequestResult]) -> list[tuple[int, float]]:
    """(second, share of that second's arrivals sent to the speculative pool), over the seconds that had
    at least ``SPLIT_MIN_PER_S`` arrivals."""
    return split_per_second((result.arrival_s, result.pool) for result in results)


def split_per_second(sent: Iterable[tuple[float, str]]) -> list[tuple[int, float]]:
    """The same from (seconds since the start, pool) pairs: requests timed by any clock (the HTTP tests)."""
    seconds: dict[int, list[int]] = {}
    for at_s, pool in sent:
        seconds.setdefault(int(at_s), []).append(pool == "speculative")
    return [(second, sum(v) / len(v)) for second, v in sorted(seconds.items()) if len(v) >= SPLIT_MIN_PER_S]


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
        statistics.pstdev(shares) if len(shares := [share for _, share in shares_per_second(results)]) > 1 else 0.0,
    )


def levels_table(profile: str, capacity: float, levels: Sequence[Level]) -> Table:
    """One row per load level: each policy's mean (p95) latency, and the adaptive policy against the bounds
    (in steady state when the levels ran ``adaptive-warm``, else from its cold start)."""
    title = f"EMULATED simulation, profile {profile}: mean (p95) latency in s; one pool ~{capacity:.1f} QPS"
    table = Table(title=title)
    policies = [p for p in POLICIES if p in levels[0].summaries]
    ours = "adaptive-warm" if "adaptive-warm" in policies else "adaptive"
    bounds = [b for b in ("best fixed", "clairvoyant", "informed") if b == "best fixed" or b in policies]
    for column in ("load", "QPS", *policies, *(f"{ours} / {b}" for b in bounds), f"{ours} to spec (sd/s)", "explored"):
        table.add_column(column, justify="right")
    for level in levels:
        s = level.summaries
        cells = [f"{s[p].mean_s:.2f} ({s[p].p95_s:.1f})" for p in policies]
        adaptive = s.get(ours)
        values = {"best fixed": min(s["always-standard"].mean_s, s["always-speculative"].mean_s)}
        values.update({b: s[b].mean_s for b in bounds if b in s})
        table.add_row(
            f"{level.share:.0%}", f"{level.qps:.1f}", *cells,
            *(f"{adaptive.mean_s / values[b]:.3f}x" if adaptive else "-" for b in bounds),
            f"{adaptive.speculative_share:.0%} ({adaptive.share_spread * 100:.0f})" if adaptive else "-",
            f"{level.explored:.1%}",
        )  # fmt: skip
    return table


def scenarios_table(profile: str, runs: Sequence[ScenarioRun]) -> Table:
    table = Table(title=f"EMULATED scenarios, profile {profile}: mean latency in s, cold start")
    policies = [p for p in POLICIES if runs and p in runs[0].summaries]
    for column in ("scenario", "peak QPS", *policies, "learned after", "relearned after change", "explored"):
        table.add_column(column, justify="right")
    for run in runs:
        table.add_row(
            run.name, f"{run.qps:.1f}", *(f"{run.summaries[p].mean_s:.2f}" for p in policies),
            f"{run.learned_after} req" if run.learned_after is not None else "never",
            f"{run.relearned_after} req" if run.relearned_after is not None else "-",
            f"{run.explored:.1%}",
        )  # fmt: skip
    return table


def targets_table(profile: str, targets: Sequence[Target]) -> Table:
    table = Table(title=f"adaptive policy targets, profile {profile} (EMULATED)")
    for column in ("target", "met", "measured"):
        table.add_column(column)
    for target in targets:
        met = "n/a" if target.met is None else ("yes" if target.met else "NO")
        table.add_row(target.name, met, target.detail)
    return table


def plot_evaluation(path: Path, profile: str, levels: Sequence[Level], runs: Sequence[ScenarioRun]) -> None:
    """Mean and p95 latency against load per policy, the adaptive policy's learning curves, and its share to
    the speculative pool second by second at a few levels (it should settle, not swing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 4, figsize=(21, 4.4))
    shares = [level.share * 100 for level in levels]
    for policy in POLICIES:
        if policy not in levels[0].summaries:
            continue
        axes[0].plot(shares, [lv.summaries[policy].mean_s for lv in levels], marker="o", label=policy)
        axes[1].plot(shares, [lv.summaries[policy].p95_s for lv in levels], marker="o", label=policy)
    for axis, title in zip(axes[:2], ("mean latency", "p95 latency"), strict=True):
        axis.set_title(f"{title} (EMULATED, {profile})")
        axis.set_xlabel("offered load, % of one pool's capacity")
        axis.set_ylabel("seconds")
        axis.set_yscale("log")
        axis.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    for run in runs:
        axes[2].plot([end for end, _ in run.curve], [ratio for _, ratio in run.curve], label=run.name)
    axes[2].axhline(1.0, color="grey", linewidth=0.8)
    axes[2].set_title("learning curve: adaptive / clairvoyant (EMULATED)")
    axes[2].set_xlabel("requests since a cold start")
    axes[2].set_ylabel("mean latency ratio per 100 requests")
    axes[2].grid(True, alpha=0.3)
    axes[2].legend(fontsize=8)
    longest = max((len(lv.split) for lv in levels), default=0)
    shown = [lv for lv in levels if longest and len(lv.split) >= 0.8 * longest]  # enough arrivals every second
    for level in shown[:: max(1, -(-len(shown) // 4))]:  # at most four levels, spread over the range
        present = dict(level.split)  # a second with too few arrivals breaks the line
        seconds = range(level.split[0][0], level.split[-1][0] + 1)
        axes[3].plot(seconds, [present.get(second, float("nan")) for second in seconds],
                     label=f"{level.share:.0%}", linewidth=0.9)  # fmt: skip
    axes[3].set_ylim(0, 1)
    axes[3].set_title("adaptive, cold: share to speculative per s (EMULATED)")
    axes[3].set_xlabel("virtual seconds since the start")
    axes[3].set_ylabel("share of the second's arrivals")
    axes[3].grid(True, alpha=0.3)
    axes[3].legend(fontsize=8, title="load")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
