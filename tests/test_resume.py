"""Resuming a cut stream (gateway/resume.py): the real gateway in front of fake replicas that die mid-stream.

The fake replica's stream is ``t0 t1 t2 ...``; cut after N events, the other pool's fake continues the final
assistant message's text as vLLM would (``continue_final_message``), so a splice is right exactly when the
client's text and usage equal those of the uncut stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from gateway.bench.fake_upstream import FakeUpstream
from gateway.errors import RulesError
from gateway.features import extract_features
from gateway.logs import REQUEST_LOGGER
from gateway.resume import StreamTap, eligible
from gateway.rules import load_rules, reference_rules_path
from gateway.servers import ThreadServer
from tests.conftest import Gateway, Upstreams, dead_url, wait_for
from tests.sse import events, parsed, text

StartGateway = Callable[..., Gateway]
CUT = {"x-fake-chunks": "12", "x-fake-cut-after": "5", "x-fake-role": "1"}


@pytest.fixture
def resume_rules(tmp_path: Path) -> Callable[..., Path]:
    def write(extra: str = "resume: {streams: true}\n") -> Path:
        path = tmp_path / "rules.yaml"
        path.write_text(reference_rules_path().read_text(encoding="utf-8") + "\n" + extra, encoding="utf-8")
        return path

    return write


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_tokens": 12, "stream_options": {"include_usage": True}, **extra}  # fmt: skip


def stream(gw: Gateway, headers: dict[str, str], payload: dict[str, Any] | None = None) -> list[bytes]:
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        return events(client.post("/v1/chat/completions", json=payload or body(), headers=headers))


@pytest.mark.parametrize("client", ["auto", "aiohttp"], ids=["direct-body", "plain-asgi"])
def test_a_cut_stream_is_resumed_on_the_other_pool_as_one_answer(
    gateway: StartGateway, upstreams: Upstreams, resume_rules: Callable[..., Path], client: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    gw = gateway(rules_file=resume_rules(), upstream_client=client, log_format="json")
    uncut = parsed(stream(gw, {k: v for k, v in CUT.items() if k != "x-fake-cut-after"}))
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        raw = stream(gw, CUT)
        wait_for(lambda: any(r.name == REQUEST_LOGGER for r in caplog.records), what="request line")
    events = parsed(raw)
    assert upstreams.standard.cuts == 1 and upstreams.speculative.continuations == 1
    assert raw.count(b"data: [DONE]") == 1 and raw[-1] == b"data: [DONE]"
    assert not any("error" in e for e in events)
    assert {(e["id"], e["created"], e["model"]) for e in events} == {("cmpl-fake", 0, "fake-model")}
    assert sum(1 for e in events for c in e["choices"] if "role" in c["delta"]) == 1
    assert text(events) == text(uncut) == "".join(f"t{i} " for i in range(12))
    assert events[-1]["usage"] == uncut[-1]["usage"] == {"prompt_tokens": 8, "completion_tokens": 12,
                                                         "total_tokens": 20}  # fmt: skip
    assert [c["finish_reason"] for e in events for c in e["choices"]].count("length") == 1
    sent = upstreams.speculative.last_body
    assert sent is not None and sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert sent["messages"][-1] == {"role": "assistant", "content": "t0 t1 t2 t3 t4 "} and sent["max_tokens"] == 7
    wait_for(lambda: gw.sample("specgate_stream_resumes_total", outcome="ok") == 1, what="resume counted")
    reason = "short-output; resumed: speculative"  # max_tokens < 50
    wait_for(lambda: gw.sample("specgate_requests_total", pool="speculative", reason=reason, task="chat",
                               status="200") == 1, what="request counted")  # fmt: skip
    line = [r for r in caplog.records if r.name == REQUEST_LOGGER][-1].fields  # type: ignore[attr-defined]
    assert (line["reason"], line["tokens"]) == (reason, 12)  # a key's token limit is charged both parts


def test_half_an_event_before_the_cut_never_reaches_the_client(
    gateway: StartGateway, upstreams: Upstreams, resume_rules: Callable[..., Path]
) -> None:
    gw = gateway(rules_file=resume_rules())
    events = parsed(stream(gw, {**CUT, "x-fake-cut-partial": "1"}))  # every event whole, or this fails
    assert upstreams.standard.cuts == 1
    assert text(events) == "".join(f"t{i} " for i in range(12))


def test_a_stall_past_the_idle_deadline_is_resumed(
    gateway: StartGateway, upstreams: Upstreams, resume_rules: Callable[..., Path]
) -> None:
    gw = gateway(rules_file=resume_rules(), idle_timeout_s=0.3)
    events = parsed(stream(gw, {"x-fake-chunks": "8", "x-fake-stall-after": "3"}, body(max_tokens=8)))
    assert text(events) == "".join(f"t{i} " for i in range(8)) and events[-1]["usage"]["completion_tokens"] == 8
    assert upstreams.speculative.continuations == 1
    assert gw.sample("specgate_upstream_errors_total", pool="standard", replica=upstreams.standard_url,
                     kind="timeout") == 1  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "rules"),
    [
        ({}, ""),  # the rule off
        ({"logprobs": True}, None),
        ({"n": 2}, None),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, None),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, None),
    ],
    ids=["rule-off", "logprobs", "n2", "tools", "json-schema"],
)
def test_ineligible_streams_still_end_with_the_error_event(
    gateway: StartGateway, upstreams: Upstreams, resume_rules: Callable[..., Path], extra: dict[str, Any],
    rules: str | None,
) -> None:  # fmt: skip
    gw = gateway(rules_file=resume_rules() if rules is None else resume_rules(rules))
    raw = stream(gw, {**CUT, "x-fake-cut-partial": "1"}, body(**extra))
    assert b'"upstream_error"' in raw[-1] and b"[DONE]" not in raw[-1]
    assert raw[-1].startswith(b'data: {"error"')  # the error event starts on a fresh line
    assert raw[-2].startswith(b'data: {"id"') and not raw[-2].endswith(b"}")  # after the half event, as it came
    assert upstreams.speculative.continuations == 0


def test_a_failed_continuation_ends_with_the_error_event(
    gateway: StartGateway, upstreams: Upstreams, resume_rules: Callable[..., Path]
) -> None:
    gw = gateway(rules_file=resume_rules())
    raw = stream(gw, {**CUT, "x-fake-continue-status": "500"})
    events = parsed(raw)
    assert events[-1]["error"]["type"] == "upstream_error" and text(events[:-1]) == "t0 t1 t2 t3 t4 "
    assert upstreams.speculative.continuations == 1
    wait_for(lambda: gw.sample("specgate_stream_resumes_total", outcome="failed") == 1, what="resume counted")


@pytest.mark.parametrize("per_word", [None, 3], ids=["by-events", "by-tokenizer"])
def test_a_limit_used_up_without_a_finish_reason_is_not_presented_as_complete(
    gateway: StartGateway, upstreams: Upstreams, resume_rules: Callable[..., Path], per_word: int | None
) -> None:
    """Counted as past max_tokens (4 events of 4 allowed; or 5 words of 3 tokens each by the tokenizer, of 12),
    but no engine said the answer ended: it was cut, so the client sees the error event, not a finished answer."""
    upstreams.speculative.tokens_per_word = per_word
    gw = gateway(rules_file=resume_rules())
    raw = stream(gw, {"x-fake-chunks": "10", "x-fake-cut-after": "4"}, body(max_tokens=4)) if per_word is None else (
        stream(gw, CUT))  # fmt: skip
    events = parsed(raw)
    assert events[-1]["error"]["type"] == "upstream_error" and b"[DONE]" not in b"".join(raw)
    assert not any(c.get("finish_reason") for e in events for c in e.get("choices", []))
    assert not any(e.get("usage") for e in events)
    assert upstreams.speculative.continuations == 0 and upstreams.standard.cuts == 1
    wait_for(lambda: gw.sample("specgate_stream_resumes_total", outcome="failed") == 1, what="resume counted")


class CountingUpstream(FakeUpstream):
    """A fake whose /tokenize counts as its streams do: one token per word of a text, and a chat's prompt
    as its usage reports it (8 tokens)."""

    async def _tokenize(self, request: web.Request) -> web.Response:
        payload = await request.json()
        count = 8 if "messages" in payload else len(str(payload.get("prompt", "")).split())
        return web.json_response({"count": count, "max_model_len": 2048})


@pytest.fixture
def counting() -> Iterator[Upstreams]:
    std, spec = CountingUpstream(name="standard"), CountingUpstream(name="speculative")
    with ThreadServer(std.app()) as s1, ThreadServer(spec.app()) as s2:
        yield Upstreams(std, spec, s1.url, s2.url)


def test_an_answer_cut_after_its_finish_reason_ends_with_its_usage_and_done(
    gateway: StartGateway, counting: Upstreams, resume_rules: Callable[..., Path]
) -> None:
    """The engine said the answer ended; the cut took the usage event and [DONE]: the client gets both, the
    usage as the uncut stream's (the prompt and the relayed text counted by another replica's /tokenize)."""
    gw = gateway(rules_file=resume_rules(), standard_urls=[counting.standard_url],
                 speculative_urls=[counting.speculative_url])  # fmt: skip
    for payload in (body(max_tokens=4), body(max_tokens=4, stream_options=None)):  # usage asked, not asked
        uncut = parsed(stream(gw, {"x-fake-chunks": "4"}, payload))
        raw = stream(gw, {"x-fake-chunks": "4", "x-fake-cut-after": "4"}, payload)
        events = parsed(raw)
        assert raw[-1] == b"data: [DONE]" and not any("error" in e for e in events)
        assert text(events) == text(uncut) == "t0 t1 t2 t3 "
        assert [e.get("usage") for e in events] == [e.get("usage") for e in uncut]
        assert [c["finish_reason"] for e in events for c in e["choices"]] == [None, None, None, "length"]
    assert "usage" not in events[-1] and events[-1]["choices"][0]["finish_reason"] == "length"  # not asked
    usage_event = parsed(stream(gw, {"x-fake-chunks": "4", "x-fake-cut-after": "4"}, body(max_tokens=4)))[-1]
    assert usage_event["usage"] == {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12}
    assert (usage_event["id"], usage_event["choices"]) == ("cmpl-fake", [])
    assert counting.standard.cuts == 3 and counting.speculative.continuations == 0
    wait_for(lambda: gw.sample("specgate_stream_resumes_total", outcome="ended") == 3, what="resume counted")


def test_usage_owed_where_no_replica_can_count_is_estimated(
    gateway: StartGateway, upstreams: Upstreams, resume_rules: Callable[..., Path]
) -> None:
    """No /tokenize (the fake echoes): the prompt is the gateway's estimate, the completion the events relayed."""
    gw = gateway(rules_file=resume_rules())
    events = parsed(stream(gw, {"x-fake-chunks": "4", "x-fake-cut-after": "4"}, body(max_tokens=4)))
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == 4 and usage["total_tokens"] == usage["prompt_tokens"] + 4
    rules = gw.app.state.ruleset
    assert usage["prompt_tokens"] == extract_features(body(), "chat", {}, rules.rules, rules.classifier).prompt_tokens


