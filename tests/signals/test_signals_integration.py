"""The gateway with real Prometheus and Redis: QPS switch-over, shared QPS, outages without failed requests.

Run with ``-s`` to see the timeline of what the decider saw (QPS, its source, the decision).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from gateway.bench.fake_upstream import FakeUpstream
from gateway.servers import ThreadServer
from tests.signals._paths import fixture_text
from tests.signals.harness import (
    QPS_THRESHOLD,
    Traffic,
    Upstreams,
    explain,
    fake_pools,
    gateway_server,
    gateway_settings,
    prometheus_config_for,
    traffic,
)
from tests.signals.servers import prometheus_server, redis_server, running

pytestmark = pytest.mark.slow

QPS_QUERY = "sum(rate(specgate_routed_requests_total[5s]))"  # 1 s scrapes in the tests: a short window


class MetricsText:
    def __init__(self, text: str) -> None:
        self.text = text

    async def handler(self, _: web.Request) -> web.Response:
        return web.Response(text=self.text, content_type="text/plain")


def advance_spec_counters(text: str, drafts: float, draft_tokens: float, accepted: float) -> str:
    increments = {
        "vllm:spec_decode_num_drafts_total{": drafts,
        "vllm:spec_decode_num_draft_tokens_total{": draft_tokens,
        "vllm:spec_decode_num_accepted_tokens_total{": accepted,
    }
    lines = []
    for line in text.splitlines():
        for prefix, increment in increments.items():
            if line.startswith(prefix):
                head, value = line.rsplit(" ", 1)
                line = f"{head} {float(value) + increment}"
        lines.append(line)
    return "\n".join(lines) + "\n"


class Timeline:
    """Polls a gateway's explain endpoint; keeps and prints what the decider saw."""

    def __init__(self, client: httpx.Client, base_url: str, label: str) -> None:
        self.client = client
        self.base_url = base_url
        self.label = label
        self.started = time.monotonic()
        self.rows: list[tuple[float, float, str, str]] = []

    def sample(self) -> dict[str, Any]:
        body = explain(self.client, self.base_url)
        snap = body["snapshot"]
        row = (time.monotonic() - self.started, snap["qps"], snap["qps_source"], body["decision"]["pool"])
        self.rows.append(row)
        reason = body["decision"]["reason"]
        print(f"  [{self.label}] t={row[0]:5.1f}s qps={row[1]:6.2f} source={row[2]:<10} decision={row[3]} ({reason})")
        return body

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            body = self.sample()
            if predicate(body):
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.label}: {what} not seen within {timeout_s} s; last: {body['snapshot']}")
            time.sleep(0.5)


def has_source(source: str) -> Callable[[dict[str, Any]], bool]:
    return lambda body: body["snapshot"]["qps_source"] == source


def source_and_pool(source: str, pool: str) -> Callable[[dict[str, Any]], bool]:
    return lambda body: body["snapshot"]["qps_source"] == source and body["decision"]["pool"] == pool


@pytest.mark.prometheus
def test_prometheus_qps_switches_decisions_to_standard_and_back(tmp_path: Path) -> None:
    prom = prometheus_server(tmp_path, config="")
    with fake_pools() as pools:
        settings = gateway_settings(tmp_path, pools, prometheus_url=prom.url, prometheus_qps_query=QPS_QUERY)
        gateway = gateway_server(settings)
        prom.configure(prometheus_config_for(gateway.port))
        with running(prom), gateway, httpx.Client() as client:
            print(f"\nswitch-over (threshold qps > {QPS_THRESHOLD}, query {QPS_QUERY}):")
            timeline = Timeline(client, gateway.url, "gw")
            idle = timeline.sample()
            assert idle["decision"]["pool"] == "speculative"
            with traffic(gateway.url, rate=12) as load:
                timeline.wait_for(source_and_pool("prometheus", "standard"), 40, "Prometheus QPS above threshold")
                for _ in range(8):  # stay under load a few seconds: rate() settles on the real rate
                    time.sleep(0.5)
                    high = timeline.sample()
            assert (high["snapshot"]["qps_source"], high["decision"]["pool"]) == ("prometheus", "standard")
            assert high["snapshot"]["qps"] > QPS_THRESHOLD
            assert high["snapshot"]["qps_age_s"] < 2
            timeline.wait_for(source_and_pool("prometheus", "speculative"), 25, "QPS back below threshold")
            assert load.failed == 0, (load.statuses, load.errors[:3])
            assert load.sent > 30
            ready = client.get(f"{gateway.url}/ready").json()["signals"]
            assert ready["prometheus"]["up"] and ready["qps"]["source"] == "prometheus"
            metrics = client.get(f"{gateway.url}/metrics").text
            assert 'specgate_signal_up{source="prometheus"} 1.0' in metrics
            assert 'specgate_decider_qps_source{source="prometheus"} 1.0' in metrics


