"""Hot reload of the rules file while requests are in flight."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from gateway.rules import default_rules_path
from tests.conftest import Gateway, Upstreams, wait_for


def write_rules(path: Path, default_pool: str) -> None:
    data = yaml.safe_load(default_rules_path().read_text())
    data["default_pool"] = default_pool
    # without `fastest`: the learned model (warm after min_samples requests per pool) would decide instead
    data["rules"] = [rule for rule in data["rules"] if rule.get("pool") != "fastest"]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data, allow_unicode=True))
    tmp.replace(path)


def route_of(client: httpx.Client) -> str:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}]}
    return client.post("/v1/chat/completions", json=body).headers["x-specgate-pool"]


def test_reload_swaps_rules_and_keeps_in_flight_requests(
    gateway: Callable[..., Gateway], upstreams: Upstreams, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    write_rules(rules, "standard")
    gw = gateway(rules_file=rules)
    stream_lines: list[str] = []

    def slow_stream() -> None:
        body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"x-fake-chunks": "20", "x-fake-interval": "0.05"}
        with (
            httpx.Client(base_url=gw.url, timeout=10) as c,
            c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r,
        ):
            stream_lines.extend(line for line in r.iter_lines() if line)

    with httpx.Client(base_url=gw.url) as client:
        assert route_of(client) == "standard"
        in_flight = threading.Thread(target=slow_stream)
        in_flight.start()
        wait_for(lambda: gw.app.state.pools.total_booked() > 0, what="stream in flight")
        write_rules(rules, "speculative")
        wait_for(lambda: gw.sample("specgate_rule_reloads_total", result="ok") >= 1, what="reload")
        assert route_of(client) == "speculative"

        rules.write_text("rules: [{name: broken, pool: nowhere}]\n")
        wait_for(lambda: gw.sample("specgate_rule_reloads_total", result="rejected") >= 1, what="rejection")
        assert route_of(client) == "speculative"  # the old rules stay
        in_flight.join(10)
    assert len(stream_lines) == 21 and stream_lines[-1] == "data: [DONE]"


def test_reload_changes_replicas_without_losing_bookings(
    gateway: Callable[..., Gateway], upstreams: Upstreams, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    data = yaml.safe_load(default_rules_path().read_text())
    data["pools"] = {
        "standard": {"replicas": [upstreams.standard_url]},
        "speculative": {"replicas": [upstreams.speculative_url]},
    }
    rules.write_text(yaml.safe_dump(data, allow_unicode=True))
    gw = gateway(rules_file=rules, standard_urls=[], speculative_urls=[])
    booking = gw.app.state.pools.acquire("standard", 10)
    data["pools"]["standard"]["replicas"].append("http://127.0.0.1:9")
    rules.write_text(yaml.safe_dump(data, allow_unicode=True))
    wait_for(lambda: len(gw.app.state.pools.pools["standard"].replicas) == 2, what="new replica list")
    assert gw.app.state.pools.pools["standard"].replicas[0] is booking.replica
    booking.release()


def status_with(url: str, key: str) -> int:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=url) as client:
        return client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}).status_code


def secret_volume(root: Path, text: str, version: int) -> None:
    """Write ``keys.yaml`` as Kubernetes mounts a Secret: ``..data`` -> a timestamped directory, swapped
    atomically by renaming a new symlink over it; ``keys.yaml`` -> ``..data/keys.yaml``."""
    target = root / f"..2024_01_01_00_00_0{version}"
    target.mkdir()
    (target / "keys.yaml").write_text(text)
    link = root / "..data_tmp"
    link.symlink_to(target.name)
    link.replace(root / "..data")
    if not (root / "keys.yaml").is_symlink():
        (root / "keys.yaml").symlink_to("..data/keys.yaml")


def test_keys_file_changes_take_effect_without_a_restart(gateway: Callable[..., Gateway], tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys: [{name: app, key: sk-app, rpm: 1000}]")
    gw = gateway(keys_file=keys)
    limits = gw.app.state.access.limiter.keys["app"]
    assert (status_with(gw.url, "sk-app"), status_with(gw.url, "sk-new")) == (200, 401)

    tmp = keys.with_suffix(".tmp")
    tmp.write_text("keys: [{name: app, key: sk-app, rpm: 1000}, {name: new, key: sk-new}]")
    tmp.replace(keys)
    wait_for(lambda: gw.sample("specgate_key_reloads_total", result="ok") >= 1, what="keys reload")
    assert (status_with(gw.url, "sk-app"), status_with(gw.url, "sk-new")) == (200, 200)
    assert gw.app.state.access.limiter.keys["app"] is limits  # a key kept by name keeps its limits' state

    keys.write_text("keys: [{name: app, key: sk-app}, {name: broken}]")  # in place, and invalid
    wait_for(lambda: gw.sample("specgate_key_reloads_total", result="rejected") >= 1, what="rejection")
    assert (status_with(gw.url, "sk-app"), status_with(gw.url, "sk-new")) == (200, 200)  # the old keys stay

    keys.write_text("keys: [{name: new, key: sk-new}]")  # a valid file after an invalid one
    wait_for(lambda: status_with(gw.url, "sk-app") == 401, what="the removed key refused")
    assert status_with(gw.url, "sk-new") == 200


def test_keys_in_a_secret_volume_reload_on_the_symlink_swap(
    gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    secret_volume(tmp_path, "keys: [{name: app, key: sk-app}]", 1)
    gw = gateway(keys_file=tmp_path / "keys.yaml")
    assert (status_with(gw.url, "sk-app"), status_with(gw.url, "sk-two")) == (200, 401)
    secret_volume(tmp_path, "keys: [{name: two, key: sk-two}]", 2)
    wait_for(lambda: gw.sample("specgate_key_reloads_total", result="ok") >= 1, what="keys reload")
    assert (status_with(gw.url, "sk-app"), status_with(gw.url, "sk-two")) == (401, 200)


def test_keys_watcher_can_be_switched_off(gateway: Callable[..., Gateway], tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys: [{name: app, key: sk-app}]")
    gw = gateway(keys_file=keys, reload_keys=False)
    keys.write_text("keys: [{name: two, key: sk-two}]")
    time.sleep(0.5)
    assert (status_with(gw.url, "sk-app"), status_with(gw.url, "sk-two")) == (200, 401)
