"""The emulator's Responses API, tokenizer, embeddings and version endpoints, on both transports (EMULATED)."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator

import httpx
import orjson
import pytest

from backends.emulator.aiohttp_server import build_aiohttp_app
from backends.emulator.core import EmulatorCore
from backends.emulator.extras import VOCABULARY, decode, encode, fake_vector
from backends.emulator.profiles import load_profile
from backends.emulator.server import EmulatorApp, EmulatorConfig
from backends.emulator.text import STYLES, token_text
from backends.workloads.loader import count_tokens
from gateway.servers import ThreadServer

CONFIG = EmulatorConfig(load_profile("cpu-smollm2"), speculative=True, speed=50.0)
MODEL = CONFIG.model_name


@pytest.fixture(scope="module", params=["asgi", "aiohttp"])
def client(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    app: object = EmulatorApp(CONFIG) if request.param == "asgi" else build_aiohttp_app(EmulatorCore(CONFIG))
    with ThreadServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


def sse(body: bytes) -> list[tuple[str, dict[str, object]]]:
    events = []
    for block in body.decode().strip().split("\n\n"):
        kind, data = block.split("\n", 1)
        assert kind.startswith("event: ") and data.startswith("data: ")
        events.append((kind[7:], orjson.loads(data[6:])))
    return events


def test_response_body_is_kept_for_retrieve(client: httpx.Client) -> None:
    created = client.post("/v1/responses", json={"model": MODEL, "input": "hello", "max_output_tokens": 5})
    assert created.status_code == 200 and created.headers["x-specgate-emulated"] == "true"
    body = created.json()
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == 5 and body["output"][0]["content"][0]["type"] == "output_text"
    assert client.get(f"/v1/responses/{body['id']}").json() == body
    cancel = client.post(f"/v1/responses/{body['id']}/cancel")
    assert cancel.status_code == 400 and "Cannot cancel" in cancel.json()["error"]["message"]
    missing = client.get("/v1/responses/resp_missing")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "response_id"


def test_response_stream_has_vllms_events(client: httpx.Client) -> None:
    body = {"model": MODEL, "input": [{"role": "user", "content": "hi"}], "max_output_tokens": 6, "stream": True}
    streamed = client.post("/v1/responses", json=body)
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = sse(streamed.content)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert all(data["type"] == kind for kind, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    deltas = "".join(str(data["delta"]) for kind, data in events if kind == "response.output_text.delta")
    final = events[-1][1]["response"]
    assert isinstance(final, dict) and final["output"][0]["content"][0]["text"] == deltas
    assert client.get(f"/v1/responses/{final['id']}").json() == final


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "stream": 1}, "stream"),
    ],
)
def test_bad_responses_requests(client: httpx.Client, body: dict[str, object], param: str) -> None:
    response = client.post("/v1/responses", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_tokenize_round_trip(client: httpx.Client) -> None:
    tokens = client.post("/tokenize", json={"model": MODEL, "prompt": "héllo", "return_token_strs": True}).json()
    assert tokens["count"] == 6 and tokens["max_model_len"] == CONFIG.profile.max_model_len  # not a word it says
    assert client.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": "héllo"}
    ascii = " the answer, hello\n    for x  "
    strs = client.post("/tokenize", json={"prompt": ascii, "return_token_strs": True}).json()["token_strs"]
    assert strs == [" the", " answer", ",", *" hello", "\n    for", *" x  "]  # its words, else bytes
    mixed = " the answer, héllo 是\n    for x  "
    tokens = client.post("/tokenize", json={"prompt": mixed}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": tokens}).json() == {"prompt": mixed}
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] == 4 + 2 + 2  # around the message, the two bytes of "hi", opening the answer
    assert client.post("/detokenize", json={"tokens": [256 + len(VOCABULARY)]}).status_code == 400
    assert client.post("/tokenize", json={"model": "other", "prompt": "x"}).status_code == 404


def test_every_answer_is_tokenized_as_the_tokens_it_was_made_of() -> None:
    assert len(set(VOCABULARY)) == len(VOCABULARY) < 256
    for style in STYLES:
        for start in range(0, 60, 7):
            for count in range(0, 70):
                answer = token_text(style, start, count)
                assert len(encode(answer)) == count_tokens(answer) == count, (style, start, count, answer)
                assert decode(encode(answer)) == answer


# prompts made of the emulator's own words, which its tokenizer counts as its usage does
PROMPTS = {
    "en": " the answer is a simple way to think about it.",
    "zh": "这是一个简单的问题",
    "code": "def result(items):",
}


def answer(client: httpx.Client, messages: list[dict[str, str]], max_tokens: int, **extra: object) -> dict[str, object]:
    """A streamed answer's text, usage and finish reason."""
    body = {"messages": messages, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **extra}  # fmt: skip
    events = [orjson.loads(line[6:]) for line in client.post("/v1/chat/completions", json=body).text.splitlines()
              if line.startswith("data: {")]  # fmt: skip
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    return {"text": text, "usage": events[-1]["usage"], "finish": finish, "events": len(events) - 1}