@pytest.mark.redis
def test_two_gateways_sharing_redis_see_each_others_traffic(tmp_path: Path) -> None:
    redis = redis_server(tmp_path)
    with running(redis), fake_pools() as pools:
        settings = gateway_settings(tmp_path, pools, redis_url=redis.url)
        first, second = gateway_server(settings), gateway_server(settings)
        with first, second, httpx.Client() as client:
            print("\nshared QPS through Redis (traffic goes to gateway A only):")
            quiet = Timeline(client, second.url, "B")
            loaded_at = time.monotonic()
            with traffic(first.url, rate=12) as load:
                body = quiet.wait_for(source_and_pool("redis", "standard"), 15, "B deciding on A's traffic")
                assert body["snapshot"]["qps"] > QPS_THRESHOLD
                # compare the two views once the shared 10 s window has filled: while it fills the rate
                # climbs, and two reads a sync apart differ by the climb (seen: 5.1 against 8.1)
                time.sleep(max(0.0, loaded_at + 11.0 - time.monotonic()))
                body = quiet.sample()
                busy = Timeline(client, first.url, "A").sample()
                assert busy["snapshot"]["qps_source"] == "redis"
                assert abs(busy["snapshot"]["qps"] - body["snapshot"]["qps"]) < 3  # the same shared window
            assert load.failed == 0
            ready = client.get(f"{second.url}/ready").json()["signals"]
            assert ready["redis"]["up"] and ready["redis"]["error"] is None


@pytest.mark.redis
@pytest.mark.prometheus
def test_outages_fail_no_request_and_signals_recover(tmp_path: Path) -> None:
    (tmp_path / "redis").mkdir()
    (tmp_path / "prometheus").mkdir()
    redis = redis_server(tmp_path / "redis")
    prom = prometheus_server(tmp_path / "prometheus", config="")
    with running(redis), fake_pools() as pools:
        settings = gateway_settings(
            tmp_path, pools, redis_url=redis.url, prometheus_url=prom.url, prometheus_qps_query=QPS_QUERY
        )
        gateway = gateway_server(settings)
        prom.configure(prometheus_config_for(gateway.port))
        with running(prom), gateway, httpx.Client() as client, traffic(gateway.url, rate=10) as load:
            print("\noutages under traffic (10 req/s):")
            timeline = Timeline(client, gateway.url, "gw")
            timeline.wait_for(has_source("prometheus"), 40, "Prometheus as the QPS source")
            prom.stop()
            print("  -- prometheus stopped")
            timeline.wait_for(has_source("redis"), 10, "fallback to Redis's shared QPS")
            assert 'specgate_signal_up{source="prometheus"} 0.0' in client.get(f"{gateway.url}/metrics").text
            redis.stop()
            print("  -- redis stopped")
            body = timeline.wait_for(has_source("local"), 10, "fallback to the local QPS")
            assert body["snapshot"]["qps"] > 5  # the local window still sees this gateway's traffic
            ready = client.get(f"{gateway.url}/ready").json()
            assert ready["ready"] and not ready["signals"]["redis"]["up"] and not ready["signals"]["prometheus"]["up"]
            redis.start()
            print("  -- redis restarted")
            timeline.wait_for(has_source("redis"), 15, "Redis back as the QPS source (after refilling its window)")
            prom.start()
            print("  -- prometheus restarted")
            timeline.wait_for(has_source("prometheus"), 40, "Prometheus back as the QPS source")
        print(f"  requests sent {load.sent}, failed {load.failed}, statuses {load.statuses}")
        assert load.failed == 0, (load.statuses, load.errors[:3])


def test_engine_stats_reach_the_snapshot_and_explain(tmp_path: Path) -> None:
    """Replicas serving vLLM's /metrics (the real 0.32.0 draft-model text, then with counters advanced)."""
    text = fixture_text("draft")
    upstream = FakeUpstream(name="speculative")
    metrics = MetricsText(text)
    app = upstream.app()
    app.router.add_get("/metrics", metrics.handler)
    with ThreadServer(app) as speculative, ThreadServer(FakeUpstream(name="standard").app()) as standard:
        pools = Upstreams(standard=standard, speculative=speculative)
        settings = gateway_settings(tmp_path, pools, engine_metrics_interval_s=0.2)
        with gateway_server(settings) as gateway, httpx.Client() as client:
            timeline = Timeline(client, gateway.url, "gw")
            timeline.wait_for(lambda b: b["snapshot"]["pools"]["speculative"]["running"] is not None, 10, "stats")
            # 100 more drafts of 4 tokens, 300 accepted: the window's acceptance, not the lifetime 0.976
            metrics.text = advance_spec_counters(text, drafts=100, draft_tokens=400, accepted=300)
            body = timeline.wait_for(
                lambda b: b["snapshot"]["pools"]["speculative"]["acceptance_rate"] is not None, 10, "acceptance"
            )
            spec = body["snapshot"]["pools"]["speculative"]
            assert spec["acceptance_rate"] == pytest.approx(0.75)
            assert spec["acceptance_length"] == pytest.approx(4.0)
            assert (spec["running"], spec["waiting"], spec["kv_cache_usage"]) == (0.0, 0.0, 0.0)
            assert 0 <= spec["stats_age_s"] < 2
            std = body["snapshot"]["pools"]["standard"]
            assert std["running"] is None and std["stats_age_s"] is None  # no /metrics there: unknown
            engines = {e["pool"]: e for e in client.get(f"{gateway.url}/ready").json()["signals"]["engines"]}
            assert engines["speculative"]["fresh"] and not engines["standard"]["fresh"]
            assert "404" in engines["standard"]["error"]


