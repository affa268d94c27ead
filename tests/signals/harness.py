"""A real gateway (uvicorn in a thread) in front of two fake upstream pools, plus a traffic driver."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.bench.signals_rig import (
    CHAT,
    QPS_THRESHOLD,
    RULES_YAML,
    Upstreams,
    fake_pools,
    gateway_settings,
    prometheus_config_for,
)
from gateway.config import Settings
from gateway.servers import ThreadServer

__all__ = ["CHAT", "QPS_THRESHOLD", "RULES_YAML", "Traffic", "Upstreams", "explain", "fake_pools", "gateway_server",
           "gateway_settings", "prometheus_config_for", "traffic"]  # fmt: skip

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