@pytest.mark.parametrize("attempts", [1, 2])
def test_each_attempt_tries_a_replica_not_tried_before(
    gateway: StartGateway, upstreams: Upstreams, resume_rules: Callable[..., Path], attempts: int
) -> None:
    gw = gateway(rules_file=resume_rules(f"resume: {{streams: true, max_attempts: {attempts}}}\n"),
                 standard_urls=[upstreams.standard_url, dead_url()], health_interval_s=60)  # fmt: skip
    _, dead = gw.app.state.pools.pools["standard"].replicas
    dead.set_healthy(True)  # as if its last check had passed: the first continuation goes to it (same pool)
    heavy = dead.book(10**9)  # ... but not the request itself
    raw = stream(gw, CUT)
    heavy.release()
    assert upstreams.standard.cuts == 1 and not dead.healthy
    if attempts == 1:
        assert b'"upstream_error"' in raw[-1] and upstreams.speculative.continuations == 0
    else:
        assert text(parsed(raw)) == "".join(f"t{i} " for i in range(12)) and raw[-1] == b"data: [DONE]"
        assert upstreams.speculative.continuations == 1
    outcome = "ok" if attempts == 2 else "failed"
    wait_for(lambda: gw.sample("specgate_stream_resumes_total", outcome=outcome) == 1, what="resume counted")


