"""Usage on every stream (gateway/stream_usage.py): asked of the pool, removed where the client did not ask."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from gateway.logs import REQUEST_LOGGER
from gateway.stream_usage import UsageStrip, ask_usage
from tests.conftest import Gateway, Upstreams, wait_for
from tests.sse import events, parsed, text

StartGateway = Callable[..., Gateway]

ROLE = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
DELTA = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
FINISH = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},'
          b'"finish_reason":"stop"}]}\n\n')  # fmt: skip
USAGE = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":5,'
         b'"completion_tokens":7,"total_tokens":12,"metrics":{"speculative_decoding":'
         b'{"mean_acceptance_length":2.5}}}}\n\n')  # fmt: skip
DONE = b"data: [DONE]\n\n"
STREAM = ROLE + DELTA + DELTA + FINISH + USAGE + DONE
WITHOUT_USAGE = ROLE + DELTA + DELTA + FINISH + DONE


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True, **extra}


@pytest.mark.parametrize("payload", [
    chat(), chat(max_tokens=5, n=1), {"stream": True, "prompt": "x", "model": "m"},
], ids=["chat", "chat-more-keys", "completion"])  # fmt: skip
def test_a_stream_without_stream_options_is_spliced_with_include_usage(payload: dict[str, Any]) -> None:
    for body in (orjson.dumps(payload), b"  \n" + json.dumps(payload, indent=2).encode()):
        forwarded, strip = ask_usage(body)
        assert strip is not None
        assert orjson.loads(forwarded) == {**payload, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("options", [
    {}, {"include_usage": False}, {"continuous_usage_stats": True}, {"include_usage": None},
])  # fmt: skip
def test_stream_options_without_usage_get_usage_once_at_the_end(options: dict[str, Any]) -> None:
    forwarded, strip = ask_usage(orjson.dumps(chat(stream_options=options)))
    assert strip is not None
    sent = orjson.loads(forwarded)
    assert sent == chat(stream_options={**options, "include_usage": True, "continuous_usage_stats": False})


@pytest.mark.parametrize("options", [{"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}])
def test_a_client_that_asked_for_usage_keeps_its_body_and_its_usage(options: dict[str, Any]) -> None:
    body = orjson.dumps(chat(stream_options=options))
    assert ask_usage(body) == (body, None)


def test_stream_options_that_are_not_an_object_are_left_to_the_engine() -> None:
    body = orjson.dumps(chat(stream_options="yes"))
    assert ask_usage(body) == (body, None)


def test_the_usage_event_is_removed_however_the_stream_is_cut_into_reads() -> None:
    for size in range(1, len(STREAM) + 1):
        strip, out = UsageStrip(), b""
        for at in range(0, len(STREAM), size):
            out += strip.take(STREAM[at : at + size])
        out += strip.end(b"")
        assert out == WITHOUT_USAGE, size
        assert strip.stripped == 1


def test_every_split_point_of_two_reads_keeps_all_other_events() -> None:
    for cut in range(len(STREAM) + 1):
        strip = UsageStrip()
        assert strip.take(STREAM[:cut]) + strip.take(STREAM[cut:]) + strip.end(b"") == WITHOUT_USAGE, cut


def test_a_read_with_no_usage_on_an_event_boundary_passes_untouched() -> None:
    strip = UsageStrip()
    chunk = ROLE + DELTA
    assert strip.take(chunk) is chunk


def test_usage_inside_a_choice_event_is_not_removed() -> None:
    continuous = DELTA[:-3] + b',"usage":{"completion_tokens":1}}\n\n'  # continuous usage: the event has choices
    strip = UsageStrip()
    assert strip.take(continuous + USAGE) + strip.end(b"") == continuous
    assert strip.stripped == 1


def test_a_last_usage_event_without_its_blank_line_is_removed_at_the_end() -> None:
    strip = UsageStrip()
    assert strip.take(DELTA) == DELTA
    assert strip.end(USAGE.rstrip(b"\n")) == b""
    strip = UsageStrip()
    assert strip.end(DELTA + USAGE[:-2]) == DELTA


def usage_events(raw: list[bytes]) -> list[dict[str, Any]]:
    return [e for e in parsed(raw) if e.get("usage")]


@pytest.mark.parametrize("client", ["auto", "aiohttp"], ids=["direct-body", "plain-asgi"])
def test_the_gateway_learns_exact_tokens_from_streams_whose_clients_did_not_ask(
    gateway: StartGateway, upstreams: Upstreams, client: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The fake streams a role event then 12 one-token events: counted as events, 13 tokens; its usage says 12."""
    gw = gateway(upstream_client=client, log_format="json")
    headers = {"x-fake-chunks": "12", "x-fake-role": "1"}
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER), httpx.Client(base_url=gw.url, timeout=10) as http:
        plain = events(http.post("/v1/chat/completions", json=chat(max_tokens=64), headers=headers))
        sent = upstreams.standard.last_body or upstreams.speculative.last_body
        asked = events(http.post("/v1/chat/completions", json=chat(max_tokens=64, stream_options={
            "include_usage": True}), headers=headers))  # fmt: skip
        wait_for(lambda: sum(r.name == REQUEST_LOGGER for r in caplog.records) == 2, what="two request lines")
    assert sent is not None and sent["stream_options"] == {"include_usage": True}
    assert usage_events(plain) == [] and plain[-1] == b"data: [DONE]"
    assert text(parsed(plain)) == text(parsed(asked)) == "".join(f"t{i} " for i in range(12))
    assert [e["usage"]["completion_tokens"] for e in usage_events(asked)] == [12]
    tokens = [r.fields["tokens"] for r in caplog.records if r.name == REQUEST_LOGGER]
    assert tokens == [12, 12]


def test_with_stream_usage_off_the_body_goes_as_sent_and_tokens_are_counted_from_events(
    gateway: StartGateway, upstreams: Upstreams, caplog: pytest.LogCaptureFixture
) -> None:
    gw = gateway(stream_usage=False, log_format="json")
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER), httpx.Client(base_url=gw.url, timeout=10) as http:
        raw = events(http.post("/v1/chat/completions", json=chat(max_tokens=64),
                               headers={"x-fake-chunks": "12", "x-fake-role": "1"}))  # fmt: skip
        wait_for(lambda: any(r.name == REQUEST_LOGGER for r in caplog.records), what="request line")
    sent = upstreams.standard.last_body or upstreams.speculative.last_body
    assert sent is not None and "stream_options" not in sent
    assert usage_events(raw) == []
    record = next(r for r in caplog.records if r.name == REQUEST_LOGGER)
    assert record.fields["tokens"] == 13  # role + 12 content events: what counting events can know
