"""End to end: the gateway in front of two REAL vLLM 0.32 CPU servers (plain + n-gram) serving SmolLM2.

Routing is checked three ways: the gateway's headers, each server's own request counter, and the
speculative server's real acceptance counters rising in its /metrics.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from openai import OpenAI

from backends.cpu_engine import CpuPair
from backends.manifest import load_manifest, pool_path
from gateway.app import create_app
from gateway.config import Settings
from gateway.rules import reference_rules_path
from gateway.servers import ThreadServer
from gateway.signals.vllm_metrics import EngineStats, SpecCounters, parse_vllm_metrics

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MODEL = load_manifest(pool_path("standard", cpu=True)).served_model_name
CODE_EDIT = [
    {"role": "system", "content": "You are a coding assistant. Return the whole edited code."},
    {"role": "user", "content": "Refactor this Python function to rename the variable x to total:\n"
                                "```python\ndef total_price(items):\n    x = 0\n    for item in items:\n"
                                "        x += item.price * item.quantity\n    return x\n```"},
]
CHAT = [{"role": "user", "content": "Hi! How are you today? Tell me something nice about the weekend."}]


@dataclass(frozen=True)
class Stack:
    pools: CpuPair
    gateway: str


def engine(url: str) -> EngineStats:
    return parse_vllm_metrics(httpx.get(f"{url}/metrics", timeout=10).text)


def successes(url: str) -> float:
    return engine(url).finished_requests


def spec(url: str) -> SpecCounters:
    counters = engine(url).spec
    assert counters is not None, f"{url} reports no speculative counters"
    return counters


@pytest.fixture(scope="module")
def stack(cpu_pools: CpuPair) -> Iterator[Stack]:
    with pytest.MonkeyPatch.context() as env:  # module scope runs before the autouse env cleaner
        for key in [key for key in os.environ if key.startswith("SPECGATE_")]:
            env.delenv(key)  # scripts/test exports SPECGATE_CACHE / SPECGATE_VENV, which Settings refuses
        # The reference table, not the shipped `fastest`: these tests check where each request goes, and the
        # learner, once warm on these engines, rightly sends chat to the speculative pool too (one request at a
        # time, n-gram wins everywhere here). The adaptive policy on real engines: tests/backends/test_bench_route.py
        settings = Settings(rules_file=reference_rules_path(), standard_urls=[cpu_pools.standard.url],
                            speculative_urls=[cpu_pools.speculative.url], reload_rules=False)
    with ThreadServer(create_app(settings)) as gateway:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = httpx.get(f"{gateway.url}/ready", timeout=10)
            if ready.status_code == 200 and all(p["healthy"] for p in ready.json()["pools"].values()):
                break
            time.sleep(0.25)
        yield Stack(cpu_pools, gateway.url)


def chat(stack: Stack, messages: list[dict[str, str]], max_tokens: int) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{stack.gateway}/v1/chat/completions", json=body, timeout=120)


def test_servers_came_up_in_reasonable_time(stack: Stack) -> None:
    assert stack.pools.startup_s < 240


def test_code_edit_goes_to_the_speculative_pool_and_drafts_are_accepted(stack: Stack) -> None:
    spec_url, std_url = stack.pools.speculative.url, stack.pools.standard.url
    spec_before, spec_done_before, std_before = spec(spec_url), successes(spec_url), successes(std_url)
    response = chat(stack, CODE_EDIT, max_tokens=96)
    assert response.status_code == 200, response.text
    assert response.headers["x-specgate-pool"] == "speculative"
    assert response.headers["x-specgate-task"] == "code"
    assert response.json()["usage"]["completion_tokens"] > 0
    assert successes(spec_url) == spec_done_before + 1
    assert successes(std_url) == std_before
    spec_after = spec(spec_url)
    drafted = spec_after.draft_tokens - spec_before.draft_tokens
    accepted = spec_after.accepted_tokens - spec_before.accepted_tokens
    assert drafted > 0 and accepted > 0, (drafted, accepted)


def test_chat_goes_to_the_standard_pool(stack: Stack) -> None:
    spec_url, std_url = stack.pools.speculative.url, stack.pools.standard.url
    spec_before, spec_done_before, std_before = spec(spec_url), successes(spec_url), successes(std_url)
    response = chat(stack, CHAT, max_tokens=64)
    assert response.status_code == 200, response.text
    assert (response.headers["x-specgate-pool"], response.headers["x-specgate-task"]) == ("standard", "chat")
    assert response.json()["choices"][0]["message"]["content"]
    assert successes(std_url) == std_before + 1
    assert successes(spec_url) == spec_done_before
    assert spec(spec_url).draft_tokens == spec_before.draft_tokens
    assert engine(std_url).spec is None  # the standard server really does not speculate


def test_streaming_through_the_gateway_with_the_openai_sdk(stack: Stack) -> None:
    client = OpenAI(base_url=f"{stack.gateway}/v1", api_key="unused", max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=CODE_EDIT, max_tokens=64, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True})
    assert raw.headers["x-specgate-pool"] == "speculative"
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(chunks) > 5 and text.strip()
    assert usage and usage[-1].completion_tokens > 1


def test_malformed_request_gets_the_gateways_400(stack: Stack) -> None:
    before = successes(stack.pools.standard.url) + successes(stack.pools.speculative.url)
    response = httpx.post(f"{stack.gateway}/v1/chat/completions", content=b'{"model": "x", "messages": [',
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "not valid JSON" in error["message"]
    assert "x-specgate-pool" not in response.headers
    assert successes(stack.pools.standard.url) + successes(stack.pools.speculative.url) == before


def test_engine_rejection_comes_back_intact(stack: Stack) -> None:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 5000}
    through_gateway = httpx.post(f"{stack.gateway}/v1/chat/completions", json=body, timeout=60)
    pool = through_gateway.headers["x-specgate-pool"]
    direct_url = stack.pools.standard.url if pool == "standard" else stack.pools.speculative.url
    direct = httpx.post(f"{direct_url}/v1/chat/completions", json=body, timeout=60)
    assert through_gateway.status_code == direct.status_code == 400
    assert json.loads(through_gateway.content) == json.loads(direct.content)
    assert "max_tokens=5000 cannot be greater than max_model_len=2048" in through_gateway.json()["error"]["message"]


def test_responses_api_through_the_gateway_with_the_openai_sdk(stack: Stack) -> None:
    client = OpenAI(base_url=f"{stack.gateway}/v1", api_key="unused", max_retries=0, timeout=120)
    std_url = stack.pools.standard.url
    std_before = successes(std_url)
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=CHAT[0]["content"], max_output_tokens=16, temperature=0)
    assert (raw.headers["x-specgate-pool"], raw.headers["x-specgate-task"]) == ("standard", "chat")
    response = raw.parse()
    assert response.id.startswith("resp_") and response.output_text.strip()
    assert response.usage is not None and response.usage.output_tokens > 0
    assert successes(std_url) == std_before + 1
    with client.responses.with_streaming_response.create(
        model=MODEL, instructions=CODE_EDIT[0]["content"], input=CODE_EDIT[1]["content"], max_output_tokens=64,
        temperature=0, stream=True) as streamed:
        assert streamed.headers["x-specgate-pool"] == "speculative"
        events = list(streamed.parse())
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta").strip()
    # These servers run without VLLM_ENABLE_RESPONSES_API_STORE, so they keep no response: the gateway still
    # sends the retrieve to the replica that created it, and that replica's own 404 comes back.
    kept = httpx.get(f"{stack.gateway}/v1/responses/{response.id}", timeout=30)
    assert kept.status_code == 404 and kept.headers["x-specgate-pool"] == "standard"
    assert kept.json()["error"]["code"] == 404  # vLLM's error (the gateway's own has no code)
    unknown = httpx.get(f"{stack.gateway}/v1/responses/resp_unknown", timeout=30)
    assert unknown.status_code == 404 and "x-specgate-pool" not in unknown.headers


def test_tokenize_passes_through_unchanged(stack: Stack) -> None:
    body = {"model": MODEL, "prompt": "Hello, world"}
    through = httpx.post(f"{stack.gateway}/tokenize", json=body, timeout=30)
    direct = httpx.post(f"{stack.pools.standard.url}/tokenize", json=body, timeout=30)
    assert through.status_code == direct.status_code == 200
    assert through.json() == direct.json() and through.json()["count"] > 0
    assert through.headers["x-specgate-reason"] == "passthrough"
    back = httpx.post(f"{stack.gateway}/detokenize", json={"model": MODEL, "tokens": through.json()["tokens"]},
                      timeout=30)
    assert back.json()["prompt"].endswith("Hello, world")
    version = httpx.get(f"{stack.gateway}/version", timeout=30).json()["version"]
    assert version.startswith("0.32")
    sleep = httpx.post(f"{stack.gateway}/sleep", timeout=30)
    assert sleep.status_code == 404
    assert httpx.get(f"{stack.pools.standard.url}/is_sleeping", timeout=30).status_code == 404  # no dev mode here
