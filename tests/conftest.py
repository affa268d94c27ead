"""Shared fixtures. Every test starts with no SPECGATE_* variables in its environment.

``upstreams`` runs two fake OpenAI upstreams (one per pool) on loopback; ``gateway`` builds and serves a
real gateway (uvicorn, lifespan and all) in front of them and checks, after the test, that every booked
slot was given back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.app import SpecgateApp, create_app
from gateway.bench.fake_upstream import FakeUpstream
from gateway.config import Settings
from gateway.intake import intake_protocol
from gateway.rules import reference_rules_path
from gateway.servers import ThreadServer, free_port
from tests.wheel import build_image_wheel


def pytest_sessionstart(session: pytest.Session) -> None:
    """``TEST_SPECGATE_COMPILED=1`` (tests/test_compiled.py): the run is for the compiled package, so it must not
    silently test the source instead. (Not a ``SPECGATE_`` name: the gateway's settings refuse unknown ones.)"""
    if os.environ.get("TEST_SPECGATE_COMPILED") == "1":
        from gateway.compiled import MODULES, compiled_modules

        if len(compiled_modules()) != len(MODULES):
            raise pytest.UsageError(f"TEST_SPECGATE_COMPILED=1 but only {compiled_modules()} are compiled")


@pytest.fixture(autouse=True)
def _clean_specgate_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SPECGATE_"):
            monkeypatch.delenv(key, raising=False)


@pytest.fixture(scope="session")
def image_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel the image's build stage builds (compiled), built once a run: tests/wheel.py."""
    return build_image_wheel(tmp_path_factory.mktemp("image-wheel"))


@dataclass
class Upstreams:
    standard: FakeUpstream
    speculative: FakeUpstream
    standard_url: str
    speculative_url: str


@pytest.fixture
def upstreams() -> Iterator[Upstreams]:
    std, spec = FakeUpstream(name="standard"), FakeUpstream(name="speculative")
    with ThreadServer(std.app()) as s1, ThreadServer(spec.app()) as s2:
        yield Upstreams(std, spec, s1.url, s2.url)


@dataclass
class Gateway:
    url: str
    app: SpecgateApp
    registry: CollectorRegistry

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def finished(self) -> int:
        """Routed requests the gateway has settled. A request is settled after its last byte went out (a client
        may read the response first): its booking back, its metrics, log line, span and learner sample recorded,
        then its admission finished (the key's buckets corrected), and last of all counted here, per key."""
        return sum(k.ok + k.client_error + k.error for k in self.app.state.metrics.keys.values())

    def settled(self, requests: int, timeout: float = 5.0) -> None:
        """Wait until ``requests`` routed requests have been settled (see :meth:`finished`); a request refused
        before it was admitted (401, 429, a 400 from parsing) is not counted."""
        wait_for(lambda: self.finished() >= requests, timeout, f"{requests} request(s) settled")


def dead_url() -> str:
    """A loopback URL nothing listens on."""
    return f"http://127.0.0.1:{free_port()}"


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def bookings_back(app: SpecgateApp) -> bool:
    """No booking left: its tokens, and its in-flight count (given back just after the tokens: the test thread
    may read between the two)."""
    pools = app.state.pools
    return pools.total_booked() == 0 and all(r.inflight == 0 for r in pools.replicas())


@pytest.fixture
def gateway(upstreams: Upstreams) -> Iterator[Callable[..., Gateway]]:
    servers: list[tuple[ThreadServer, SpecgateApp]] = []

    def start(**overrides: Any) -> Gateway:
        values: dict[str, Any] = {
            "standard_urls": [upstreams.standard_url],
            "speculative_urls": [upstreams.speculative_url],
            "health_interval_s": 0.1,
            "health_timeout_s": 0.5,
            "snapshot_interval_s": 0.05,
        }
        if "rules_file" not in overrides:  # the static reference table: tests of the proxy assert its routing
            values.update(rules_file=reference_rules_path(), reload_rules=False)
        values.update(overrides)
        registry = CollectorRegistry()
        settings = Settings(_env_file=None, **values)  # type: ignore[call-arg]
        app = create_app(settings, registry)
        protocol = intake_protocol(settings.client_max_head_bytes, settings.client_read_timeout_s)  # as `serve`
        server = ThreadServer(app, protocol=protocol).start()
        servers.append((server, app))
        wait_for(lambda: app.state.health_rounds > 0, what="first health check")
        return Gateway(server.url, app, registry)

    yield start
    try:
        for _, app in servers:
            wait_for(lambda app=app: bookings_back(app), 5.0, "bookings back to zero")  # type: ignore[misc]
    finally:
        for server, _ in servers:
            server.stop()
