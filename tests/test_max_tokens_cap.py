"""A key's max_tokens cap on every generating endpoint, in every spelling an engine accepts (issue 27 item 2),
and the up-front token charge of batches (prompts x n x max_tokens): gateway/bounds.py, ApiKey.cap."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.bounds import length_bound, prompt_count, sequences
from gateway.errors import InvalidRequest
from tests.conftest import Gateway, Upstreams, wait_for

StartGateway = Callable[..., Gateway]
CAP = 64
KEYS = f"""
keys:
  - {{name: capped, key: sk-capped, max_tokens: {CAP}}}
  - {{name: tpm, key: sk-tpm, tpm: 1000}}
"""
MESSAGES = [{"role": "user", "content": "hi"}]
# endpoint: (body without any length field, the field the cap is sent as when none is given, routed)
ENDPOINTS: dict[str, tuple[dict[str, Any], str]] = {
    "/v1/chat/completions": ({"model": "fake-model", "messages": MESSAGES}, "max_tokens"),
    "/v1/completions": ({"model": "fake-model", "prompt": "hi"}, "max_tokens"),
    "/v1/responses": ({"model": "fake-model", "input": "hi"}, "max_output_tokens"),
    "/v1/messages": ({"model": "fake-model", "messages": MESSAGES}, "max_tokens"),
    "/cohere/v2/chat": ({"model": "fake-model", "messages": MESSAGES}, "max_tokens"),
    "/v1/chat/completions/batch": ({"model": "fake-model", "messages": [MESSAGES, MESSAGES]}, "max_tokens"),
}
REFUSED: dict[str, dict[str, Any]] = {
    "max_tokens over": {"max_tokens": 100000},
    "max_completion_tokens over": {"max_completion_tokens": 100000},
    "max_output_tokens over": {"max_output_tokens": 100000},
    "string": {"max_tokens": "100000"},
    "float": {"max_tokens": 100000.0},
    "string under the cap": {"max_tokens": "10"},
    "bool": {"max_tokens": True},
    "both names, the small one first": {"max_completion_tokens": 1, "max_tokens": 100000},
    "both names, the large one first": {"max_tokens": 100000, "max_completion_tokens": 10},
    "output name beside a small one": {"max_output_tokens": 100000, "max_tokens": 5},
    "zero": {"max_tokens": 0},
}
ACCEPTED: dict[str, tuple[dict[str, Any], int]] = {
    "at the cap": ({"max_tokens": CAP}, CAP),
    "under the cap": ({"max_tokens": 5}, 5),
    "none given": ({}, CAP),
}


def _forwarded(upstreams: Upstreams, response: httpx.Response) -> dict[str, Any]:
    """The body the pool received: the fake's record for chat and completions, the echo for the rest."""
    payload = response.json()
    if "body" in payload:
        forwarded: dict[str, Any] = httpx.Response(200, content=payload["body"]).json()
        return forwarded
    fake = upstreams.standard if response.headers["x-specgate-pool"] == "standard" else upstreams.speculative
    assert fake.last_body is not None
    return fake.last_body


def _posts(upstreams: Upstreams, path: str) -> int:
    fakes = (upstreams.standard, upstreams.speculative)
    return sum(1 for fake in fakes for method, seen, _ in fake.seen if (method, seen) == ("POST", path))


@pytest.mark.parametrize("spelling", REFUSED.values(), ids=list(REFUSED))
@pytest.mark.parametrize("path", list(ENDPOINTS))
def test_every_spelling_over_or_not_an_integer_is_refused_on_every_endpoint(
    gateway: StartGateway, upstreams: Upstreams, path: str, spelling: dict[str, Any]
) -> None:
    gw = gateway(keys=KEYS)
    body = {**ENDPOINTS[path][0], **spelling}
    r = httpx.post(gw.url + path, json=body, headers={"authorization": "Bearer sk-capped"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] in spelling
    assert _posts(upstreams, path) == 0  # nothing reached a pool


@pytest.mark.parametrize(("spelling", "sent"), ACCEPTED.values(), ids=list(ACCEPTED))
@pytest.mark.parametrize("path", list(ENDPOINTS))
def test_within_the_cap_goes_through_and_none_given_sends_the_cap(
    gateway: StartGateway, upstreams: Upstreams, path: str, spelling: dict[str, Any], sent: int
) -> None:
    gw = gateway(keys=KEYS)
    base, field = ENDPOINTS[path]
    r = httpx.post(gw.url + path, json={**base, **spelling}, headers={"authorization": "Bearer sk-capped"})
    assert r.status_code == 200, r.text
    forwarded = _forwarded(upstreams, r)
    name = next(iter(spelling), field)
    assert forwarded[name] == sent


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/completions", {"prompt": ["hi"] * 100, "max_tokens": 64}, 429),  # 100 prompts: 6,400 tokens
        ("/v1/completions", {"prompt": [[1, 2, 3]] * 20, "max_tokens": 64}, 429),  # token-id prompts: 1,280
        ("/v1/completions", {"prompt": ["hi"] * 10, "max_tokens": 64}, 200),  # 640: within 1,000
        ("/v1/completions", {"prompt": ["hi"] * 5, "max_tokens": 64, "n": 4}, 429),  # 5 x 4 x 64 = 1,280
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 64, "n": 20}, 429),
        ("/v1/chat/completions/batch", {"messages": [MESSAGES] * 4, "max_tokens": 64, "n": 4}, 429),
        ("/v1/chat/completions/batch", {"messages": [MESSAGES] * 4, "max_tokens": 64, "best_of": 5}, 429),
        ("/v1/chat/completions/batch", {"messages": [MESSAGES] * 4, "max_tokens": 64}, 200),  # 256
    ],
    ids=["100-prompts", "token-id-prompts", "10-prompts", "prompts-x-n", "chat-n", "batch-x-n", "batch-best-of",
         "batch"],
)  # fmt: skip
def test_the_token_charge_counts_every_sequence_a_request_generates(
    gateway: StartGateway, path: str, body: dict[str, Any], status: int
) -> None:
    gw = gateway(keys=KEYS)
    r = httpx.post(gw.url + path, json={"model": "fake-model", **body}, headers={"authorization": "Bearer sk-tpm"})
    assert r.status_code == status, r.text
    if status == 429:
        assert "Request too large" in r.json()["error"]["message"]
    key = gw.app.state.access.limiter.keys["tpm"]
    wait_for(lambda: key.inflight == 0, what="the request settled")


def test_length_bound_takes_the_largest_spelling_and_refuses_what_is_not_an_integer() -> None:
    assert length_bound({}) is None
    assert length_bound({"max_tokens": 5}) == ("max_tokens", 5)
    assert length_bound({"max_completion_tokens": 10, "max_tokens": 100000}) == ("max_tokens", 100000)
    assert length_bound({"max_output_tokens": 7, "max_tokens": None}) == ("max_output_tokens", 7)
    for bad in ("9", 9.0, True, -1, 0, [9], {"v": 9}):
        with pytest.raises(InvalidRequest):
            length_bound({"max_tokens": bad})


def test_sequences_and_prompts() -> None:
    assert sequences({}) == 1 and sequences({"n": 3}) == 3 and sequences({"n": 2, "best_of": 5}) == 5
    with pytest.raises(InvalidRequest):
        sequences({"n": "3"})
    assert prompt_count("hi") == 1 and prompt_count([1, 2, 3]) == 1  # one prompt of token ids
    assert prompt_count(["a", "b"]) == 2 and prompt_count([[1], [2], [3]]) == 3
