"""CPU readings: per-process nanoseconds agree with the kernel's own clock; the meter's shares add up."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from gateway.bench.cpu import CpuMeter, Layout, cpu_seconds, cpu_ticks


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.fixture
def idle_pid() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "30"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_cpu_seconds_tracks_this_process_finely() -> None:
    before, process_before = cpu_seconds(os.getpid()), time.process_time()
    spin(0.05)
    used, process_used = cpu_seconds(os.getpid()) - before, time.process_time() - process_before
    assert 0.03 <= used <= 0.2
    assert abs(used - process_used) < 0.005  # nanoseconds, not 10 ms ticks


def test_cpu_ticks_count_busy_within_total() -> None:
    busy, total = cpu_ticks(os.sched_getaffinity(0))
    assert 0 < busy <= total
    assert cpu_ticks([]) == (0, 0)


def test_meter_attributes_the_load_generators_cpu_to_the_apparatus(idle_pid: int) -> None:
    cpus = frozenset(os.sched_getaffinity(0))
    meter = CpuMeter(Layout(cpus, cpus), upstream_pid=idle_pid, proxy_pid=None)
    meter.start()
    spin(0.3)
    use = meter.stop()
    assert use.proxy_s is None
    assert use.apparatus_busy is not None
    assert 0.7 / len(cpus) <= use.apparatus_busy <= 1.1 / len(cpus)
    assert use.others_busy is None  # 0.3 s is too few /proc/stat ticks to judge the neighbours


def test_meter_gives_no_share_for_a_window_too_short_to_judge(idle_pid: int) -> None:
    cpus = frozenset(os.sched_getaffinity(0))
    meter = CpuMeter(Layout(cpus, cpus), upstream_pid=idle_pid, proxy_pid=idle_pid)
    meter.start()
    use = meter.stop()
    assert use.apparatus_busy is None and use.others_busy is None
    assert use.proxy_s is not None and use.proxy_s < 0.01


def test_meter_sees_a_neighbours_cpu_as_others(idle_pid: int) -> None:
    cpus = frozenset(os.sched_getaffinity(0))
    meter = CpuMeter(Layout(cpus, cpus), upstream_pid=idle_pid, proxy_pid=None)
    neighbour = subprocess.Popen(["sh", "-c", "end=$(($(date +%s) + 2)); while [ $(date +%s) -lt $end ]; do :; done"])
    try:
        time.sleep(0.05)
        meter.start()
        time.sleep(0.7)
        use = meter.stop()
    finally:
        neighbour.kill()
        neighbour.wait()
    assert use.apparatus_busy is not None and use.apparatus_busy < 0.1  # we slept
    assert use.others_busy is not None and use.others_busy >= 0.6 / len(cpus)  # the neighbour spun one CPU