@pytest.mark.redis
@pytest.mark.prometheus
def test_requests_do_not_wait_on_a_redis_and_prometheus_that_hang(tmp_path: Path) -> None:
    """Both SIGSTOPped: they accept connections and never answer, so every poll runs into its timeout."""
    (tmp_path / "redis").mkdir()
    (tmp_path / "prometheus").mkdir()
    redis = redis_server(tmp_path / "redis")
    prom = prometheus_server(tmp_path / "prometheus", config="")
    with running(redis), fake_pools() as pools:
        settings = gateway_settings(tmp_path, pools, redis_url=redis.url, prometheus_url=prom.url)
        gateway = gateway_server(settings)
        prom.configure(prometheus_config_for(gateway.port))
        with running(prom), gateway, httpx.Client(timeout=10) as client:
            redis.pause()
            prom.pause()
            try:
                driver = Traffic(gateway.url, rate=1)
                for _ in range(60):  # over about 2 s: many polls and syncs run into their timeouts meanwhile
                    driver.send_one(client)
                    time.sleep(0.03)
                ready = client.get(f"{gateway.url}/ready").json()["signals"]
            finally:
                redis.resume()
                prom.resume()
    latencies = sorted(driver.latencies)
    median = latencies[len(latencies) // 2]
    print(f"\nwith Redis and Prometheus hanging: median {median * 1e3:.1f} ms, max {latencies[-1] * 1e3:.1f} ms")
    assert driver.failed == 0
    assert median < settings.redis_timeout_s / 2, "requests must not wait for the Redis timeout"
    assert not ready["redis"]["up"] and not ready["prometheus"]["up"]
    assert ready["qps"]["source"] == "local"


SIGNAL_RULES = """
version: 1
rules:
  - name: cluster-queue          # a named Prometheus signal
    when: {signals: {cluster_waiting: {gt: 4}}}
    pool: standard
  - name: speculative-queue      # the engine stats scraped by the gateway itself
    when: {pools: {speculative: {waiting: {gt: 4}}}}
    pool: standard
default_pool: speculative
"""


@pytest.mark.prometheus
def test_rules_see_engine_stats_and_named_prometheus_signals(tmp_path: Path) -> None:
    text = fixture_text("ngram")
    metrics = MetricsText(text)
    app = FakeUpstream(name="speculative").app()
    app.router.add_get("/metrics", metrics.handler)
    prom = prometheus_server(tmp_path, config="")
    with ThreadServer(app) as speculative, ThreadServer(FakeUpstream(name="standard").app()) as standard:
        pools = Upstreams(standard=standard, speculative=speculative)
        settings = gateway_settings(
            tmp_path,
            pools,
            engine_metrics_interval_s=0.2,
            prometheus_url=prom.url,
            prometheus_signals={"cluster_waiting": "sum(vllm:num_requests_waiting)"},
        )
        (tmp_path / "rules.yaml").write_text(SIGNAL_RULES)
        prom.configure(
            prometheus_config_for(0).replace("127.0.0.1:0", f"127.0.0.1:{speculative.port}").replace("specgate", "vllm")
        )
        with running(prom), gateway_server(settings) as gateway, httpx.Client() as client:
            print("\nrules on engine stats and on a named Prometheus signal (speculative replica's waiting 0 -> 7):")
            timeline = Timeline(client, gateway.url, "gw")
            reason = lambda name: lambda body: body["decision"]["reason"] == name  # noqa: E731
            timeline.wait_for(
                lambda b: reason("default")(b) and b["snapshot"]["pools"]["speculative"]["waiting"] == 0.0,
                10,
                "the default pool while nothing waits (stats scraped)",
            )
            metrics.text = text.replace(
                'vllm:num_requests_waiting{engine="0",model_name="smollm2"} 0.0',
                'vllm:num_requests_waiting{engine="0",model_name="smollm2"} 7.0',
            )
            body = timeline.wait_for(reason("speculative-queue"), 10, "the engine-stats rule")
            assert body["snapshot"]["pools"]["speculative"]["waiting"] == 7.0
            body = timeline.wait_for(reason("cluster-queue"), 30, "the Prometheus-signal rule")
            assert body["decision"]["pool"] == "standard"
            assert body["snapshot"]["signals"] == {"cluster_waiting": 7.0}
            assert 0 <= body["snapshot"]["signal_ages_s"]["cluster_waiting"] < 2
