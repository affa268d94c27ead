"""Fixtures that start real Redis and Prometheus servers (skipped without the binaries, failing in CI)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.signals.store import MemorySharedState, RedisSharedState, SharedState
from tests.signals.servers import (
    PrometheusServer,
    RedisServer,
    prometheus_server,
    redis_server,
    running,
)


@pytest.fixture(scope="session")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session; tests isolate themselves with a unique key prefix."""
    server = redis_server(tmp_path_factory.mktemp("redis"))
    with running(server):
        yield server


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, which the test may stop, restart or pause."""
    server = redis_server(tmp_path)
    with running(server):
        yield server


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[SharedState]:
    if request.param == "memory":
        yield MemorySharedState()
        return
    server: RedisServer = request.getfixturevalue("shared_redis")
    redis_store = RedisSharedState(server.url, prefix=f"test-{uuid.uuid4().hex[:8]}:")
    try:
        yield redis_store
    finally:
        await redis_store.close()


def self_scraping_config(port_placeholder: str = "{port}") -> str:
    return f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ["127.0.0.1:{port_placeholder}"]
"""


@pytest.fixture(scope="session")
def shared_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """One Prometheus for the session that scrapes itself every second."""
    server = prometheus_server(tmp_path_factory.mktemp("prometheus"), config="")
    server.configure(self_scraping_config().replace("{port}", str(server.port)))
    with running(server):
        yield server


@pytest.fixture
def private_prometheus(tmp_path: Path) -> Iterator[PrometheusServer]:
    """A Prometheus of this test's own (self-scraping), which the test may stop, restart or pause."""
    server = prometheus_server(tmp_path, config="")
    server.configure(self_scraping_config().replace("{port}", str(server.port)))
    with running(server):
        yield server
