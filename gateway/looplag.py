"""Event-loop lag, measured inside the gateway and exported as ``specgate_event_loop_lag_seconds``.

A task sleeps ``tick_s`` and notes how late it woke: that lateness is how long any callback (a request's
next step, a relayed chunk) waited behind other work. The gauge holds the largest lag of the last complete
window (``window_s``), so a scrape every few seconds sees the worst stall, not a lucky instant. One wake-up
per tick; nothing on the request path.

:meth:`LoopLagMonitor.stalled_s` is the lateness summed since start, the tick that is overdue right now
included: the difference of two readings is how long the loop was stalled between them. The health checker
uses it to tell a replica that did not answer in time from a gateway that could not listen in time.

Lateness has two causes: work on the loop (a long callback, a collector pass) and a loop thread that was ready
to run but waited for a CPU (other processes on its core). With ``own_gauge``, each tick also reads how long
the thread has waited for a CPU (the kernel's ``/proc/thread-self/schedstat``, ~10 us; Linux only), and the
gauge holds the window's largest lateness less what the thread waited since the previous tick: the stall
that is the gateway's own (``specgate_event_loop_own_lag_seconds``). Where the file is missing, both gauges
read the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from prometheus_client import Gauge

SCHEDSTAT = Path("/proc/thread-self/schedstat")


def cpu_wait_s(schedstat: Path = SCHEDSTAT) -> float | None:
    """Seconds the calling thread (or the task whose ``schedstat`` file is given) has spent runnable but waiting
    for a CPU, or None where unknown."""
    try:
        return int(schedstat.read_bytes().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class LoopLagMonitor:
    def __init__(
        self, gauge: Gauge, tick_s: float = 0.1, window_s: float = 5.0, own_gauge: Gauge | None = None,
        waited: Callable[[], float | None] = cpu_wait_s,
    ) -> None:  # fmt: skip
        self._gauge = gauge
        self._own_gauge = own_gauge
        self._waited = waited
        self._tick_s = tick_s
        self._window_s = window_s
        self._stalled = 0.0  # lateness of the ticks that have woken, summed
        self._due: float | None = None  # when the pending tick should wake

    def stalled_s(self, now: float) -> float:
        """Seconds of lateness since the monitor started, up to ``now`` (the loop's clock)."""
        due = self._due
        return self._stalled + (now - due if due is not None and now > due else 0.0)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        window_end = loop.time() + self._window_s
        worst = worst_own = 0.0
        own = self._own_gauge
        waited = self._waited() if own is not None else None
        try:
            while True:
                self._due = loop.time() + self._tick_s
                await asyncio.sleep(self._tick_s)
                now = loop.time()
                late = max(0.0, now - self._due)
                self._stalled += late
                self._due = None
                worst = max(worst, late)
                if own is not None:
                    before, waited = waited, self._waited()
                    cpu_wait = waited - before if waited is not None and before is not None else 0.0
                    worst_own = max(worst_own, late - cpu_wait)
                if now >= window_end:
                    self._gauge.set(worst)
                    if own is not None:
                        own.set(worst_own)
                    worst, worst_own, window_end = 0.0, 0.0, now + self._window_s
        finally:
            self._due = None
