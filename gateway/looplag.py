"""Event-loop lag, measured inside the gateway and exported as ``specgate_event_loop_lag_seconds``.

A task sleeps ``tick_s`` and notes how late it woke: that lateness is how long any callback (a request's
next step, a relayed chunk) waited behind other work. The gauge holds the largest lag of the last complete
window (``window_s``), so a scrape every few seconds sees the worst stall, not a lucky instant. One wake-up
per tick; nothing on the request path.

:meth:`LoopLagMonitor.stalled_s` is the lateness summed since start, the tick that is overdue right now
included: the difference of two readings is how long the loop was stalled between them. The health checker
uses it to tell a replica that did not answer in time from a gateway that could not listen in time.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Gauge


class LoopLagMonitor:
    def __init__(self, gauge: Gauge, tick_s: float = 0.1, window_s: float = 5.0) -> None:
        self._gauge = gauge
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
        worst = 0.0
        try:
            while True:
                self._due = loop.time() + self._tick_s
                await asyncio.sleep(self._tick_s)
                now = loop.time()
                late = max(0.0, now - self._due)
                self._stalled += late
                self._due = None
                worst = max(worst, late)
                if now >= window_end:
                    self._gauge.set(worst)
                    worst, window_end = 0.0, now + self._window_s
        finally:
            self._due = None
