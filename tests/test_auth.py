"""API keys (gateway/auth.py): config validation, the 401s, per-key policy, upstream keys, the admin token."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.auth import KeysError, parse_keys, presented_key
from gateway.config import Settings
from tests.conftest import Gateway, Upstreams, dead_url

StartGateway = Callable[..., Gateway]
SECRET = "sk-test-4f1c9e"
KEYS = f"""
keys:
  - name: app
    key: {SECRET}
  - name: bench
    sha256: {hashlib.sha256(b"sk-bench-77").hexdigest()}
    steering: true
  - name: capped
    key: sk-capped
    max_tokens: 32
  - name: std-only
    key: sk-std
    pools: [standard]
"""


def chat(content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], **extra}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("keys: [{name: a}]", "keys.0: give exactly one of 'key' and 'sha256'"),
        ("keys: [{name: a, key: k, sha256: '" + "0" * 64 + "'}]", "keys.0: give exactly one"),
        ("keys: [{name: a, sha256: abc}]", "keys.0.sha256: String should match pattern"),
        ("keys: [{name: a, key: k, rpm: 0}]", "keys.0.rpm: Input should be greater than or equal to 1"),
        ("keys: [{name: a, key: k, pools: [fast]}]", "keys.0.pools.0: Input should be 'standard' or 'speculative'"),
        ("keys: [{name: a, key: k, colour: red}]", "keys.0.colour: Extra inputs are not permitted"),
        ("keys: [{name: 'a b', key: k}]", "keys.0.name: String should match pattern"),
        ("keys: [{name: a, key: k}, {name: a, key: j}]", "keys: key names must be unique"),
        ("keys: [{name: a, key: k}, {name: b, key: k}]", "two entries hold the same key"),
        ("tokens: []", "tokens: Extra inputs are not permitted"),
        ("keys: [", "invalid YAML"),
    ],
)
def test_a_bad_keys_source_names_the_bad_key_and_never_echoes_a_key(text: str, problem: str) -> None:
    with pytest.raises(KeysError) as caught:
        parse_keys(text.replace("key: k", "key: sk-do-not-echo"), "keys.yaml")
    assert any(problem in line for line in caught.value.problems), caught.value.problems
    assert "sk-do-not-echo" not in str(caught.value)


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({"authorization": "Bearer sk-1"}, "sk-1"),
        ({"authorization": "bearer   sk-1 "}, "sk-1"),
        ({"authorization": "Basic c2stMQ=="}, None),
        ({"authorization": "Bearer"}, None),
        ({"api-key": "sk-2"}, "sk-2"),
        ({"x-api-key": "sk-3"}, "sk-3"),
        ({"authorization": "Bearer sk-1", "x-api-key": "sk-3"}, "sk-1"),
        ({"x-api-key": ""}, None),
        ({}, None),
    ],
)
def test_presented_key(headers: dict[str, str], key: str | None) -> None:
    assert presented_key(headers) == key


def test_no_keys_leaves_the_gateway_open_and_says_so_once(
    gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "specgate.auth"):
        gw = gateway()
        with httpx.Client(base_url=gw.url) as client:
            assert all(client.post("/v1/chat/completions", json=chat()).status_code == 200 for _ in range(3))
    warnings = [r.getMessage() for r in caplog.records if r.name == "specgate.auth"]
    assert warnings == ["no API keys configured: the gateway is open to anyone who can reach it"]


@pytest.mark.parametrize(
    "headers",
    [{}, bearer("sk-wrong"), {"authorization": f"Basic {SECRET}"}, {"api-key": "sk-wrong"}, bearer(SECRET + "x")],
    ids=["missing", "wrong", "not-bearer", "wrong-api-key", "prefix"],
)
def test_a_missing_or_wrong_key_gets_openai_401(
    gateway: StartGateway, upstreams: Upstreams, headers: dict[str, str]
) -> None:
    gw = gateway(keys=KEYS)
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", json=chat(), headers=headers)
    assert r.status_code == 401
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_api_key", None)
    assert SECRET not in r.text
    assert upstreams.standard.requests == upstreams.speculative.requests == 0


@pytest.mark.parametrize("form", ["authorization", "api-key", "x-api-key"])
def test_each_header_form_is_accepted_and_never_forwarded(
    gateway: StartGateway, upstreams: Upstreams, form: str
) -> None:
    gw = gateway(keys=KEYS)
    headers = bearer(SECRET) if form == "authorization" else {form: SECRET}
    with httpx.Client(base_url=gw.url) as client:
        assert client.post("/v1/chat/completions", json=chat(), headers=headers).status_code == 200
    sent = {k.lower(): v for k, v in upstreams.standard.last_headers.items()}
    assert not {"authorization", "api-key", "x-api-key"} & set(sent)
    assert SECRET not in str(sent)


def test_keys_from_a_file_by_hash_and_never_logged(
    gateway: StartGateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(KEYS)
    with caplog.at_level(logging.DEBUG):
        gw = gateway(keys_file=path)
        with httpx.Client(base_url=gw.url) as client:
            assert client.post("/v1/chat/completions", json=chat(), headers=bearer("sk-bench-77")).status_code == 200
            assert client.post("/v1/chat/completions", json=chat(), headers=bearer("sk-nope")).status_code == 401
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "4 API key(s) configured" in logged
    for secret in (SECRET, "sk-bench-77", "sk-nope", "sk-capped"):
        assert secret not in logged
    assert SECRET not in repr(Settings(_env_file=None, keys=KEYS))  # type: ignore[call-arg]


def test_each_pool_gets_its_own_upstream_key(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway(keys=KEYS, standard_api_key="vllm-std-key")
    with httpx.Client(base_url=gw.url) as client:
        assert client.post("/v1/chat/completions", json=chat(), headers=bearer(SECRET)).status_code == 200
        translate = chat("Translate into French: good morning")
        assert client.post("/v1/chat/completions", json=translate, headers=bearer(SECRET)).status_code == 200
    sent = {k.lower(): v for k, v in upstreams.standard.last_headers.items()}
    assert sent["authorization"] == "Bearer vllm-std-key"
    assert "authorization" not in {k.lower() for k in upstreams.speculative.last_headers}  # no key set for it


@pytest.mark.parametrize(("key", "pool"), [(SECRET, "standard"), ("sk-bench-77", "speculative")])
def test_steering_headers_need_the_permission(gateway: StartGateway, upstreams: Upstreams, key: str, pool: str) -> None:
    gw = gateway(keys=KEYS)
    headers = {**bearer(key), "x-specgate-pool": "speculative", "x-specgate-objective": "ttft"}
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", json=chat("hi there"), headers=headers)
    assert r.status_code == 200 and r.headers["x-specgate-pool"] == pool
    seen = {k.lower() for k in getattr(upstreams, pool).last_headers}
    assert ("x-specgate-objective" in seen) == (pool == "speculative")  # stripped: the rules never saw it


def test_a_key_is_kept_to_its_pools_on_decision_and_on_retry(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway(keys=KEYS)
    translate = chat("Translate into French: good morning")
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", json=translate, headers=bearer("sk-std"))
        assert r.status_code == 200 and r.headers["x-specgate-pool"] == "standard"
        assert "speculative not allowed" in r.headers["x-specgate-reason"]
        assert client.post("/v1/chat/completions", json=translate, headers=bearer(SECRET)).status_code == 200
    assert upstreams.speculative.requests == 1  # only the unrestricted key's
    gw2 = gateway(keys=KEYS, standard_urls=[dead_url()])  # its only pool's replica is down; no retry elsewhere
    with httpx.Client(base_url=gw2.url) as client:
        r = client.post("/v1/chat/completions", json=chat(), headers=bearer("sk-std"))
    assert r.status_code in (502, 503)
    assert upstreams.speculative.requests == 1


@pytest.mark.parametrize(
    ("extra", "status", "sent"),
    [({"max_tokens": 33}, 400, None), ({"max_completion_tokens": 99}, 400, None), ({"max_tokens": 32}, 200, 32),
     ({"max_tokens": 5}, 200, 5), ({}, 200, 32)],
)  # fmt: skip
def test_max_tokens_cap_refuses_more_and_fills_in_none(
    gateway: StartGateway, upstreams: Upstreams, extra: dict[str, int], status: int, sent: int | None
) -> None:
    gw = gateway(keys=KEYS)
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", json=chat(**extra), headers=bearer("sk-capped"))
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] == next(iter(extra))
        assert upstreams.standard.requests == 0
    else:
        assert upstreams.standard.last_body is not None and upstreams.standard.last_body["max_tokens"] == sent


def test_keys_admin_token_and_pool_keys_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a compose env file or a Secret's secretKeyRef sets."""
    monkeypatch.setenv("SPECGATE_KEYS", "{keys: [{name: env, key: sk-env, rpm: 5}]}")
    monkeypatch.setenv("SPECGATE_ADMIN_TOKEN", "adm-env")
    monkeypatch.setenv("SPECGATE_SPECULATIVE_API_KEY", "vllm-spec")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    from gateway.auth import read_keys, upstream_headers

    assert [k.name for k in read_keys(settings).keys] == ["env"]
    assert settings.admin_token is not None and settings.admin_token.get_secret_value() == "adm-env"
    assert upstream_headers(settings) == {"speculative": {"authorization": "Bearer vllm-spec"}}
    assert "sk-env" not in repr(settings) and "adm-env" not in repr(settings) and "vllm-spec" not in repr(settings)


