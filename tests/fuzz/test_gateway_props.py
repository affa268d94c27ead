"""Property test through the running gateway (uvicorn, fake upstreams): any JSON body gets a 2xx relayed from
an upstream or an OpenAI-shaped 4xx, never a 5xx; bookings return to zero (the ``gateway`` fixture checks)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Gateway, Upstreams
from tests.fuzz.cases import RAN
from tests.fuzz.strategies import bodies

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=250,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
PATHS = ["/v1/chat/completions", "/v1/completions"]
HEADERS = {"content-type": "application/json", "x-fake-chunks": "2"}  # the fake upstream answers 2 tokens


def assert_answer(response: httpx.Response) -> None:
    status = response.status_code
    assert status < 500, f"{status}: {response.text[:300]}"
    if 200 <= status < 300:
        assert response.headers["x-specgate-pool"] in ("standard", "speculative")
        return
    assert 400 <= status < 500
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]


def test_any_json_body_through_the_gateway(gateway: Callable[..., Gateway], upstreams: Upstreams) -> None:
    gw = gateway(rules_file=None)  # the shipped rules, as users run them
    seen: set[int] = set()
    with httpx.Client(base_url=gw.url, timeout=10.0) as client:

        @FUZZ
        @given(body=bodies, path=st.sampled_from(PATHS))
        def check(body: Any, path: str) -> None:
            response = client.post(path, content=json.dumps(body).encode(), headers=HEADERS)
            RAN[__name__] += 1
            assert_answer(response)
            seen.add(response.status_code)

        check()
        ok = client.post(PATHS[0], json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200
    assert 200 in seen and 400 in seen  # the strategy reaches both the upstream and the validation
    assert upstreams.standard.requests + upstreams.speculative.requests > 0
