"""Real redis-server and prometheus processes for the tests (gateway/bench/services.py), skipped on a developer
machine when a binary is missing and failing when CI=true."""

from __future__ import annotations

import shutil
from pathlib import Path

from gateway.bench import services
from gateway.bench.services import ManagedProcess, PrometheusServer, RedisServer, running, wait_until
from tests.signals._paths import missing

__all__ = ["ManagedProcess", "PrometheusServer", "RedisServer", "prometheus_server", "redis_server", "running",
           "wait_until"]  # fmt: skip


def require_binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        missing(f"`{name}` is not installed (scripts/setup/10-services.sh installs it)")
    assert found is not None
    return found


def redis_server(workdir: Path) -> RedisServer:
    return services.redis_server(workdir, require_binary("redis-server"))


def prometheus_server(workdir: Path, config: str, rules: dict[str, str] | None = None) -> PrometheusServer:
    """``config`` is the prometheus.yml text; ``rules`` (file name -> text) are written beside it."""
    return services.prometheus_server(workdir, config, rules, require_binary("prometheus"))
