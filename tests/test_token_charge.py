"""What a key's token limit is charged when the client goes away (issue 27 item 1): what was generated for it
and the prompt; only a request that never reached a pool is refunded (_Relay.used_tokens, Access.finish)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import Gateway, dead_url, wait_for

StartGateway = Callable[..., Gateway]
KEYS = """
keys:
  - {name: tpm, key: sk-tpm, tpm: 100000}
"""
AUTH = {"authorization": "Bearer sk-tpm"}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}], **extra}


def _charged(gw: Gateway) -> int:
    """Tokens the key was charged by requests that ended (its specgate_key_tokens count), once none is in flight."""
    access = gw.app.state.access
    key = access.limiter.keys["tpm"]
    wait_for(lambda: key.inflight == 0, what="the request settled")
    charged: int = access.keys[next(iter(access.keys))].stats.tokens
    return charged


def _drop_stream_after(gw: Gateway, events: int, headers: dict[str, str]) -> int:
    """Open a stream, read ``events`` SSE events, close the connection; the events read."""
    seen = 0
    body = chat(stream=True, max_tokens=500)
    with (
        httpx.Client(base_url=gw.url, headers={**AUTH, **headers}, timeout=10) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= events:
                break
    return seen


def test_a_stream_the_client_drops_is_charged_what_was_relayed_and_the_prompt(gateway: StartGateway) -> None:
    gw = gateway(keys=KEYS)
    read = _drop_stream_after(gw, 30, {"x-fake-chunks": "400", "x-fake-stall-after": "40"})
    charged = _charged(gw)
    assert charged >= read + 1, charged  # at least what the client read, plus a prompt token
    assert charged < 500  # not the whole booking: the stream stopped at 40 events
    bucket = gw.app.state.access.limiter.keys["tpm"].tokens
    assert bucket is not None and bucket.limit - bucket.level > 0  # the bucket was not handed everything back


def test_a_non_streamed_request_the_client_abandons_is_charged_its_booking(gateway: StartGateway) -> None:
    gw = gateway(keys=KEYS)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gw.url + "/v1/chat/completions", json=chat(max_tokens=300), headers={**AUTH, "x-fake-delay": "3"},
                   timeout=0.5)  # fmt: skip
    assert _charged(gw) >= 300  # what the engine generated for it is unknown: the booking stands


def test_a_request_that_never_reached_a_pool_is_refunded(gateway: StartGateway) -> None:
    gw = gateway(keys=KEYS, standard_urls=[dead_url()], speculative_urls=[dead_url()])
    r = httpx.post(gw.url + "/v1/chat/completions", json=chat(max_tokens=300), headers=AUTH)
    assert r.status_code >= 500
    assert _charged(gw) == 0
    bucket = gw.app.state.access.limiter.keys["tpm"].tokens
    assert bucket is not None and bucket.level == pytest.approx(bucket.limit)


def test_a_key_over_its_limit_is_refused_before_its_body_is_parsed(gateway: StartGateway) -> None:
    gw = gateway(keys="keys:\n  - {name: tpm, key: sk-tpm, rpm: 1}\n")
    assert httpx.post(gw.url + "/v1/chat/completions", json=chat(), headers=AUTH).status_code == 200
    # Not JSON at all: refused for the limit (429), not for the body (400): the body was never parsed.
    r = httpx.post(gw.url + "/v1/chat/completions", content=b"{" * 10000, headers=AUTH)
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
