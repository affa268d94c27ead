"""PrometheusPoller against a real Prometheus: values, no-data, bad queries, down, slow, recovery."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.servers import free_port
from gateway.signals.prometheus import NoData, PrometheusPoller, scalar_of
from tests.signals.servers import PrometheusServer

pytestmark = pytest.mark.prometheus


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ([1700000000.0, "2.5"], 2.5),
        ([{"metric": {"a": "1"}, "value": [1.0, "1.5"]}, {"metric": {"a": "2"}, "value": [1.0, "2"]}], 3.5),
        ([{"metric": {}, "value": [1.0, "NaN"]}], float("nan")),
    ],
    ids=["scalar", "vector-summed", "nan"],
)
def test_scalar_of(result: object, expected: float) -> None:
    value = scalar_of(result)
    assert value == pytest.approx(expected, nan_ok=True)


def test_scalar_of_empty_vector_is_no_data() -> None:
    with pytest.raises(NoData):
        scalar_of([])


async def test_reads_qps_and_named_signals(shared_prometheus: PrometheusServer) -> None:
    poller = PrometheusPoller(
        shared_prometheus.url,
        qps_query="vector(12.5)",
        signal_queries={"cluster_waiting": "scalar(vector(3))", "missing": "no_such_metric_anywhere"},
    )
    outcome = await poller.poll_once()
    assert outcome.ok and poller.up
    qps = poller.qps()
    assert qps is not None and qps.value == 12.5
    signals = poller.signals()
    assert signals["cluster_waiting"].value == 3.0
    assert "missing" not in signals  # no data: unknown, not zero
    assert "NoData" in poller.query_errors["signal:missing"]
    await poller.close()


async def test_bad_promql_is_a_query_error_not_an_outage(shared_prometheus: PrometheusServer) -> None:
    poller = PrometheusPoller(shared_prometheus.url, qps_query="sum(rate(", signal_queries={"ok": "vector(1)"})
    outcome = await poller.poll_once()
    assert outcome.ok
    assert poller.qps() is None
    assert "400" in poller.query_errors["qps"]
    assert poller.signals()["ok"].value == 1.0
    await poller.close()


async def test_unreachable_prometheus_fails_fast() -> None:
    poller = PrometheusPoller(f"http://127.0.0.1:{free_port()}", qps_query="vector(1)", timeout_s=0.5)
    started = time.monotonic()
    outcome = await poller.poll_once()
    assert time.monotonic() - started < 0.5
    assert not outcome.ok and outcome.error is not None and "ConnectionError" in outcome.error
    assert poller.qps() is None and not poller.up
    await poller.close()


async def test_value_goes_stale_and_recovers(private_prometheus: PrometheusServer) -> None:
    poller = PrometheusPoller(private_prometheus.url, qps_query="vector(7)", timeout_s=0.3, stale_after_s=0.5)
    assert (await poller.poll_once()).ok
    private_prometheus.pause()  # accepts connections, never answers: "slow"
    try:
        started = time.monotonic()
        outcome = await poller.poll_once()
        assert time.monotonic() - started < 0.6, "a slow Prometheus costs at most the timeout"
        assert not outcome.ok and "no answer" in (outcome.error or "")
        assert poller.qps() is None, "a failed poll means fall back now, not after stale_after_s"
        assert not (await poller.poll_once()).ok
        await asyncio.sleep(0.5)
        assert poller.qps() is None, "older than stale_after_s: not used"
    finally:
        private_prometheus.resume()
    deadline = time.monotonic() + 5
    while not (await poller.poll_once()).ok:
        assert time.monotonic() < deadline, "poller did not recover"
        await asyncio.sleep(0.1)
    value = poller.qps()
    assert value is not None and value.value == 7.0
    await poller.close()


async def test_values_wait_for_a_whole_range_of_data(shared_prometheus: PrometheusServer) -> None:
    clock = [100.0]
    poller = PrometheusPoller(
        shared_prometheus.url, qps_query="vector(4)", warmup_s=5.0, stale_after_s=2.0, clock=lambda: clock[0]
    )
    assert (await poller.poll_once()).ok
    assert poller.warming_up() and poller.qps() is None
    clock[0] += 5.0
    assert (await poller.poll_once()).ok
    assert not poller.warming_up()
    value = poller.qps()
    assert value is not None and value.value == 4.0
    poller._record_failure("a blip")
    clock[0] += 1.0
    assert (await poller.poll_once()).ok
    assert poller.qps() is not None, "a blip shorter than stale_after_s keeps the values usable"
    poller._record_failure("an outage")
    clock[0] += 10.0
    assert (await poller.poll_once()).ok
    assert poller.warming_up() and poller.qps() is None, "after a long outage the ranges have a hole"
    await poller.close()
