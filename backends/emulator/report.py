"""Summaries, rich tables and matplotlib charts for simulated and demo runs. Every title says EMULATED."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from backends.emulator.simulate import (
    ADAPTIVE,
    ADAPTIVE_WARM,
    ALWAYS_SPECULATIVE,
    ALWAYS_STANDARD,
    DYNAMIC_POOL,
    MYOPIC,
    PERFECT,
    POLICIES,
    RULES,
    SESSION_POLICIES,
    RequestResult,
)

if TYPE_CHECKING:
    from backends.emulator.evaluate import Level, ScenarioRun
    from backends.emulator.session_sim import SessionLevel
    from backends.emulator.targets import Target


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


# Short, distinct column names (an 80-column terminal shows a level table whole); the captions spell them out.
SHORT = {
    ALWAYS_STANDARD: "std", ALWAYS_SPECULATIVE: "spec", RULES: "rules", ADAPTIVE: "cold", ADAPTIVE_WARM: "warm",
    PERFECT: "perfect", MYOPIC: "myopic", DYNAMIC_POOL: "dyn",
}  # fmt: skip
LEGEND = (
    "std, spec: always-standard, always-speculative; cold, warm: adaptive from a cold start, in steady state; "
    "perfect: perfect-predictor (the bound); myopic: knows each request's truth, blind to the delay it adds; "
    "dyn: one pool of all the engines, each speculative with vLLM's dynamic k table (the alternative to two pools)"
)


def _seeds(runs: Sequence[Sequence[object]]) -> str:
    return f"{len(runs)} seed{'s' if len(runs) != 1 else ''}"


def _mean_of(summaries: Iterable[Summary | SessionSummary], stat: str) -> float:
    return statistics.fmean(float(getattr(summary, stat)) for summary in summaries)


def _seconds(value: float) -> str:
    """At most five characters: 0.47, 12.4, 127."""
    return f"{value:.2f}" if value < 9.995 else f"{value:.1f}" if value < 99.95 else f"{value:.0f}"


def levels_table(profile: str, capacity: float, runs: Sequence[Sequence[Level]]) -> Table:
    """One row per load level: each policy's mean latency, averaged over the seeds."""
    title = f"EMULATED {profile}: mean latency (s), mean of {_seeds(runs)}; one pool ~{capacity:.1f} QPS"
    table = Table(title=title, caption=LEGEND)
    policies = [p for p in POLICIES if p in runs[0][0].summaries]
    for column in ("load", "QPS", *(SHORT[p] for p in policies)):
        table.add_column(column, justify="right")
    for index, level in enumerate(runs[0]):
        at = [levels[index] for levels in runs]
        cells = [_seconds(_mean_of((lv.summaries[p] for lv in at), "mean_s")) for p in policies]
        table.add_row(f"{level.share:.0%}", f"{level.qps:.1f}", *cells)
    return table


def ratios_table(profile: str, runs: Sequence[Sequence[Level]]) -> Table:
    """One row per level: the cold start against the references (mean of the seeds' ratios), the steady state
    against the bound, and the cold start's split (share to the speculative pool and its per-second spread)."""
    table = Table(
        title=f"EMULATED {profile}: adaptive against the references, mean of {_seeds(runs)}",
        caption="x/best: against the better fixed pool (mean, p95); /perf: perfect-predictor; /dyn: one dynamic-k "
        "pool at equal hardware; to spec: the cold start's share to the speculative pool (its sd from second to "
        "second, in points); expl: explored",
    )  # fmt: skip
    has = runs[0][0].summaries
    columns: list[tuple[str, Callable[[Level], float]]] = [
        ("cold\n/best", lambda lv: lv.vs_best(ADAPTIVE)), ("p95\n/best", lambda lv: lv.vs_best(ADAPTIVE, "p95_s")),
    ]  # fmt: skip
    if PERFECT in has:
        columns += [("cold\n/perf", lambda lv: lv.over(ADAPTIVE, PERFECT)),
                    ("warm\n/perf", lambda lv: lv.over(ADAPTIVE_WARM, PERFECT))]  # fmt: skip
    columns.append(("cold\n/rules", lambda lv: lv.over(ADAPTIVE, RULES)))
    if DYNAMIC_POOL in has:
        columns.append(("cold\n/dyn", lambda lv: lv.over(ADAPTIVE, DYNAMIC_POOL)))
    for column in ("load", *(name for name, _ in columns), "to spec\n(sd)", "expl"):
        table.add_column(column, justify="right")
    for index, level in enumerate(runs[0]):
        at = [levels[index] for levels in runs]
        ratios = [f"{statistics.fmean(ratio(lv) for lv in at):.3f}" for _, ratio in columns]
        cold = [lv.summaries[ADAPTIVE] for lv in at]
        split = f"{_mean_of(cold, 'speculative_share'):.0%} ({_mean_of(cold, 'share_spread') * 100:.0f})"
        explored = f"{statistics.fmean(lv.explored for lv in at):.1%}"
        table.add_row(f"{level.share:.0%}", *ratios, split, explored)
    return table


