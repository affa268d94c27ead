"""CPU readings: per-process nanoseconds agree with the kernel's own clock; the meter's shares add up."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from gateway.bench.cpu import MIN_TICKS_PER_CPU, CpuMeter, Layout, cpu_seconds, cpu_ticks


def spin(cpu_seconds: float) -> None:
    """Burn this much CPU in the calling thread (CPU time, not wall time: CI runs vLLM beside the tests)."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
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


def test_cpu_seconds_keeps_the_time_of_threads_that_ended() -> None:
    before = cpu_seconds(os.getpid())
    worker = threading.Thread(target=spin, args=(0.1,))
    worker.start()
    worker.join()
    assert cpu_seconds(os.getpid()) - before >= 0.08


def test_cpu_seconds_of_another_process(idle_pid: int) -> None:
    burn = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass\nprint(flush=True)\n"
    busy = subprocess.Popen([sys.executable, "-c", burn + "time.sleep(30)"], stdout=subprocess.PIPE)
    try:
        assert busy.stdout is not None
        busy.stdout.readline()  # it has burnt its 0.2 s
        assert 0.15 <= cpu_seconds(busy.pid) <= 0.6
        assert cpu_seconds(idle_pid) < 0.05
    finally:
        busy.kill()
        busy.communicate()


def test_cpu_ticks_count_busy_within_total() -> None:
    busy, total = cpu_ticks(os.sched_getaffinity(0))
    assert 0 < busy <= total
    assert cpu_ticks([]) == (0, 0)


def test_meter_attributes_the_load_generators_cpu_to_the_apparatus(idle_pid: int) -> None:
    cpus = frozenset(os.sched_getaffinity(0))
    meter = CpuMeter(Layout(cpus, cpus), upstream_pid=idle_pid, proxy_pid=None)
    before = time.process_time()
    meter.start()
    spin(0.3)
    use = meter.stop()
    used = time.process_time() - before
    assert use.proxy_s is None
    assert use.apparatus_busy is not None and used >= 0.3
    # this process is the load generator: its CPU over the window and the CPUs, however busy the machine is
    assert use.apparatus_busy == pytest.approx(used / (use.window_s * len(cpus)), rel=0.1)
    threshold_s = MIN_TICKS_PER_CPU / 100  # /proc/stat ticks are 10 ms
    if use.window_s < 0.9 * threshold_s:  # too few ticks to judge the neighbours
        assert use.others_busy is None
    elif use.window_s > 1.1 * threshold_s:  # a busy machine stretched the window: the neighbours are judged
        assert use.others_busy is not None and 0.0 <= use.others_busy <= 1.0


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
    burn = "import time\nprint(flush=True)\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass\n"
    neighbour = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE)
    try:
        assert neighbour.stdout is not None
        neighbour.stdout.readline()  # it is spinning now
        meter.start()
        spun = cpu_seconds(neighbour.pid)
        time.sleep(0.7)
        use = meter.stop()
        spun = cpu_seconds(neighbour.pid) - spun
    finally:
        neighbour.kill()
        neighbour.communicate()
    assert use.apparatus_busy is not None and use.apparatus_busy < 0.1  # we slept
    assert spun >= 0.1, "the neighbour never got a CPU"
    # the neighbour's share counts as others' (less 10 ms ticks' rounding; other processes may add to it)
    assert use.others_busy is not None and use.others_busy >= spun / (use.window_s * len(cpus)) - 0.05
