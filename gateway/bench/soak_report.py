"""The soak's table, verdicts and plot (``specgate bench soak``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from gateway.bench.soak import RATIO_TARGET, RSS_TARGET, Phase, Sample, SoakResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes

MAX_ROWS = 24
CPU_BOUND = 0.9  # a share of a core (the gateway, the apparatus) or of the machine past which it limits the run
LAG_TARGET_MS = 10.0  # issue 30: the event loop lags at most this in every 5 s window


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def samples_table(result: SoakResult) -> Table:
    samples = result.gateway.samples
    step = max(1, -(-len(samples) // MAX_ROWS))
    shown = samples[::step] + ([samples[-1]] if samples and (len(samples) - 1) % step else [])
    warm = result.warm()
    base = warm[0].rss_mb if warm else None
    table = Table(title=f"soak samples: {result.config.streams} paced streams through specgate serve (every "
                        f"{step * result.config.sample_s:.0f} s shown)")  # fmt: skip
    for column in ("t s", "req/s", "done", "errors", "5xx", "RSS MiB", "vs warm", "fds", "loop lag ms",
                   "own lag ms", "CPU wait ms", "/metrics ms", "gw CPU", "app CPU", "machine"):  # fmt: skip
        table.add_column(column, justify="right")
    for s in shown:
        after = base is not None and s.rss_mb is not None and s.t_s >= result.config.warmup_s
        growth = f"{(s.rss_mb or 0) / (base or 1) - 1:+.1%}" if after else ""
        table.add_row(
            f"{s.t_s:.0f}", f"{s.rps:.1f}", str(s.completed), str(s.errors), _fmt(s.gateway_5xx, ".0f"),
            _fmt(s.rss_mb, ".1f"), growth, _fmt(s.fds, "d"), _fmt(s.loop_lag_ms, ".1f"),
            _fmt(s.own_lag_ms, ".1f"), _fmt(s.cpu_wait_ms, ".0f"),
            _fmt(s.scrape_ms, ".1f"),
            _fmt(s.gateway_cpu, ".0%"), _fmt(s.apparatus_cpu, ".0%"), _fmt(s.machine_busy, ".0%"),
        )  # fmt: skip
    return table


def summary_table(result: SoakResult) -> Table:
    table = Table(title="soak: direct vs through specgate (same load, before/after, this machine)")
    for column in ("target", "s", "streams", "requests", "steady req/s", "vs direct", "p50 ms", "p99 ms",
                   "TTFB p50", "TTFB p99", "errors"):  # fmt: skip
        table.add_column(column, justify="left" if column == "target" else "right")
    for p in (result.direct, result.gateway):
        ratio = "" if p is result.direct else f"{result.ratio:.3f}x"
        table.add_row(
            p.target, f"{p.duration_s:.0f}", str(result.config.streams), str(p.completed), f"{p.steady_rps:.1f}", ratio,
            f"{p.p50_ms:.0f}", f"{p.p99_ms:.0f}", f"{p.ttfb_p50_ms:.1f}", f"{p.ttfb_p99_ms:.1f}", str(p.errors),
        )  # fmt: skip
    return table


def stalls_table(result: SoakResult) -> Table | None:
    """What held the gateway's event loop besides requests, by source, over the whole run."""
    stalls = sorted(result.gateway.stalls, key=lambda s: -s.total_ms)
    if not stalls:
        return None
    minutes = result.gateway.duration_s / 60
    table = Table(title="what held the gateway's event loop besides requests (its own histograms, whole run)")
    for column in ("source", "count", "per min", "mean ms", "total ms", "> 10 ms", "longest <="):
        table.add_column(column, justify="left" if column == "source" else "right")
    for s in stalls:
        worst = "> 250 ms" if s.worst_le_ms is None else f"{s.worst_le_ms:g} ms"
        table.add_row(s.source, f"{s.count:.0f}", f"{s.count / minutes:.1f}", f"{s.total_ms / s.count:.2f}",
                      f"{s.total_ms:.0f}", f"{s.over_10ms:.0f}", worst)  # fmt: skip
    return table


