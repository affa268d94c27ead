"""The admin token (gateway/auth.py ``require_admin``) and ``POST /admin/reload`` (gateway/admin.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.rules import default_rules_path
from tests.conftest import Gateway

StartGateway = Callable[..., Gateway]
KEYS = "keys: [{name: app, key: sk-app}]"
ADMIN = "adm-0c2f"
EXPLAIN = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


def call(gw: Gateway, method: str, path: str, token: str | None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=gw.url) as client:
        return client.request(method, path, headers=headers, json=EXPLAIN if method == "POST" else None)


@pytest.mark.parametrize(
    ("settings", "token", "status"),
    [
        ({}, None, 200),  # nothing configured: open, as in the quick start
        ({"admin_token": ADMIN}, None, 401),
        ({"admin_token": ADMIN}, "adm-wrong", 401),
        ({"admin_token": ADMIN}, ADMIN, 200),
        ({"admin_token": ADMIN, "keys": KEYS}, "sk-app", 401),  # an API key is not the admin token
        ({"admin_token": ADMIN, "keys": KEYS}, ADMIN, 200),
        ({"keys": KEYS}, "sk-app", 401),  # keys but no admin token: operator endpoints closed
    ],
)
def test_explain_needs_the_admin_token(
    gateway: StartGateway, settings: dict[str, str], token: str | None, status: int
) -> None:
    gw = gateway(**settings)
    r = call(gw, "POST", "/v1/route/explain", token)
    assert r.status_code == status, r.text
    if status == 401:
        assert r.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(("token", "status"), [(None, 401), ("sk-app", 401), (ADMIN, 200)])
def test_the_learned_model_needs_the_admin_token(gateway: StartGateway, token: str | None, status: int) -> None:
    gw = gateway(admin_token=ADMIN, keys=KEYS)
    assert call(gw, "GET", "/v1/route/model", token).status_code == status


@pytest.mark.parametrize(("need", "token", "status"), [(False, None, 200), (True, None, 401), (True, ADMIN, 200)])
def test_metrics_optionally_need_the_admin_token(
    gateway: StartGateway, need: bool, token: str | None, status: int
) -> None:
    gw = gateway(admin_token=ADMIN, metrics_need_admin=need)
    assert call(gw, "GET", "/metrics", token).status_code == status


def test_the_model_endpoint_is_guarded_by_the_same_dependency() -> None:
    """One function any operator handler can depend on (the learned-model endpoint uses it too)."""
    from fastapi import Depends, FastAPI

    from gateway.auth import require_admin

    api = FastAPI()

    @api.get("/x", dependencies=[Depends(require_admin)])
    async def x() -> dict[str, str]:
        return {}

    assert any(d.call is require_admin for d in api.routes[-1].dependant.dependencies)  # type: ignore[attr-defined]


def test_reload_swaps_valid_rules_and_keys_and_keeps_old_ones_on_error(gateway: StartGateway, tmp_path: Path) -> None:
    rules, keys = tmp_path / "rules.yaml", tmp_path / "keys.yaml"
    rules.write_text(default_rules_path().read_text())
    keys.write_text("keys: [{name: app, key: sk-app, rpm: 100}]")
    gw = gateway(admin_token=ADMIN, rules_file=rules, keys_file=keys, reload_rules=False, reload_keys=False)
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}

    def status(key: str) -> int:
        with httpx.Client(base_url=gw.url) as client:
            return client.post("/v1/chat/completions", json=chat, headers={"x-api-key": key}).status_code

    assert (status("sk-app"), status("sk-new")) == (200, 401)
    assert call(gw, "POST", "/admin/reload", None).status_code == 401
    bucket = gw.app.state.access.limiter.keys["app"].requests
    keys.write_text("keys: [{name: app, key: sk-app, rpm: 100}, {name: new, key: sk-new}]")
    rules.write_text(rules.read_text().replace("default_pool: standard", "default_pool: speculative"))
    r = call(gw, "POST", "/admin/reload", ADMIN)
    assert r.status_code == 200 and r.json()["rules"]["status"] == r.json()["keys"]["status"] == "reloaded"
    assert (status("sk-app"), status("sk-new")) == (200, 200)
    assert gw.app.state.ruleset.rules.default_pool == "speculative"
    assert gw.app.state.access.limiter.keys["app"].requests is bucket  # same limit: its bucket (and debt) stay
    keys.write_text("keys: [{name: app}]")
    rules.write_text("version: 1\nrules: [{name: x}]\n")
    r = call(gw, "POST", "/admin/reload", ADMIN)
    assert r.status_code == 422
    assert r.json()["rules"]["status"] == r.json()["keys"]["status"] == "rejected"
    assert "keys.0: give exactly one of 'key' and 'sha256'" in r.json()["keys"]["problems"]
    assert (status("sk-app"), status("sk-new")) == (200, 200)  # the old keys and rules stay
    assert gw.app.state.ruleset.rules.default_pool == "speculative"
