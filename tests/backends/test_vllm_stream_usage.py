"""Usage on every stream, with the REAL vLLM 0.32 CPU servers: the gateway asks the engine for usage, the client
that did not ask gets none, and the gateway still counts the stream's exact tokens (gateway/stream_usage.py).

The speculative (n-gram) server's events carry several tokens each, so counting events undercounts there: the
request log's token count equals the engine's own usage only if the gateway got it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx
import orjson
import pytest

from backends.cpu_engine import CpuPair
from backends.manifest import load_manifest, pool_path
from gateway.app import create_app
from gateway.config import Settings
from gateway.logs import REQUEST_LOGGER
from gateway.rules import reference_rules_path
from gateway.servers import ThreadServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MODEL = load_manifest(pool_path("standard", cpu=True)).served_model_name
CODE_EDIT = [
    {"role": "system", "content": "You are a coding assistant. Return the whole edited code."},
    {"role": "user", "content": "Rename the variable x to total:\n```python\ndef total_price(items):\n    x = 0\n"
                                "    for item in items:\n        x += item.price * item.quantity\n    return x\n```"},
]  # fmt: skip


def stream(url: str, **extra: Any) -> tuple[str, list[dict[str, Any]]]:
    body = {"model": MODEL, "messages": CODE_EDIT, "max_tokens": 64, "temperature": 0, "stream": True, **extra}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    events = [e[6:] for e in response.content.split(b"\n\n") if e.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    return response.headers.get("x-specgate-pool", ""), [orjson.loads(e) for e in events[:-1]]


def test_a_client_that_did_not_ask_gets_no_usage_and_the_gateway_counts_exact_tokens(
    cpu_pools: CpuPair, caplog: pytest.LogCaptureFixture
) -> None:
    pools = {"standard_urls": [cpu_pools.standard.url], "speculative_urls": [cpu_pools.speculative.url]}
    settings = Settings(rules_file=reference_rules_path(), reload_rules=False, log_format="json", **pools)
    logs = caplog.at_level(logging.INFO, logger=REQUEST_LOGGER)
    with ThreadServer(create_app(settings)) as gateway, logs:
        deadline = time.monotonic() + 30
        while httpx.get(f"{gateway.url}/ready", timeout=10).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.25)
        pool, plain = stream(gateway.url)
        _, asked = stream(gateway.url, stream_options={"include_usage": True})
        deadline = time.monotonic() + 10
        while sum(r.name == REQUEST_LOGGER for r in caplog.records) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert pool == "speculative"  # a code edit, on the reference rules
    assert not any(e.get("usage") for e in plain)
    usage = [e["usage"] for e in asked if e.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] > 1
    content_events = sum(1 for e in plain for c in e["choices"] if c["delta"].get("content"))
    logged = [r.fields["tokens"] for r in caplog.records if r.name == REQUEST_LOGGER]
    assert logged == [usage[0]["completion_tokens"]] * 2, (logged, usage, content_events)
    assert content_events < logged[0]  # n-gram drafts were accepted: counting events would have undercounted
