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


async def test_stalled_seconds_count_a_stall_before_the_late_tick_wakes() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    monitor = LoopLagMonitor(metrics.loop_lag, tick_s=0.01, window_s=1.0)
    task = asyncio.create_task(monitor.run())
    try:
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        before = monitor.stalled_s(loop.time())
        time.sleep(0.3)  # noqa: ASYNC251 -- a stall; the monitor has not woken since
        assert monitor.stalled_s(loop.time()) - before >= 0.28  # the overdue tick counts already
        await asyncio.sleep(0.05)
        assert 0.28 <= monitor.stalled_s(loop.time()) - before < 0.28 + 0.25  # counted once, when it wakes
    finally:
        task.cancel()


async def test_own_lag_leaves_out_the_time_the_thread_waited_for_a_cpu() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    kernel = {"waited": 0.0}  # what the thread has waited for a CPU so far, as the kernel would say
    monitor = LoopLagMonitor(
        metrics.loop_lag, tick_s=0.01, window_s=0.2, own_gauge=metrics.loop_own_lag, waited=lambda: kernel["waited"]
    )
    task = asyncio.create_task(monitor.run())
    try:
        await asyncio.sleep(0.035)
        kernel["waited"] = 0.25  # 0.25 s of waiting for a CPU during the stall below
        time.sleep(0.3)  # noqa: ASYNC251 -- a stall the kernel (here: the stub) says was mostly waiting for a CPU
        await asyncio.sleep(0.05)  # the late tick closes the window (0.3 s > 0.2 s) and sets both gauges
        assert metrics.loop_lag._value.get() >= 0.25
        assert metrics.loop_own_lag._value.get() < 0.1  # 0.3 s late, 0.25 s of it waiting: ~0.05 s its own
    finally:
        task.cancel()


async def test_own_lag_is_the_whole_lag_when_the_thread_did_not_wait() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    monitor = LoopLagMonitor(
        metrics.loop_lag, tick_s=0.01, window_s=0.2, own_gauge=metrics.loop_own_lag, waited=lambda: 1.0
    )
    task = asyncio.create_task(monitor.run())
    try:
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # noqa: ASYNC251 -- the gateway's own stall
        await asyncio.sleep(0.05)
        assert metrics.loop_own_lag._value.get() >= 0.25
    finally:
        task.cancel()


def test_the_thread_s_cpu_wait_is_read_from_the_kernel() -> None:
    from gateway.looplag import cpu_wait_s

    waited = cpu_wait_s()
    assert waited is not None and waited >= 0