def verdicts(result: SoakResult) -> list[str]:
    growth, slope = result.rss_growth(), result.rss_slope_mb_per_min()
    lags = [s.loop_lag_ms for s in result.gateway.samples if s.loop_lag_ms is not None]
    fds = [s.fds for s in result.warm() if s.fds is not None]
    mark = {True: "[green]ok[/]", False: "[red]MISSED[/]"}
    lines = [
        f"errors (client-side + gateway 5xx): {result.errors}  {mark[result.errors == 0]}",
        f"throughput vs direct: {result.ratio:.3f}x  {mark[result.ratio >= RATIO_TARGET]}",
    ]
    if growth is not None:
        lines.append(f"RSS growth after {result.config.warmup_s:.0f} s: {growth:+.2%} (target < {RSS_TARGET:.0%}), "
                     f"trend {slope or 0:+.2f} MiB/min  {mark[growth < RSS_TARGET]}")  # fmt: skip
    if lags:
        median = sorted(lags)[len(lags) // 2]
        over = [s for s in result.gateway.samples if s.loop_lag_ms is not None and s.loop_lag_ms > LAG_TARGET_MS]
        lines.append(f"event-loop lag (5 s windows): median {median:.1f} ms, max {max(lags):.1f} ms, "
                     f"{len(over)} of {len(lags)} windows over {LAG_TARGET_MS:g} ms  {mark[not over]}")  # fmt: skip
        owns = [s.own_lag_ms for s in result.gateway.samples if s.own_lag_ms is not None]
        if owns:
            own_over = sum(1 for lag in owns if lag > LAG_TARGET_MS)
            lines.append(f"  the gateway's own (less the loop thread's waits for a CPU): median "
                         f"{sorted(owns)[len(owns) // 2]:.1f} ms, max {max(owns):.1f} ms, {own_over} of {len(owns)} "
                         f"windows over {LAG_TARGET_MS:g} ms  {mark[own_over == 0]}")  # fmt: skip
    if fds:
        lines.append(f"open fds after the warm-up: {min(fds)}..{max(fds)}")
    lines += cpu_lines(result)
    by = next((s.gateway_5xx_by for s in reversed(result.gateway.samples) if s.gateway_5xx_by), None)
    if by:
        lines.append("gateway 5xx by status and reason: " + ", ".join(f"{k}: {v:.0f}" for k, v in sorted(by.items())))
    if result.gateway.probe_errors:
        lines.append(f"/metrics probes that failed: {len(result.gateway.probe_errors)} "
                     f"(first: {result.gateway.probe_errors[0]})")  # fmt: skip
    return lines


def _median(values: Sequence[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    return known[len(known) // 2] if known else None


def cpu_lines(result: SoakResult) -> list[str]:
    """Who had the CPU in the steady part of each phase, and what limits the throughput ratio, if anything."""
    lines = []
    shares: dict[str, tuple[float | None, float | None, float | None]] = {}
    for p in (result.direct, result.gateway):
        steady = [s for s in p.samples if s.t_s >= result.config.ramp_s]
        gateway = _median([s.gateway_cpu for s in steady])
        apparatus = _median([s.apparatus_cpu for s in steady])
        machine = _median([s.machine_busy for s in steady])
        shares[p.target] = (gateway, apparatus, machine)
        parts = [f"gateway {gateway:.0%} of a core"] if gateway is not None else []
        parts += [f"apparatus (busier of load generator, upstream) {apparatus:.0%}"] if apparatus is not None else []
        parts += [f"machine {machine:.0%} busy (every process)"] if machine is not None else []
        if parts:
            lines.append(f"CPU, {p.target} (steady medians): " + ", ".join(parts))
    gateway, apparatus, machine = shares.get(result.gateway.target, (None, None, None))
    if gateway is not None and gateway >= CPU_BOUND:
        lines.append(f"[yellow]the gateway is CPU-bound[/] (>= {CPU_BOUND:.0%} of its core): a shortfall is its own")
    elif machine is not None and machine >= CPU_BOUND:
        lines.append(f"[yellow]the machine was saturated[/] (>= {CPU_BOUND:.0%} busy, the gateway under it): a "
                     "shortfall is the machine's, not the gateway's; rerun on a quieter machine")  # fmt: skip
    elif apparatus is not None and apparatus >= CPU_BOUND:
        lines.append(f"[yellow]the apparatus is saturated[/] (a process >= {CPU_BOUND:.0%} of a core): the figures are "
                     "its own")  # fmt: skip
    return lines


def render(result: SoakResult, console: Console) -> None:
    console.print(samples_table(result))
    console.print(summary_table(result))
    stalls = stalls_table(result)
    if stalls is not None:
        console.print(stalls)
    for line in verdicts(result):
        console.print(line)


def plot(result: SoakResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples: list[Sample] = result.gateway.samples
    t = [s.t_s for s in samples]
    fig, _ = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    axes = fig.axes
    series: list[tuple[str, Sequence[float | None]]] = [
        ("RSS (MiB)", [s.rss_mb for s in samples]),
        ("open fds", [s.fds for s in samples]),
        ("event-loop lag, max of 5 s (ms)", [s.loop_lag_ms for s in samples]),
    ]
    for axis, (label, values) in zip(axes, series, strict=False):
        axis.plot(t, [float("nan") if v is None else v for v in values], marker=".")
        axis.set_ylabel(label)
        axis.axvline(result.config.warmup_s, color="grey", linestyle=":")
    _throughput(axes[3], result.gateway, result.direct)
    axes[3].set_xlabel("seconds")
    fig.suptitle(f"specgate soak: {result.config.streams} paced streams ({result.config.chunks} events x "
                 f"{result.config.pace_s * 1e3:.0f} ms), fake upstream")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _throughput(axis: Axes, gateway: Phase, direct: Phase) -> None:
    axis.plot([s.t_s for s in gateway.samples], [s.rps for s in gateway.samples], marker=".", label="specgate")
    axis.axhline(direct.steady_rps, color="green", linestyle="--", label="direct (steady)")
    axis.set_ylabel("req/s")
    axis.legend()