def scenarios_table(profile: str, runs: Sequence[Sequence[ScenarioRun]]) -> Table:
    """Per scenario, each policy's mean latency and the requests until the cold start settled (mean of the
    seeds / the worst seed)."""
    first = runs[0][0]
    table = Table(
        title=f"EMULATED {profile} scenarios, peak {first.share:.0%} load ({first.qps:.1f} QPS), {_seeds(runs)}: "
        "mean latency (s), cold start",
        caption="learned, after change: requests until within 10% of steady state from the start, after the "
        "change (mean/worst seed)",
    )  # fmt: skip
    policies = [p for p in POLICIES if p in first.summaries]
    for column in ("scenario", *(SHORT[p] for p in policies), "learned", "after\nchange", "expl"):
        table.add_column(column, justify="right")
    for index, run in enumerate(runs[0]):
        at = [seed[index] for seed in runs]
        cells = [_seconds(_mean_of((r.summaries[p] for r in at), "mean_s")) for p in policies]
        table.add_row(
            run.name, *cells, _requests([r.learned_after for r in at]),
            _requests([r.relearned_after for r in at]) if run.relearned_after is not None else "-",
            f"{statistics.fmean(r.explored for r in at):.1%}",
        )  # fmt: skip
    return table


def _requests(values: Sequence[int | None]) -> str:
    """The mean and the worst of a count per seed ("never" when a seed never got there)."""
    if None in values:
        return f"never:{sum(v is None for v in values)}"
    counts = [v for v in values if v is not None]
    return f"{statistics.fmean(counts):.0f}/{max(counts)}"


def targets_table(profile: str, targets: Sequence[Target]) -> Table:
    seeds = targets[0].seeds if targets else 1
    table = Table(title=f"adaptive policy targets, profile {profile} (EMULATED, {seeds} seeds)")
    for column in ("target", "met", "mean over seeds", "worst seed", "seeds missing"):
        table.add_column(column)
    for target in targets:
        table.add_row(target.name, _met(target.met), target.mean, target.worst, f"{target.failing}/{target.seeds}")
    return table


def summary_table(targets: Mapping[str, Sequence[Target]]) -> Table:
    """Met or not, per target and profile (judged on the mean over seeds)."""
    table = Table(title="targets met per profile (EMULATED, mean over seeds)")
    table.add_column("target")
    for profile in targets:
        table.add_column(profile, justify="center")
    names = list(dict.fromkeys(t.name for profile_targets in targets.values() for t in profile_targets))
    for name in names:
        found = [{t.name: t for t in profile_targets}.get(name) for profile_targets in targets.values()]
        table.add_row(name, *(_met(t.met) if t is not None else "-" for t in found))
    return table


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """A session workload's figures for one policy: TTFT of the turns that resend a history, end to end."""

    requests: int
    later_turns: int  # turns >= 2
    ttft_p50_later_s: float  # median TTFT of turns >= 2 (nan when there are none)
    ttft_p50_first_s: float  # median TTFT of first turns (nan when there are none)
    mean_s: float  # mean end to end, every turn
    p95_s: float
    cached_share: float  # of the prompt tokens, found in a prefix cache
    speculative_share: float


def summarise_sessions(results: Sequence[RequestResult]) -> SessionSummary:
    later = [r.ttft_s for r in results if r.turn >= 2]
    first = [r.ttft_s for r in results if r.turn == 1]
    latencies = [r.latency_s for r in results]
    prompt = sum(r.prompt_tokens for r in results)
    return SessionSummary(
        len(results), len(later), percentile(later, 0.5) if later else math.nan,
        percentile(first, 0.5) if first else math.nan, statistics.fmean(latencies), percentile(latencies, 0.95),
        sum(r.cached_tokens for r in results) / prompt if prompt else 0.0,
        sum(1 for r in results if r.pool == "speculative") / len(results),
    )  # fmt: skip