@pytest.mark.parametrize(
    ("header", "value"),
    [("x-specgate-pool", "standard"), ("x-specgate-slo-ttft-ms", "900"), ("x-specgate-slo-e2e-ms", "5000"),
     ("x-specgate-objective", "e2e")],
)  # fmt: skip
def test_every_steering_header_is_stripped_for_a_key_without_the_permission(
    gateway: StartGateway, upstreams: Upstreams, header: str, value: str
) -> None:
    gw = gateway(keys=KEYS)
    with httpx.Client(base_url=gw.url) as client:
        for key in (SECRET, "sk-bench-77"):
            r = client.post("/v1/chat/completions", json=chat(), headers={**bearer(key), header: value})
            assert r.status_code == 200, r.text
            received = getattr(upstreams, r.headers["x-specgate-pool"]).last_headers
            assert (header in {k.lower() for k in received}) == (key == "sk-bench-77")
        # an invalid value is a 400 for a key the header reaches, and unseen (so harmless) for the others
        bad = {**bearer(SECRET), header: "nonsense"}
        assert client.post("/v1/chat/completions", json=chat(), headers=bad).status_code == 200


@pytest.mark.parametrize(("keys", "headers", "status"), [(None, {}, 200), (KEYS, {}, 401), (KEYS, bearer(SECRET), 200)])
def test_the_model_list_needs_a_key_once_keys_are_set(
    gateway: StartGateway, keys: str | None, headers: dict[str, str], status: int
) -> None:
    gw = gateway(keys=keys)
    assert httpx.get(gw.url + "/v1/models", headers=headers).status_code == status
