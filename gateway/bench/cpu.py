"""CPU readings for benchmarks: per process from the kernel's process CPU-time clock (nanoseconds, every
thread, the exited ones included), per CPU from ``/proc/stat`` (10 ms ticks, every process), so a run can
tell its own cost from its neighbours'."""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

MIN_TICKS_PER_CPU = 50  # /proc/stat counts 10 ms ticks: a window under half a second says little
MIN_WINDOW_S = 0.05  # under this, a share of wall time is mostly the cost of reading it (and the odd GC pass)


def cpu_seconds(pid: int) -> float:
    """CPU time ``pid`` has used, all its threads (also those that have exited) counted.

    From the process's CPU-time clock (``clock_getcpuclockid``, nanoseconds); where that is unavailable,
    the 10 ms ticks of ``/proc/<pid>/stat``. Summing ``/proc/<pid>/task/*/schedstat`` instead would drop a
    thread's time the moment it exits and could even go backwards.
    """
    clock = _process_clock(pid)
    if clock is not None:
        try:
            return time.clock_gettime(clock)
        except OSError:
            pass
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _process_clock(pid: int) -> int | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        clock = ctypes.c_int()
        if libc.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
            return None
    except (OSError, AttributeError):  # no libc with clock_getcpuclockid
        return None
    return clock.value


def cpu_ticks(cpus: Collection[int]) -> tuple[int, int]:
    """(busy, total) ticks of these CPUs since boot, whoever used them."""
    wanted = {f"cpu{cpu}" for cpu in cpus}
    busy = total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name in wanted:
            ticks = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


@dataclass(frozen=True)
class Layout:
    """Which CPUs the proxy and the apparatus (load generator + fake upstream) run on; equal when unpinned."""

    proxy_cpus: frozenset[int]
    apparatus_cpus: frozenset[int]


@dataclass(frozen=True)
class CpuUse:
    """What one measured window cost."""

    window_s: float
    proxy_s: float | None  # the proxy process (None when there is none)
    apparatus_busy: float | None  # load generator + upstream CPU time over (window x their CPUs); None: too short
    others_busy: float | None  # the largest share of a benchmark CPU that other processes took; None: too short


class CpuMeter:
    """Reads our processes' CPU time and the CPUs' busy ticks around one window."""

    def __init__(self, layout: Layout, upstream_pid: int, proxy_pid: int | None) -> None:
        self.layout = layout
        self.upstream_pid = upstream_pid
        self.proxy_pid = proxy_pid
        self._groups = [layout.apparatus_cpus]
        if proxy_pid is not None and layout.proxy_cpus != layout.apparatus_cpus:
            self._groups.append(layout.proxy_cpus)
        self._start: tuple[float, float, float, list[tuple[int, int]]] = (0.0, 0.0, 0.0, [])

    def _read(self) -> tuple[float, float, float, list[tuple[int, int]]]:
        apparatus = time.process_time() + cpu_seconds(self.upstream_pid)
        proxy = cpu_seconds(self.proxy_pid) if self.proxy_pid is not None else 0.0
        return time.perf_counter(), apparatus, proxy, [cpu_ticks(group) for group in self._groups]

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> CpuUse:
        (t0, apparatus0, proxy0, ticks0), (t1, apparatus1, proxy1, ticks1) = self._start, self._read()
        window = t1 - t0
        apparatus_s, proxy_s = apparatus1 - apparatus0, proxy1 - proxy0
        ours = {self.layout.apparatus_cpus: apparatus_s}
        ours[self.layout.proxy_cpus] = ours.get(self.layout.proxy_cpus, 0.0) + proxy_s
        others: list[float] = []
        for group, (busy0, total0), (busy1, total1) in zip(self._groups, ticks0, ticks1, strict=True):
            if total1 - total0 < MIN_TICKS_PER_CPU * len(group):
                continue
            others.append((busy1 - busy0) / (total1 - total0) - ours[group] / (window * len(group)))
        return CpuUse(
            window_s=window,
            proxy_s=proxy_s if self.proxy_pid is not None else None,
            apparatus_busy=apparatus_s / (window * len(self.layout.apparatus_cpus)) if window >= MIN_WINDOW_S else None,
            others_busy=max(others) if others else None,
        )


def proxy_split(cpus: Collection[int]) -> tuple[set[int] | None, set[int] | None]:
    """(the proxy's CPUs, the apparatus's): the first CPU, and the others; (None, None) with one CPU
    (everything shares it). ``bench overhead`` and ``bench soak`` lay their processes out by this."""
    ordered = sorted(cpus)
    if len(ordered) < 2:
        return None, None
    return {ordered[0]}, set(ordered[1:])
