"""What a caller without a key can read once keys are configured (gateway/app.py): readiness without the
replicas behind it, no interactive docs; while the gateway is open, everything as before."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from gateway.auth import parse_keys
from tests.conftest import Gateway, Upstreams

StartGateway = Callable[..., Gateway]
KEY, ADMIN = "sk-anon-test-1", "admin-anon-test-1"
KEYS = f"keys:\n  - name: tenant-a\n    key: {KEY}\n"
DOCS = ["/docs", "/redoc", "/openapi.json"]


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


@pytest.mark.parametrize("path", DOCS)
@pytest.mark.parametrize("headers", [{}, bearer(KEY), bearer(ADMIN)], ids=["anonymous", "key", "admin"])
def test_no_interactive_docs_once_keys_are_set(gateway: StartGateway, path: str, headers: dict[str, str]) -> None:
    gw = gateway(keys=KEYS, admin_token=ADMIN)
    r = httpx.get(f"{gw.url}{path}", headers=headers)
    assert r.status_code == 404
    assert r.json() == {
        "error": {"message": f"Invalid URL (GET {path})", "type": "invalid_request_error", "param": None, "code": None}
    }  # the same answer as for any unknown path: nothing says the docs exist


@pytest.mark.parametrize("path", DOCS)
def test_the_docs_stay_while_the_gateway_is_open_and_go_when_a_reload_adds_keys(
    gateway: StartGateway, path: str
) -> None:
    gw = gateway()
    r = httpx.get(f"{gw.url}{path}")
    assert r.status_code == 200
    if path == "/openapi.json":
        assert "/ready" in r.json()["paths"]
    else:
        assert "/openapi.json" in r.text
    gw.app.state.access.load(parse_keys(KEYS, "test"))
    assert httpx.get(f"{gw.url}{path}").status_code == 404


def test_ready_names_the_replicas_only_for_the_admin_token(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway(keys=KEYS, admin_token=ADMIN)
    replicas = {upstreams.standard_url, upstreams.speculative_url}
    for headers in ({}, bearer(KEY), bearer("wrong")):  # anonymous, a tenant's key, a wrong token
        r = httpx.get(f"{gw.url}/ready", headers=headers)
        assert (r.status_code, r.json()) == (200, {"ready": True, "draining": False}), headers
        assert not any(url.split("//")[1] in r.text for url in replicas)
    body = httpx.get(f"{gw.url}/ready", headers=bearer(ADMIN)).json()
    assert body["ready"] and set(body["pools"]) == {"standard", "speculative"} and "signals" in body
    assert {replica["url"] for replica in body["replicas"]} == replicas


def test_ready_without_an_admin_token_configured_says_only_ready_or_not(gateway: StartGateway) -> None:
    gw = gateway(keys=KEYS)
    r = httpx.get(f"{gw.url}/ready", headers=bearer(KEY))
    assert (r.status_code, r.json()) == (200, {"ready": True, "draining": False})


def test_ready_short_form_still_turns_503_while_draining(gateway: StartGateway) -> None:
    gw = gateway(keys=KEYS, admin_token=ADMIN)
    gw.app.state.draining = True
    r = httpx.get(f"{gw.url}/ready")
    assert (r.status_code, r.json()) == (503, {"ready": False, "draining": True})
