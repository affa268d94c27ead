"""Two gateways on one real Redis share what they learn; Redis down costs no request."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.rules import default_rules_path
from tests.conftest import Gateway, wait_for
from tests.signals.conftest import private_redis  # noqa: F401  (the fixture)
from tests.signals.servers import RedisServer

pytestmark = [pytest.mark.redis]
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "Translate into English: 早上好"}],
        "max_tokens": 64}  # fmt: skip


def rules_file(tmp_path: Path) -> Path:
    data = yaml.safe_load(default_rules_path().read_text())
    data["adaptive"]["min_samples"] = 5
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def start(gateway: Callable[..., Gateway], tmp_path: Path, redis: RedisServer) -> Gateway:
    return gateway(rules_file=rules_file(tmp_path), reload_rules=False, redis_url=redis.url,
                   model_sync_interval_s=0.2, redis_timeout_s=0.2)  # fmt: skip


def send(gw: Gateway, count: int, pool: str) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        for _ in range(count):
            response = client.post("/v1/chat/completions", json=BODY, headers={"x-specgate-pool": pool})
            assert response.status_code == 200, response.text


def test_a_second_gateway_starts_from_what_the_first_learned(
    gateway: Callable[..., Gateway], private_redis: RedisServer, tmp_path: Path  # noqa: F811
) -> None:
    a = start(gateway, tmp_path, private_redis)
    send(a, 12, "standard")
    send(a, 12, "speculative")
    b = start(gateway, tmp_path, private_redis)  # has served nothing itself
    state = b.app.state
    wait_for(lambda: state.learner.model().samples("speculative") >= 5, 10, "B to take in A's numbers")
    wait_for(lambda: httpx.get(f"{b.url}/v1/route/model").json()["warm"], 10, "B's model to be warm")
    explained = httpx.post(f"{b.url}/v1/route/explain", json=BODY).json()
    assert explained["decision"]["reason"].startswith("fastest")
    assert {p["pool"] for p in explained["predictions"]} == {"standard", "speculative"}
    assert state.model_sync is not None and state.model_sync.ok


def test_redis_down_costs_no_request_and_sharing_resumes(
    gateway: Callable[..., Gateway], private_redis: RedisServer, tmp_path: Path  # noqa: F811
) -> None:
    a = start(gateway, tmp_path, private_redis)
    sync = a.app.state.model_sync
    assert sync is not None
    send(a, 5, "standard")
    wait_for(lambda: sync.ok is True, 10, "a first sync")
    private_redis.stop()
    send(a, 10, "speculative")  # every one answered while Redis is gone
    wait_for(lambda: sync.ok is False, 10, "the sync to notice Redis is down")
    send(a, 10, "standard")
    private_redis.start()
    wait_for(lambda: sync.ok is True, 15, "the sync to come back")
    before = sync.syncs
    wait_for(lambda: sync.syncs > before, 10, "another sync")