@pytest.mark.parametrize("client", ["auto", "aiohttp"], ids=["direct-body", "plain-asgi"])
def test_a_client_gone_during_the_continuation_cancels_it(
    gateway: StartGateway, upstreams: Upstreams, resume_rules: Callable[..., Path], client: str
) -> None:
    gw = gateway(rules_file=resume_rules(), upstream_client=client)
    headers = {"x-fake-chunks": "200", "x-fake-cut-after": "3", "x-fake-interval": "0.02"}
    with (
        httpx.Client(base_url=gw.url, timeout=10) as http,
        http.stream("POST", "/v1/chat/completions", json=body(max_tokens=200), headers=headers) as r,
    ):
        for line in r.iter_lines():
            if '"t6 "' in line:  # the continuation's fourth event
                break
    wait_for(lambda: upstreams.speculative.cancelled == 1, what="continuation cancelled")
    wait_for(lambda: gw.sample("specgate_requests_total", pool="standard", reason="default", task="chat",
                               status="499") == 1, what="disconnect counted")  # fmt: skip


def test_the_rules_key_is_validated(resume_rules: Callable[..., Path]) -> None:
    assert load_rules(resume_rules("resume: {streams: true, max_attempts: 2}\n")).resume.max_attempts == 2
    assert load_rules(reference_rules_path()).resume.streams is False  # off unless the file says so
    for bad, where in (("resume: {streams: maybe}\n", "resume.streams"), ("resume: {max_attempts: 0}\n",
                       "resume.max_attempts"), ("resume: {stream: true}\n", "resume.stream")):  # fmt: skip
        with pytest.raises(RulesError, match=where):
            load_rules(resume_rules(bad))


