"""Event-loop lag, measured inside the gateway and exported as ``specgate_event_loop_lag_seconds``.

A task sleeps ``tick_s`` and notes how late it woke: that lateness is how long any callback (a request's
next step, a relayed chunk) waited behind other work. The gauge holds the largest lag of the last complete
window (``window_s``), so a scrape every few seconds sees the worst stall, not a lucky instant. One wake-up
per tick; nothing on the request path.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Gauge


class LoopLagMonitor:
    def __init__(self, gauge: Gauge, tick_s: float = 0.1, window_s: float = 5.0) -> None:
        self._gauge = gauge
        self._tick_s = tick_s
        self._window_s = window_s

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        window_end = loop.time() + self._window_s
        worst = 0.0
        while True:
            before = loop.time()
            await asyncio.sleep(self._tick_s)
            now = loop.time()
            worst = max(worst, now - before - self._tick_s)
            if now >= window_end:
                self._gauge.set(worst)
                worst, window_end = 0.0, now + self._window_s
