"""``specgate bench soak``: the short CI version (about a minute) asserts 0 errors and no RSS growth trend; the
helpers are checked on known inputs. The full figures come from ``specgate bench soak`` (docs/operating.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console

from gateway.bench import soak, soak_report
from gateway.bench.soak import Phase, Sample, SoakConfig, SoakResult, gateway_gauges, stall_sources
from gateway.metrics import GatewayMetrics

# a minute through the gateway, as the issue asks of the CI version; the RSS trend is fitted after the warm-up
CI = SoakConfig(streams=64, duration_s=60.0, direct_s=8.0, chunks=32, pace_s=0.05, sample_s=2.0, warmup_s=15.0)
SLOPE_BOUND_MIB_PER_MIN = 1.0  # a leak of 1 kB per request at this load (~40 req/s) would show ~2.3 MiB/min


def phase(samples: list[Sample], rps: float = 10.0) -> Phase:
    return Phase("t", 60.0, 100, 0, rps, 1.0, 2.0, 0.1, 0.2, samples)


@pytest.mark.parametrize(
    ("per_min", "growth"),
    [(0.0, 0.0), (1.0, 0.5 / 100), (-2.0, -1.0 / 100)],  # MiB/min; growth over 30 s from 100 MiB
)
def test_rss_trend_and_growth_after_the_warm_up(per_min: float, growth: float) -> None:
    config = SoakConfig(warmup_s=30.0)
    rss = [500.0 if t < 30 else 100.0 + per_min * (t - 30) / 60 for t in range(0, 61, 5)]
    samples = [Sample(t, 0, 0, 0.0, rss_mb=r) for t, r in zip(range(0, 61, 5), rss, strict=True)]
    result = SoakResult(config, phase([]), phase(samples))
    assert result.rss_slope_mb_per_min() == pytest.approx(per_min, abs=1e-9)
    assert result.rss_growth() == pytest.approx(growth, abs=1e-9)  # the warm-up's 500 MiB is left out


def test_gateway_gauges_read_the_loop_lag_and_5xx_from_metrics() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    metrics.loop_lag.set(0.012)
    metrics.loop_own_lag.set(0.004)
    metrics.count_request("standard", "default", "chat", 200)
    metrics.count_request("standard", "default", "chat", 502)
    metrics.count_request("none", "rejected", "none", 503)
    lag, own, errors = gateway_gauges(generate_latest(registry).decode())
    assert lag == pytest.approx(0.012) and own == pytest.approx(0.004)
    assert errors == {"502 default": 1, "503 rejected": 1}


def test_stall_sources_sum_each_generation_and_job_from_metrics() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    for pause in (0.0004, 0.003, 0.03):
        metrics.gc_pause.labels("1").observe(pause)
    metrics.background.labels("snapshot").observe(0.0011)
    metrics.background.labels("metrics-render").observe(0.3)  # past the last bucket
    stalls = {s.source: s for s in stall_sources(generate_latest(registry).decode())}
    assert set(stalls) == {"gc 1", "job snapshot", "job metrics-render"}  # unobserved series are left out
    gen1 = stalls["gc 1"]
    assert gen1.count == 3 and gen1.total_ms == pytest.approx(33.4) and gen1.over_10ms == 1
    assert gen1.worst_le_ms == pytest.approx(50.0)
    assert stalls["job snapshot"].worst_le_ms == pytest.approx(2.0) and stalls["job snapshot"].over_10ms == 0
    assert stalls["job metrics-render"].worst_le_ms is None


@pytest.mark.slow
def test_short_soak_has_no_errors_and_no_rss_growth_trend(tmp_path: Path) -> None:
    console = Console(record=True, width=160)
    result = soak.run(CI, console)
    soak_report.render(result, console)
    soak_report.plot(result, tmp_path / "soak.png")
    assert result.errors == 0, console.export_text()
    slope = result.rss_slope_mb_per_min()
    assert slope is not None and slope < SLOPE_BOUND_MIB_PER_MIN, console.export_text()
    growth = result.rss_growth()
    assert growth is not None and growth < soak.RSS_TARGET
    # the gateway timed its periodic work and its collector's passes, and the report attributes them
    sources = {s.source for s in result.gateway.stalls}
    # gc-freeze: `serve` installed the collector; gc 1: its tick's pass (young passes of their own are rare at the
    # raised threshold, gc_young_threshold)
    assert {"job snapshot", "job gc-freeze", "gc 1"} <= sources, sources
    assert "what held the gateway's event loop" in console.export_text()
    fds = [s.fds for s in result.warm() if s.fds is not None]
    assert fds and max(fds) - min(fds) <= 4  # one connection per stream, kept alive: no descriptor leak
    assert all(s.loop_lag_ms is not None for s in result.gateway.samples)
    assert result.ratio > 0.9  # loose: an 8 s direct phase on a shared machine; the full run reports it
    assert (tmp_path / "soak.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("gateway_cpu", "machine", "says"),
    [(0.97, 1.0, "the gateway is CPU-bound"), (0.35, 1.0, "the machine was saturated"), (0.35, 0.5, None)],
    ids=["gateway-bound", "machine-bound", "neither"],
)
def test_the_report_says_whose_cpu_limited_the_run(gateway_cpu: float, machine: float, says: str | None) -> None:
    config = SoakConfig(chunks=4, pace_s=0.05)
    samples = [Sample(float(t), 0, 0, 0.0, gateway_cpu=gateway_cpu, apparatus_cpu=0.3, machine_busy=machine)
               for t in range(5, 30, 5)]  # fmt: skip
    lines = soak_report.cpu_lines(SoakResult(config, phase([]), phase(samples)))
    assert f"gateway {gateway_cpu:.0%} of a core" in lines[0] and f"machine {machine:.0%} busy" in lines[0]
    verdict = [line for line in lines[1:] if "[yellow]" in line]
    assert (verdict[0].split("[/]")[0].removeprefix("[yellow]") if verdict else None) == says


def test_pinning_gives_the_gateway_the_first_cpu_and_the_apparatus_the_rest() -> None:
    assert soak.cpu_split({3, 1, 2}, pin=True) == ({1}, {2, 3})
    assert soak.cpu_split({0}, pin=True) == (None, None)  # one CPU: everything shares it
    assert soak.cpu_split({0, 1}, pin=False) == (None, None)


def test_lag_windows_over_the_target_are_told_apart_by_the_gateways_own_share() -> None:
    config = SoakConfig(chunks=4, pace_s=0.05)
    samples = [
        Sample(5.0, 0, 0, 0.0, loop_lag_ms=2.0, own_lag_ms=2.0),
        Sample(10.0, 0, 0, 0.0, loop_lag_ms=25.0, own_lag_ms=3.0),  # a neighbour took the core
        Sample(15.0, 0, 0, 0.0, loop_lag_ms=30.0, own_lag_ms=29.0),  # the gateway's own stall
    ]
    lines = soak_report.verdicts(SoakResult(config, phase([]), phase(samples)))
    lag = next(i for i, line in enumerate(lines) if line.startswith("event-loop lag"))
    assert "2 of 3 windows over 10 ms" in lines[lag] and "MISSED" in lines[lag]
    assert "own" in lines[lag + 1] and "max 29.0 ms, 1 of 3 windows over 10 ms" in lines[lag + 1]


def test_the_run_queue_wait_of_a_live_process_is_read() -> None:
    waited = soak.runqueue_wait_s(os.getpid())
    assert waited is not None and waited >= 0
    assert soak.runqueue_wait_s(2**22 + 12345) is None  # no such process