@pytest.mark.parametrize(
    ("extra", "ok"),
    [
        ({}, True),
        ({"tools": [{"type": "function"}], "tool_choice": "none"}, True),
        ({"response_format": {"type": "text"}}, True),
        ({"top_logprobs": 2}, False),
        ({"echo": True}, False),
        ({"response_format": {"type": "json_object"}}, False),
        ({"stream_options": {"include_usage": True, "continuous_usage_stats": True}}, False),
        ({"guided_regex": "a+"}, False),
        ({"continue_final_message": True, "add_generation_prompt": False}, False),  # the last message is a user's
        ({"add_generation_prompt": False}, False),
    ],
)
def test_eligibility(extra: dict[str, Any], ok: bool) -> None:
    assert eligible({"messages": [{"role": "user", "content": "hi"}], **extra}) is ok


def test_a_client_continuing_its_own_message_gets_the_relayed_text_appended() -> None:
    payload = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once"}],
               "continue_final_message": True, "add_generation_prompt": False, "max_completion_tokens": 9,
               "min_tokens": 3}  # fmt: skip
    assert eligible(payload)
    tap = StreamTap(payload, 1)
    assert tap.take(b'data: {"id":"a","choices":[{"delta":{"content":" upon"}}]}\n\ndata: {"id":"a","cho') == (
        b'data: {"id":"a","choices":[{"delta":{"content":" upon"}}]}\n\n'
    )
    assert tap.take(b'ices":[{"delta":{"content":" a"}}]}\n\n').endswith(b'" a"}}]}\n\n')
    sent = orjson.loads(tap.continuation(tap.remaining()))
    assert sent["messages"][-1] == {"role": "assistant", "content": "Once upon a"}
    assert (sent["max_completion_tokens"], sent["min_tokens"], len(sent["messages"])) == (7, 1, 2)


def test_a_resumed_stream_is_not_learned_from(gateway: StartGateway, upstreams: Upstreams, tmp_path: Path) -> None:
    """Its time includes the cut and a second prefill: not one request's latency on either pool."""
    import time

    import yaml

    from gateway.rules import default_rules_path

    rules = yaml.safe_load(default_rules_path().read_text(encoding="utf-8"))
    rules["resume"] = {"streams": True}
    path = tmp_path / "adaptive.yaml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    # two replicas of the standard pool (the second is the other fake): the continuation stays on the pool
    gw = gateway(rules_file=path, standard_urls=[upstreams.standard_url, upstreams.speculative_url],
                 speculative_urls=[dead_url()])  # fmt: skip
    learner = gw.app.state.learner
    stream(gw, {k: v for k, v in CUT.items() if k != "x-fake-cut-after"})
    wait_for(lambda: learner.observations >= 1, what="the uncut stream learned")
    before = learner.observations
    events = parsed(stream(gw, CUT))
    assert upstreams.speculative.continuations + upstreams.standard.continuations == 1
    assert not any("error" in e for e in events)
    time.sleep(0.3)  # several snapshot ticks (0.05 s): anything queued would have been folded in
    assert learner.observations == before


def test_the_tokens_already_sent_are_counted_by_the_replicas_tokenizer(
    gateway: StartGateway, upstreams: Upstreams, resume_rules: Callable[..., Path]
) -> None:
    """A speculative replica sends several tokens per event: the continuation's max_tokens is what the client
    allowed minus the relayed text's tokens as vLLM's /tokenize counts them, not minus the events."""
    upstreams.speculative.tokens_per_word = 2  # the continuing replica's tokenizer: "t0 " is two tokens
    gw = gateway(rules_file=resume_rules())
    events = parsed(stream(gw, CUT))  # 5 content events relayed = 10 tokens; max_tokens 12
    assert upstreams.speculative.continuations == 1
    sent = upstreams.speculative.last_body
    assert sent is not None and sent["max_tokens"] == 2
    usage = next(e["usage"] for e in events if e.get("usage"))
    assert usage["completion_tokens"] == 10 + 2  # the relayed text's count plus the continuation's own
