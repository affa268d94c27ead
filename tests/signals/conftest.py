"""Fixtures that start real Redis and Prometheus servers (skipped without the binaries, failing in CI)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.signals.store import MemorySharedState, RedisSharedState, SharedState
from tests.signals.servers import RedisServer, redis_server, running


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
