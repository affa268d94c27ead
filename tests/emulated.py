"""Emulated pools (real emulator servers on loopback, EMULATED) and gateways in front of them, for the tests of
the endpoints beyond chat: two replicas per pool, so that "the replica that created it" is a real question."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from openai import OpenAI
from prometheus_client import CollectorRegistry

from backends.emulator.profiles import load_profile
from backends.emulator.server import EmulatorApp, EmulatorConfig
from gateway.app import SpecgateApp, create_app
from gateway.config import Settings
from gateway.servers import ThreadServer
from tests.conftest import wait_for

SPEED = 50.0
SHIPPED_RULES = Path(__file__).parents[1] / "gateway" / "rules.yaml"


@dataclass
class EmulatedPools:
    standard: list[tuple[str, EmulatorApp]]
    speculative: list[tuple[str, EmulatorApp]]

    @property
    def model(self) -> str:
        return self.standard[0][1].core.config.model_name

    def all(self) -> list[tuple[str, EmulatorApp]]:
        return self.standard + self.speculative

    def holders(self, rid: str) -> list[str]:
        """URLs of the emulators that keep response ``rid``."""
        return [url for url, app in self.all() if rid in app.core.responses]


@dataclass
class EmulatedGateway:
    url: str
    app: SpecgateApp
    sdk: OpenAI

    def client(self) -> OpenAI:
        return self.sdk


def start_pools(stack: ExitStack, replicas: int = 2) -> EmulatedPools:
    profile = load_profile("cpu-smollm2")

    def start(speculative: bool, seed: int) -> tuple[str, EmulatorApp]:
        app = EmulatorApp(EmulatorConfig(profile, speculative=speculative, speed=SPEED, seed=seed))
        return stack.enter_context(ThreadServer(app)).url, app

    return EmulatedPools(
        [start(False, i) for i in range(replicas)], [start(True, 100 + i) for i in range(replicas)]
    )


def static_rules(stack: ExitStack) -> Path:
    """The shipped rules without the learned rule: these tests check what the decider reads from a request,
    which a model that warms up during the module would change under them."""
    rules = yaml.safe_load(SHIPPED_RULES.read_text(encoding="utf-8"))
    rules["rules"] = [rule for rule in rules["rules"] if rule.get("pool") != "fastest"]
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump(rules, allow_unicode=True), encoding="utf-8")
    return path


def gateway_starter(stack: ExitStack, pools: EmulatedPools) -> Callable[..., EmulatedGateway]:
    rules_file = static_rules(stack)

    def start(**overrides: Any) -> EmulatedGateway:
        values: dict[str, Any] = {
            "rules_file": rules_file,
            "standard_urls": [url for url, _ in pools.standard],
            "speculative_urls": [url for url, _ in pools.speculative],
            "health_interval_s": 0.2,
            "snapshot_interval_s": 0.05,
            "reload_rules": False,
        }
        values.update(overrides)
        app = create_app(Settings(_env_file=None, **values), CollectorRegistry(), rng=random.Random(7))  # type: ignore[call-arg]
        server = stack.enter_context(ThreadServer(app))
        wait_for(lambda: app.state.health_rounds > 0, what="first health check")
        sdk = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)
        stack.callback(sdk.close)
        return EmulatedGateway(server.url, app, sdk)

    return start


def iter_pools() -> Iterator[tuple[EmulatedPools, Callable[..., EmulatedGateway]]]:
    with ExitStack() as stack:
        pools = start_pools(stack)
        for url, _ in pools.all():
            assert httpx.get(f"{url}/health").status_code == 200
        yield pools, gateway_starter(stack, pools)
