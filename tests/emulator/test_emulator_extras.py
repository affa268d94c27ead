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
from backends.emulator.extras import fake_vector
from backends.emulator.profiles import load_profile
from backends.emulator.server import EmulatorApp, EmulatorConfig
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
    assert tokens["count"] == 6 and tokens["max_model_len"] == CONFIG.profile.max_model_len
    assert client.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": "héllo"}
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] == len("user: hi")
    assert client.post("/detokenize", json={"tokens": [300]}).status_code == 400
    assert client.post("/tokenize", json={"model": "other", "prompt": "x"}).status_code == 404


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
