"""Two clients' requests with the same ``x-request-id``, at once, through the gateway to one REAL vLLM CPU server.

vLLM takes the ``x-request-id`` it receives as its request id (``chatcmpl-<id>``); the gateway sends its own,
unique per request, and keeps the client's in the response header. Each stream must come back whole, with its
own answer and its own completion id, on two engines:

* ``randomizing``: vLLM 0.32 as the pools run it, which appends a random suffix to the id inside the engine.
  Forwarding the client's id, both answers came back, both named ``chatcmpl-same-client-id``.
* ``strict``: the same server with ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1`` (an engine that keys requests by
  the id it is given). Forwarding the client's id, the second request killed the engine core
  (``AssertionError: duplicate request id``, then ``EngineDeadError``): the first stream stopped after its
  first token, the second got nothing, and the replica stopped answering its health checks.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from backends.cpu_engine import CpuEngine, CpuServer
from backends.manifest import load_manifest, pool_path
from gateway.app import create_app
from gateway.config import Settings
from gateway.rules import reference_rules_path
from gateway.servers import ThreadServer, free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MODEL = load_manifest(pool_path("standard", cpu=True)).served_model_name
CLIENT_ID = "same-client-id"
WORDS = ("banana", "umbrella")


@dataclass
class Stream:
    """One streamed answer as the client read it, with when its first token and its end arrived."""

    headers: httpx.Headers
    text: str = ""
    ids: set[str] = field(default_factory=set)
    finish: str | None = None
    first_token_at: float = 0.0
    done_at: float = 0.0


@pytest.fixture(scope="module")
def strict_engine(cpu_engine: CpuEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One CPU server that keys its requests by the id it is given (see the module's docstring)."""
    log = tmp_path_factory.mktemp("vllm-strict") / "standard.log"
    server = CpuServer(cpu_engine, load_manifest(pool_path("standard", cpu=True)), free_port(), log)
    with pytest.MonkeyPatch.context() as env:  # the server's environment is ours, read at start
        env.setenv("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", "1")
        server.start()
    try:
        server.wait_healthy(240)
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module", params=["randomizing", "strict"])
def gateway_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A gateway whose pools both point at one engine (the test pins the standard pool anyway)."""
    if request.param == "randomizing":
        engine = request.getfixturevalue("cpu_pools").standard.url
    else:
        engine = request.getfixturevalue("strict_engine")
    with pytest.MonkeyPatch.context() as env:  # module scope runs before the autouse env cleaner
        for key in [key for key in os.environ if key.startswith("SPECGATE_")]:
            env.delenv(key)  # scripts/test exports SPECGATE_CACHE / SPECGATE_VENV, which Settings refuses
        settings = Settings(rules_file=reference_rules_path(), standard_urls=[engine], speculative_urls=[engine],
                            reload_rules=False)  # fmt: skip
    with ThreadServer(create_app(settings)) as gateway:
        deadline = time.monotonic() + 30
        while httpx.get(f"{gateway.url}/ready", timeout=10).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.25)
        yield gateway.url


def chat_body(word: str) -> dict[str, Any]:
    prompt = f"Repeat this word five times, separated by spaces, and nothing else: {word}"
    # ignore_eos with 160 tokens: the first stream is still generating when the second one starts
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 160,
            "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip


async def stream_chat(client: httpx.AsyncClient, url: str, word: str, first_token: asyncio.Event) -> Stream:
    headers = {"x-request-id": CLIENT_ID, "x-specgate-pool": "standard"}  # one engine for both
    async with client.stream("POST", f"{url}/v1/chat/completions", json=chat_body(word), headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        stream = Stream(r.headers)
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            stream.ids.add(event["id"])
            for choice in event["choices"]:
                stream.text += choice["delta"].get("content") or ""
                stream.finish = choice.get("finish_reason") or stream.finish
            if stream.text and not first_token.is_set():
                stream.first_token_at = time.monotonic()
                first_token.set()
        stream.done_at = time.monotonic()
    return stream


async def test_two_streams_with_the_same_client_request_id_get_their_own_answers(gateway_url: str) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        first_started, second_started = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(stream_chat(client, gateway_url, WORDS[0], first_started))
        await asyncio.wait_for(first_started.wait(), 60)  # the first is running on the engine...
        second = await stream_chat(client, gateway_url, WORDS[1], second_started)  # ...when the second starts
        first_stream = await first
    assert second.first_token_at < first_stream.done_at, "the two requests were not on the engine at once"
    for stream, word, other in ((first_stream, *WORDS), (second, *reversed(WORDS))):
        assert stream.headers.get_list("x-request-id") == [CLIENT_ID]
        assert stream.headers["x-specgate-pool"] == "standard"
        assert stream.finish == "length", stream.text
        assert word in stream.text.lower() and other not in stream.text.lower(), stream.text
        assert len(stream.ids) == 1, stream.ids  # one completion id per stream...
    assert first_stream.ids != second.ids  # ...and not the same one for two completions
    assert CLIENT_ID not in str(first_stream.ids | second.ids)  # the engine never saw the client's id
