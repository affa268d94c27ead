"""Per-key metrics (gateway/metrics.py ``specgate_key_*``, fed by gateway/auth.py): labelled by the key's
configured name, bounded by the keys in force, ``(anonymous)`` while the gateway is open."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from gateway.metrics import ANONYMOUS_KEY, GatewayMetrics
from tests.conftest import Gateway, wait_for

StartGateway = Callable[..., Gateway]
KEYS = "keys: [{name: batch, key: sk-batch, rpm: 2}, {name: tight, key: sk-tight, tpm: 150}, {name: free, key: sk-f}]"


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], **extra}


def post(gw: Gateway, key: str | None, body: dict[str, Any], **headers: str) -> int:
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        return client.post("/v1/chat/completions", json=body, headers=headers).status_code


def test_requests_tokens_and_refusals_are_counted_per_configured_name(gateway: StartGateway) -> None:
    gw = gateway(keys=KEYS)
    assert [post(gw, "sk-batch", chat(max_tokens=10)) for _ in range(3)] == [200, 200, 429]
    assert post(gw, "sk-tight", chat(max_tokens=400)) == 429  # over its tpm
    assert post(gw, "sk-f", chat(max_tokens=10), **{"x-fake-status": "500"}) == 500
    assert post(gw, "sk-f", chat(max_tokens=10, temperature="hot")) == 400  # refused before routing
    assert post(gw, "sk-nobody", chat()) == 401

    def requests(key: str, outcome: str) -> float:
        return gw.sample("specgate_key_requests_total", key=key, outcome=outcome)

    # each is counted as it is settled, just after its last byte went out: the client may read it first
    wait_for(lambda: requests("batch", "ok") == 2 and requests("free", "error") == 1, what="the requests counted")
    assert (requests("batch", "ok"), requests("batch", "rate_limited")) == (2, 1)
    assert gw.sample("specgate_key_rate_limited_total", key="batch", limit="rpm") == 1
    assert gw.sample("specgate_key_rate_limited_total", key="tight", limit="tpm") == 1
    assert requests("free", "error") == 1 and requests("free", "ok") == 0
    tokens = gw.sample("specgate_key_tokens_total", key="batch")
    assert tokens >= 2 * 10  # prompt estimate + completion tokens of the two answered requests
    assert gw.sample("specgate_key_tokens_total", key="free") == 0  # a failed request is charged nothing
    page = generate_latest(gw.registry).decode()
    assert 'key="sk-' not in page and "nobody" not in page  # never a presented key, never a client's words
    series = [line for line in page.splitlines() if line.startswith("specgate_key_") and 'key="' in line]
    labels = {line.split('key="')[1].split('"')[0] for line in series}
    assert labels == {"batch", "tight", "free"}  # the keys in force: no anonymous series once keys are set


def test_an_open_gateway_counts_under_a_fixed_label(gateway: StartGateway) -> None:
    gw = gateway()
    assert post(gw, None, chat(max_tokens=5), authorization="Bearer whatever-a-client-sends") == 200
    # counted as the request is settled, just after its last byte went out: the client may read it first
    wait_for(lambda: gw.sample("specgate_key_requests_total", key=ANONYMOUS_KEY, outcome="ok") == 1,
             what="the request to be counted")  # fmt: skip
    assert "whatever" not in generate_latest(gw.registry).decode()


def test_a_key_removed_by_a_reload_loses_its_series(gateway: StartGateway, tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys: [{name: old, key: sk-old}, {name: kept, key: sk-kept}]")
    gw = gateway(keys_file=keys)
    assert post(gw, "sk-old", chat()) == post(gw, "sk-kept", chat()) == 200
    keys.write_text("keys: [{name: kept, key: sk-kept}, {name: new, key: sk-new}]")
    wait_for(lambda: gw.sample("specgate_key_reloads_total", result="ok") >= 1, what="keys reload")
    page = generate_latest(gw.registry).decode()
    assert 'key="old"' not in page and 'key="new"' in page
    assert gw.sample("specgate_key_requests_total", key="kept", outcome="ok") == 1  # kept across the reload


def test_every_outcome_and_limit_is_exported_from_the_first_scrape() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    metrics.key_metrics("a").refused("concurrency")
    metrics.key_metrics("a").finished(0, 0)  # no answer at all: an error
    sample = metrics.registry.get_sample_value
    assert sample("specgate_key_rate_limited_total", {"key": "a", "limit": "concurrency"}) == 1
    assert sample("specgate_key_requests_total", {"key": "a", "outcome": "error"}) == 1
    assert sample("specgate_key_requests_total", {"key": "a", "outcome": "client_error"}) == 0
    assert sample("specgate_key_rate_limited_total", {"key": "a", "limit": "tpm"}) == 0
