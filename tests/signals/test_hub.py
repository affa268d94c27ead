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


async def test_a_request_that_finished_since_the_scrape_no_longer_loads_its_pool() -> None:
    """The engine was read while this gateway's one request ran on it (running 1); the request has finished
    and a snapshot is built before the next scrape: the pool's load is 0, not a phantom 1 that would push the
    next request to the other pool. And one sent since is on top of what the engine said."""
    from gateway.signals.engine_poller import EnginePoller
    from gateway.snapshot import pool_load

    target = ScrapeTarget("standard", "http://std:8000")
    inflight = {target: 1}
    text = "".join(f'vllm:num_requests_{name}{{engine="0",model_name="m"}} {value}\n' for name, value in
                   (("running", 1), ("waiting", 0)))  # fmt: skip
    hub = make_hub(CollectorRegistry())

    async def fetch(url: str, timeout_s: float) -> tuple[int, bytes]:
        return 200, text.encode()

    hub.engines = EnginePoller(fetch, lambda: [target], inflight=inflight.__getitem__)
    await hub.engines.scrape_once()

    def load(now: int) -> float:
        pools = {"standard": PoolSnapshot("standard", 1, 1, inflight=now, inflight_base=now)}  # as the pools build it
        return pool_load(hub.build_snapshot(pools), "standard")

    assert load(0) == 0.0
    assert load(1) == 1.0
    assert load(3) == 3.0  # two sent since the scrape
