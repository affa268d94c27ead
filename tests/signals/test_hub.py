"""SignalHub without external sources: local QPS, the snapshot shape, metrics, and task lifecycle."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from gateway.config import Settings
from gateway.signals.engine_poller import ScrapeTarget
from gateway.signals.hub import SignalHub
from gateway.snapshot import PoolSnapshot


def make_hub(registry: CollectorRegistry, **settings: object) -> SignalHub:
    return SignalHub(
        Settings(**settings),  # type: ignore[arg-type]
        targets=lambda: [ScrapeTarget("standard", "http://127.0.0.1:9")],
        local_qps=lambda: 7.5,
        registry=registry,
    )


def test_without_prometheus_or_redis_the_qps_is_local() -> None:
    registry = CollectorRegistry()
    hub = make_hub(registry)
    pools = {"standard": PoolSnapshot("standard", healthy_replicas=1, total_replicas=1)}
    snapshot = hub.build_snapshot(pools)
    assert (snapshot.qps, snapshot.qps_source, snapshot.qps_age_s) == (7.5, "local", 0.0)
    assert snapshot.pools["standard"].healthy_replicas == 1  # health comes from the caller, untouched
    assert registry.get_sample_value("specgate_decider_qps") == 7.5
    assert registry.get_sample_value("specgate_decider_qps_source", {"source": "local"}) == 1
    assert registry.get_sample_value("specgate_decider_qps_source", {"source": "prometheus"}) == 0
    status = hub.status()
    assert status["prometheus"] is None and status["redis"] is None
    assert status["qps"] == {"value": 7.5, "source": "local", "age_s": 0.0}
    hub.record_request(1.0)
    hub.record_request(1.1)
    assert registry.get_sample_value("specgate_routed_requests_total") == 2


async def test_start_and_stop_keep_and_await_their_tasks() -> None:
    hub = make_hub(CollectorRegistry(), engine_metrics_interval_s=0.05, engine_metrics_timeout_s=0.05)
    await hub.start()
    await asyncio.sleep(0.2)
    snapshot = hub.build_snapshot({"standard": PoolSnapshot("standard", 1, 1)})
    assert snapshot.pools["standard"].running is None  # the replica refuses: unknown, not zero
    [engine] = hub.status()["engines"]
    assert not engine["fresh"] and "ConnectError" in engine["error"]
    tasks = list(hub._tasks)
    await hub.stop()
    assert tasks and all(task.done() for task in tasks)
    assert not hub._tasks


async def test_a_poller_bug_is_logged_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    hub = make_hub(CollectorRegistry())
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")

    hub._spawn("flaky", flaky, 0.01)
    with caplog.at_level(logging.ERROR, logger="specgate.signals"):
        await asyncio.sleep(0.1)
    await hub.stop()
    assert calls > 1
    assert "signal poller flaky failed" in caplog.text


def test_signal_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECGATE_REDIS_URL", "redis://127.0.0.1:6390/0")
    monkeypatch.setenv("SPECGATE_PROMETHEUS_URL", "http://127.0.0.1:9090")
    monkeypatch.setenv("SPECGATE_PROMETHEUS_SIGNALS", '{"cluster_waiting": "sum(vllm:num_requests_waiting)"}')
    settings = Settings()
    assert settings.redis_url == "redis://127.0.0.1:6390/0"
    assert settings.prometheus_signals == {"cluster_waiting": "sum(vllm:num_requests_waiting)"}
    assert settings.prometheus_qps_query == "sum(rate(specgate_routed_requests_total[30s]))"


def test_a_misspelt_signal_setting_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="prometheus_timeout_s"):
        Settings(prometheus_timeout_s=0)