SESSION_LEGEND = (
    "Means over the seeds; load: a share of one pool's capacity. adaptive: specgate's two pools, the shipped "
    "adaptive rules (cold start), replica by power of two choices on booked tokens (cache-blind, the gateway "
    "with its index off); adaptive-prefix: the same, replica by the gateway's prefix index; adaptive-cache: "
    "that, and the pool choice counts each pool's expected cached "
    "prompt; plain-/dynamic-prefix: every engine standard / speculative with dynamic k, "
    "prefix-aware load-aware replica choice; plain-sticky: a session back on its first replica; plain-blind: "
    "fewest in flight. Equal hardware: 2 x replicas engines each. TTFT t>=2: median TTFT of turns 2 and later"
)


def sessions_table(profile: str, capacity: float, runs: Sequence[Sequence[SessionLevel]], title: str = "") -> Table:
    """One row per level and policy, means over the seeds: TTFT p50 of turns >= 2 (ms), of first turns, mean
    and p95 end to end (s), the share of prompt tokens found cached, the share sent to speculation (80 columns)."""
    table = Table(
        title=f"EMULATED {profile} sessions{title}; {_seeds(runs)}; pool ~{capacity:.1f} QPS",
        caption=SESSION_LEGEND,
    )  # fmt: skip
    for column in ("load", "policy", "TTFT\nt>=2 ms", "TTFT\nt1 ms", "e2e\nmean s", "e2e\np95 s", "cached", "to\nspec"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for index, level in enumerate(runs[0]):
        at = [levels[index] for levels in runs]
        for policy in (p for p in SESSION_POLICIES if p in level.summaries):
            summaries = [lv.summaries[policy] for lv in at]
            table.add_row(
                f"{level.share:.0%}", policy, f"{_mean_of(summaries, 'ttft_p50_later_s') * 1000:.0f}",
                f"{_mean_of(summaries, 'ttft_p50_first_s') * 1000:.0f}", _seconds(_mean_of(summaries, "mean_s")),
                _seconds(_mean_of(summaries, "p95_s")), f"{_mean_of(summaries, 'cached_share'):.0%}",
                f"{_mean_of(summaries, 'speculative_share'):.0%}",
            )  # fmt: skip
    return table


def _met(met: bool | None) -> str:
    return "n/a" if met is None else ("yes" if met else "NO")


def plot_evaluation(
    path: Path, profile: str, runs: Sequence[Sequence[Level]], scenarios: Sequence[Sequence[ScenarioRun]]
) -> None:
    """Mean and p95 latency against load per policy (means over the seeds), the adaptive policy's learning
    curves, and its share to the speculative pool second by second at a few levels (the first seed's: it
    should settle, not swing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 4, figsize=(21, 4.4))
    levels, first_runs = runs[0], scenarios[0] if scenarios else []
    shares = [level.share * 100 for level in levels]
    for policy in POLICIES:
        if policy not in levels[0].summaries:
            continue
        for axis, stat in zip(axes[:2], ("mean_s", "p95_s"), strict=True):
            values = [_mean_of((seed[i].summaries[policy] for seed in runs), stat) for i in range(len(levels))]
            axis.plot(shares, values, marker="o", label=policy)
    for axis, title in zip(axes[:2], ("mean latency", "p95 latency"), strict=True):
        axis.set_title(f"{title} (EMULATED, {profile}, {_seeds(runs)})")
        axis.set_xlabel("offered load, % of one pool's capacity")
        axis.set_ylabel("seconds")
        axis.set_yscale("log")
        axis.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    for run in first_runs:
        axes[2].plot([end for end, _ in run.curve], [ratio for _, ratio in run.curve], label=run.name)
    axes[2].axhline(1.0, color="grey", linewidth=0.8)
    axes[2].set_title("learning curve: adaptive / myopic (EMULATED)")
    axes[2].set_xlabel("requests since a cold start")
    axes[2].set_ylabel("mean latency ratio per 100 requests")
    axes[2].grid(True, alpha=0.3)
    if first_runs:
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
    if shown:
        axes[3].legend(fontsize=8, title="load")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
