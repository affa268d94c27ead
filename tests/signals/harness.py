"""A real gateway (uvicorn in a thread) in front of two fake upstream pools, plus a traffic driver."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.bench.fake_upstream import FakeUpstream
from gateway.config import Settings
from gateway.servers import ThreadServer

# Decisions switch on QPS alone: above the threshold the standard pool, else the speculative one.
QPS_THRESHOLD = 5.0
RULES_YAML = f"""
version: 1
rules:
  - name: high-load
    when: {{qps: {{gt: {QPS_THRESHOLD}}}}}
    pool: standard
default_pool: speculative
"""

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


@dataclass
class Upstreams:
    standard: ThreadServer
    speculative: ThreadServer


@contextlib.contextmanager
def fake_pools() -> Iterator[Upstreams]:
    with (
        ThreadServer(FakeUpstream(name="standard").app()) as standard,
        ThreadServer(FakeUpstream(name="speculative").app()) as speculative,
    ):
        yield Upstreams(standard, speculative)


def gateway_settings(tmp_path: Path, pools: Upstreams, **overrides: Any) -> Settings:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES_YAML)
    values: dict[str, Any] = dict(
        rules_file=rules,
        reload_rules=False,
        standard_urls=[pools.standard.url],
        speculative_urls=[pools.speculative.url],
        health_interval_s=0.5,
        snapshot_interval_s=0.1,
        qps_window_s=3.0,
        engine_metrics_interval_s=0.5,
        prometheus_interval_s=0.5,
        prometheus_timeout_s=0.5,
        prometheus_stale_after_s=2.0,
        prometheus_warmup_s=5.0,  # the tests' QPS query range
        redis_timeout_s=0.2,
        redis_sync_interval_s=0.2,
    )
    values.update(overrides)
    return Settings(**values)


def gateway_server(settings: Settings) -> ThreadServer:
    """Not started yet: the port is bound, so a Prometheus config can name it first."""
    return ThreadServer(create_app(settings, CollectorRegistry()))


def explain(client: httpx.Client, base_url: str) -> dict[str, Any]:
    """The decision the gateway would take now (does not count as traffic)."""
    response = client.post(f"{base_url}/v1/route/explain", json=CHAT, timeout=5)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


@dataclass
class Traffic:
    """Sends chat requests to one gateway at about ``rate`` per second from a thread; counts outcomes."""

    base_url: str
    rate: float
    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Traffic:
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            next_at = time.monotonic()
            while not self._stop.is_set():
                self.send_one(client)
                next_at += 1.0 / self.rate
                time.sleep(max(0.0, next_at - time.monotonic()))

    def send_one(self, client: httpx.Client) -> None:
        started = time.perf_counter()
        try:
            response = client.post(f"{self.base_url}/v1/chat/completions", json=CHAT)
        except httpx.HTTPError as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            return
        self.latencies.append(time.perf_counter() - started)
        self.statuses[response.status_code] = self.statuses.get(response.status_code, 0) + 1

    @property
    def failed(self) -> int:
        return len(self.errors) + sum(n for status, n in self.statuses.items() if status != 200)

    @property
    def sent(self) -> int:
        return len(self.errors) + sum(self.statuses.values())


@contextlib.contextmanager
def traffic(base_url: str, rate: float) -> Iterator[Traffic]:
    driver = Traffic(base_url, rate).start()
    try:
        yield driver
    finally:
        driver.stop()


def prometheus_config_for(gateway_port: int, scrape_interval: str = "1s") -> str:
    return f"""
global:
  scrape_interval: {scrape_interval}
  evaluation_interval: {scrape_interval}
scrape_configs:
  - job_name: specgate
    static_configs:
      - targets: ["127.0.0.1:{gateway_port}"]
"""