@pytest.mark.parametrize("style", list(PROMPTS))
def test_tokenize_counts_a_stream_as_its_usage_does(client: httpx.Client, style: str) -> None:
    """/tokenize counts the text a stream emitted as its completion tokens, and a chat as its prompt tokens
    (a chat of the emulator's words): a gateway that resumes a cut stream counts both this way."""
    messages = [{"role": "user", "content": PROMPTS[style]}]
    uncut = answer(client, messages, 60)
    usage = uncut["usage"]
    assert isinstance(usage, dict) and usage["completion_tokens"] == 60 and uncut["finish"] == ["length"]
    assert uncut["events"] < 60  # a speculative engine: several tokens per event
    assert client.post("/tokenize", json={"prompt": uncut["text"]}).json()["count"] == 60
    assert client.post("/tokenize", json={"messages": messages}).json()["count"] == usage["prompt_tokens"]


@pytest.mark.parametrize("style", list(PROMPTS))
def test_a_continued_message_goes_on_where_it_stopped(client: httpx.Client, style: str) -> None:
    """vLLM's continue_final_message: the answer carries on from the final assistant message's last token, and
    that message counts in the prompt without the tokens that would close it (as /tokenize says)."""
    messages = [{"role": "user", "content": PROMPTS[style]}]
    uncut = answer(client, messages, 50)
    text = str(uncut["text"])
    relayed = token_text(style, 0, 20)
    assert text.startswith(relayed)
    continued = [*messages, {"role": "assistant", "content": relayed}]
    flags = {"continue_final_message": True, "add_generation_prompt": False}
    rest = answer(client, continued, 30, **flags)
    assert relayed + str(rest["text"]) == text and rest["finish"] == ["length"]
    usage, whole = rest["usage"], uncut["usage"]
    assert isinstance(usage, dict) and isinstance(whole, dict)
    assert usage["prompt_tokens"] == whole["prompt_tokens"] + 20 and usage["completion_tokens"] == 30
    count = client.post("/tokenize", json={"messages": continued, **flags}).json()["count"]
    assert count == usage["prompt_tokens"]
    both = {"messages": continued, "max_tokens": 5, "continue_final_message": True, "add_generation_prompt": True}
    assert client.post("/v1/chat/completions", json=both).json()["error"]["param"] == "continue_final_message"


def test_embeddings_float_and_base64(client: httpx.Client) -> None:
    floats = client.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b"]}).json()
    assert [d["index"] for d in floats["data"]] == [0, 1]
    assert floats["data"][0]["embedding"] == fake_vector("a")
    packed = client.post("/v1/embeddings", json={"input": "a", "encoding_format": "base64"}).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert struct.unpack(f"<{len(raw) // 4}f", raw) == pytest.approx(fake_vector("a"), rel=1e-6)
    assert client.post("/v1/embeddings", json={"input": []}).status_code == 400


def test_version(client: httpx.Client) -> None:
    assert client.get("/version").json() == {"version": "0.32.0", "emulated": True}
