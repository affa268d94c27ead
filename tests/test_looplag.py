"""gateway/looplag.py: a blocked event loop shows up in the gauge as the length of the block."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from gateway.looplag import LoopLagMonitor
from gateway.metrics import GatewayMetrics


async def test_a_blocked_loop_shows_as_lag_in_the_next_window() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    task = asyncio.create_task(LoopLagMonitor(metrics.loop_lag, tick_s=0.01, window_s=0.1).run())
    try:
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # noqa: ASYNC251 -- blocks the loop on purpose: the monitor's timer fires ~0.3 s late
        await asyncio.sleep(0.05)
        assert metrics.loop_lag._value.get() >= 0.25
        for _ in range(40):  # a later window without a block reports less (polled: a loaded machine may stall)
            await asyncio.sleep(0.1)
            if metrics.loop_lag._value.get() < 0.25:
                break
        assert metrics.loop_lag._value.get() < 0.25
    finally:
        task.cancel()
