"""End to end: the gateway in front of two REAL vLLM 0.32 CPU servers (plain + n-gram) serving SmolLM2.

Routing is checked three ways: the gateway's headers, each server's own request counter, and the
speculative server's real acceptance counters rising in its /metrics.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from backends.cpu_engine import CpuPair
from backends.manifest import load_manifest, pool_path
from gateway.app import create_app
from gateway.config import Settings
from gateway.servers import ThreadServer

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


def counters(url: str) -> dict[str, float]:
    """Every counter sample of a server's /metrics, summed over labels."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_total"):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def successes(url: str) -> float:
    return counters(url).get("vllm:request_success_total", 0.0)


@pytest.fixture(scope="module")
def stack(cpu_pools: CpuPair) -> Iterator[Stack]:
    settings = Settings(standard_urls=[cpu_pools.standard.url], speculative_urls=[cpu_pools.speculative.url],
                        reload_rules=False)
    with ThreadServer(create_app(settings)) as gateway:
        ready = httpx.get(f"{gateway.url}/ready", timeout=10)
        for _ in range(40):
            if ready.status_code == 200 and all(p["healthy"] for p in ready.json()["pools"].values()):
                break
            ready = httpx.get(f"{gateway.url}/ready", timeout=10)
        yield Stack(cpu_pools, gateway.url)


def chat(stack: Stack, messages: list[dict[str, str]], max_tokens: int) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{stack.gateway}/v1/chat/completions", json=body, timeout=120)


def test_servers_came_up_in_reasonable_time(stack: Stack) -> None:
    assert stack.pools.startup_s < 240


def test_code_edit_goes_to_the_speculative_pool_and_drafts_are_accepted(stack: Stack) -> None:
    spec_url, std_url = stack.pools.speculative.url, stack.pools.standard.url
    spec_before, std_before = counters(spec_url), successes(std_url)
    response = chat(stack, CODE_EDIT, max_tokens=96)
    assert response.status_code == 200, response.text
    assert response.headers["x-specgate-pool"] == "speculative"
    assert response.headers["x-specgate-task"] == "code"
    assert response.json()["usage"]["completion_tokens"] > 0
    spec_after = counters(spec_url)
    assert spec_after["vllm:request_success_total"] == spec_before["vllm:request_success_total"] + 1
    assert successes(std_url) == std_before
    drafted = (spec_after["vllm:spec_decode_num_draft_tokens_total"]
               - spec_before["vllm:spec_decode_num_draft_tokens_total"])
    accepted = (spec_after["vllm:spec_decode_num_accepted_tokens_total"]
                - spec_before["vllm:spec_decode_num_accepted_tokens_total"])
    assert drafted > 0 and accepted > 0, (drafted, accepted)


def test_chat_goes_to_the_standard_pool(stack: Stack) -> None:
    spec_url, std_url = stack.pools.speculative.url, stack.pools.standard.url
    spec_before, std_before = counters(spec_url), successes(std_url)
    response = chat(stack, CHAT, max_tokens=64)
    assert response.status_code == 200, response.text
    assert (response.headers["x-specgate-pool"], response.headers["x-specgate-task"]) == ("standard", "chat")
    assert response.json()["choices"][0]["message"]["content"]
    assert successes(std_url) == std_before + 1
    spec_after = counters(spec_url)
    assert spec_after["vllm:request_success_total"] == spec_before["vllm:request_success_total"]
    assert spec_after.get("vllm:spec_decode_num_draft_tokens_total") == spec_before.get(
        "vllm:spec_decode_num_draft_tokens_total")


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
