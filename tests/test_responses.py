"""The Responses API through the gateway: features for the decider, the official openai SDK against emulated
pools of two replicas each (EMULATED), retrieve/cancel/continue on the replica that created a response, and
vLLM's other endpoints (embeddings, tokenize, version) forwarded unchanged."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.features import Classifier
from gateway.responses import responses_features
from gateway.rules import default_rules
from tests.conftest import wait_for
from tests.emulated import EmulatedGateway, EmulatedPools, iter_pools

RULES = default_rules()
CLASSIFIER = Classifier(RULES)
CODE = {"instructions": "You are a coding assistant.", "input": "Rename x to total in: def f(x): return x"}


def features(body: dict[str, Any]) -> tuple[str, int, int, bool]:
    f = responses_features(body, {}, RULES, CLASSIFIER)
    return f.task, f.max_tokens, f.prompt_tokens, f.stream


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"input": "Translate into French: good morning"}, ("translation", 256, 9, False)),
        ({"input": "hello", "max_output_tokens": 40, "stream": True}, ("chat", 40, 2, True)),
        ({"instructions": "You are a coding assistant.", "input": "hello"}, ("code", 256, 13, False)),
        (
            {
                "input": [
                    {"role": "developer", "content": "Summarize what the user sends."},
                    {"role": "user", "content": [{"type": "input_text", "text": "Translate into German: hi"}]},
                    {"role": "assistant", "content": [{"type": "output_text", "text": "Hallo"}]},
                    {"type": "function_call_output", "call_id": "c1", "output": "42"},
                    {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]},
                ]
            },
            ("summarization", 256, 38, False),  # the developer message is the system prompt
        ),
        (  # the last user text feeds the classifier when no system prompt matches a cue
            {"input": [{"role": "user", "content": "summarize this"}, {"role": "user", "content": "translate it"}]},
            ("translation", 256, 15, False),
        ),
        (  # an image-only message leaves the last text in charge
            {
                "input": [
                    {"role": "user", "content": "Translate into German: hi"},
                    {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]},
                ]
            },
            ("translation", 256, 15, False),
        ),
    ],
)
def test_features_from_a_responses_body(body: dict[str, Any], expected: tuple[str, int, int, bool]) -> None:
    assert features(body) == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": 5}, "input"),
        ({"input": ["text"]}, "input"),
        ({"input": [{"role": "user", "content": 5}]}, "input"),
        ({"input": "x", "instructions": ["a"]}, "instructions"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "max_output_tokens": True}, "max_output_tokens"),
        ({"input": "x", "stream": "yes"}, "stream"),
        ({"input": "x", "temperature": -1}, "temperature"),
        ({"input": "x", "model": 3}, "model"),
    ],
)
def test_bad_responses_bodies_name_the_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        responses_features(body, {}, RULES, CLASSIFIER)
    assert caught.value.param == param


@pytest.fixture(scope="module")
def emulated() -> Iterator[tuple[EmulatedPools, Callable[..., EmulatedGateway]]]:
    yield from iter_pools()


@pytest.fixture(scope="module")
def pools(emulated: tuple[EmulatedPools, Callable[..., EmulatedGateway]]) -> EmulatedPools:
    return emulated[0]


@pytest.fixture(scope="module")
def gw(emulated: tuple[EmulatedPools, Callable[..., EmulatedGateway]]) -> EmulatedGateway:
    return emulated[1]()


def pool_urls(pools: EmulatedPools, pool: str) -> list[str]:
    return [url for url, _ in (pools.standard if pool == "standard" else pools.speculative)]


def test_sdk_create_is_routed_by_the_decider(gw: EmulatedGateway, pools: EmulatedPools) -> None:
    raw = gw.client().responses.with_raw_response.create(model=pools.model, max_output_tokens=60, **CODE)
    response = raw.parse()
    assert (raw.headers["x-specgate-pool"], raw.headers["x-specgate-task"]) == ("speculative", "code")
    assert raw.headers["x-specgate-reason"] == "draft-friendly-task"
    assert response.id.startswith("resp_") and response.output_text
    assert response.usage is not None and 0 < response.usage.output_tokens <= 60
    assert pools.holders(response.id)[0] in pool_urls(pools, "speculative")
    short = gw.client().responses.with_raw_response.create(model=pools.model, max_output_tokens=10, **CODE)
    assert short.headers["x-specgate-reason"] == "short-output"


def test_sdk_stream_passes_every_event_through(gw: EmulatedGateway, pools: EmulatedPools) -> None:
    with gw.client().responses.with_streaming_response.create(
        model=pools.model, input="Hi! How are you today?", max_output_tokens=24, stream=True
    ) as raw:
        assert raw.headers["x-specgate-pool"] == "standard"
        assert raw.headers["content-type"].startswith("text/event-stream")
        events = list(raw.parse())
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.completed" and kinds.count("response.output_text.delta") >= 2
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text
    again = gw.client().responses.retrieve(final.id)  # the id came from the stream's response.created
    assert again.output_text == final.output_text


def test_retrieve_and_cancel_go_to_the_replica_that_created_the_response(
    gw: EmulatedGateway, pools: EmulatedPools
) -> None:
    client, created = gw.client(), []
    for i in range(8):
        body = CODE if i % 2 else {"input": f"Tell me something nice, number {i}."}
        created.append(client.responses.create(model=pools.model, max_output_tokens=60, **body))
    holders = [pools.holders(r.id) for r in created]
    assert all(len(h) == 1 for h in holders)  # each emulator keeps only what it created
    assert len({h[0] for h in holders}) >= 3  # spread over both replicas of a pool at least
    for response in created:
        raw = client.responses.with_raw_response.retrieve(response.id)
        assert raw.parse().output_text == response.output_text
        assert raw.headers["x-specgate-reason"] == "response owner"
        with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
            client.responses.cancel(response.id)  # the holder's own answer; another replica would say 404


def test_previous_response_id_continues_on_the_same_replica(gw: EmulatedGateway, pools: EmulatedPools) -> None:
    client = gw.client()
    first = client.responses.create(model=pools.model, input="Tell me a story.", max_output_tokens=60)
    raw = client.responses.with_raw_response.create(
        model=pools.model, previous_response_id=first.id, max_output_tokens=60, **CODE
    )
    assert raw.headers["x-specgate-reason"] == "previous response"
    assert pools.holders(raw.parse().id) == pools.holders(first.id)


def test_unknown_response_ids_are_a_clear_404(gw: EmulatedGateway) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        gw.client().responses.retrieve("resp_nobody_has_this")
    assert caught.value.response.json()["error"] == {
        "message": "Response with id 'resp_nobody_has_this' not found.",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": None,
    }
    assert "x-specgate-pool" not in caught.value.response.headers
    assert httpx.post(f"{gw.url}/v1/responses/resp_nope/cancel").status_code == 404


def test_bad_responses_request_is_the_gateways_400(gw: EmulatedGateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gw.client().responses.create(model="smollm2", input=[], max_output_tokens=5)
    assert caught.value.response.json()["error"]["param"] == "input"


def test_sdk_embeddings_pass_through(gw: EmulatedGateway, pools: EmulatedPools) -> None:
    raw = gw.client().embeddings.with_raw_response.create(model=pools.model, input=["a cat", "a dog", "a cat"])
    result = raw.parse()  # the SDK asks for base64 and decodes it
    vectors = [d.embedding for d in result.data]
    assert raw.headers["x-specgate-reason"] == "passthrough" and raw.headers["x-specgate-emulated"] == "true"
    assert len(vectors) == 3 and len(vectors[0]) == 64 and vectors[0] == vectors[2] != vectors[1]
    assert math.isclose(sum(v * v for v in vectors[1]), 1.0, rel_tol=1e-5)


def test_tokenize_detokenize_and_version_pass_through(gw: EmulatedGateway, pools: EmulatedPools) -> None:
    with httpx.Client(base_url=gw.url) as client:
        tokens = client.post("/tokenize", json={"model": pools.model, "prompt": "Hello, world"})
        assert tokens.status_code == 200 and tokens.headers["x-specgate-reason"] == "passthrough"
        assert tokens.json()["count"] == len(tokens.json()["tokens"]) == 12
        text = client.post("/detokenize", json={"model": pools.model, "tokens": tokens.json()["tokens"]})
        assert text.json() == {"prompt": "Hello, world"}
        assert client.get("/version").json() == {"version": "0.32.0", "emulated": True}
        wrong = client.post("/tokenize", json={"model": "other", "prompt": "x"})
        assert wrong.status_code == 404 and wrong.headers["x-specgate-pool"]  # the replica's own answer


def test_metrics_count_responses_with_their_decision(gw: EmulatedGateway, pools: EmulatedPools) -> None:
    registry = gw.app.state.metrics.registry
    labels = {"pool": "speculative", "reason": "draft-friendly-task", "task": "code", "status": "200"}
    before = registry.get_sample_value("specgate_requests_total", labels) or 0.0
    gw.client().responses.create(model=pools.model, max_output_tokens=60, **CODE)
    count = lambda: registry.get_sample_value("specgate_requests_total", labels) or 0.0  # noqa: E731
    wait_for(lambda: count() == before + 1, what="the response counted")


def test_explain_reads_a_responses_body(gw: EmulatedGateway) -> None:
    explained = httpx.post(f"{gw.url}/v1/route/explain", json={"max_output_tokens": 80, **CODE}).json()
    assert explained["decision"]["pool"] == "speculative" and explained["features"]["task"] == "code"
    assert explained["features"]["max_tokens"] == 80


def test_keys_cap_and_steer_responses(emulated: tuple[EmulatedPools, Callable[..., EmulatedGateway]]) -> None:
    pools, start = emulated
    keys = "keys:\n  - {name: app, key: sk-app, max_tokens: 40, pools: [standard]}\n"
    gw = start(keys=keys)
    headers = {"authorization": "Bearer sk-app"}
    with httpx.Client(base_url=gw.url, headers=headers, timeout=30) as client:
        assert httpx.post(f"{gw.url}/v1/responses", json={"input": "hi"}).status_code == 401
        over = client.post("/v1/responses", json={"model": pools.model, "input": "hi", "max_output_tokens": 41})
        assert over.status_code == 400 and over.json()["error"]["param"] == "max_output_tokens"
        body = {"model": pools.model, "max_output_tokens": 40, **CODE}
        steered = client.post("/v1/responses", json=body)
        assert steered.status_code == 200 and steered.headers["x-specgate-pool"] == "standard"
        capped = client.post("/v1/responses", json={"model": pools.model, "input": "hi"}).json()
        assert capped["max_output_tokens"] == 40  # the key's cap was sent
        assert client.get(f"/v1/responses/{capped['id']}").status_code == 200


class _SlowFirstToken:
    """A Responses upstream that opens its stream with response.created at once and sends its first token
    0.3 s later (as vLLM does: the created event leaves before the engine has run)."""

    def __init__(self) -> None:
        from aiohttp import web

        async def health(_: Any) -> Any:
            return web.Response(text="ok")

        async def models(_: Any) -> Any:
            return web.json_response({"data": [{"id": "fake-model"}]})

        self.app = web.Application()
        self.app.router.add_get("/health", health)
        self.app.router.add_get("/v1/models", models)
        self.app.router.add_post("/v1/responses", self._responses)

    async def _responses(self, request: Any) -> Any:
        import asyncio

        from aiohttp import web

        body = await request.json()
        usage = {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}
        done = {"id": "resp_1", "object": "response", "status": "completed", "usage": usage}
        if not body.get("stream"):
            await asyncio.sleep(0.3)
            return web.json_response(done)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)

        async def event(payload: dict[str, Any]) -> None:
            await response.write(b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n")

        await event({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}})
        await asyncio.sleep(0.3)
        for word in ("a", "b", "c"):
            await event({"type": "response.output_text.delta", "delta": word})
        await event({"type": "response.completed", "response": done})
        await response.write_eof()
        return response


def test_a_streamed_response_teaches_the_time_of_its_first_token_not_of_response_created() -> None:
    from prometheus_client import CollectorRegistry

    from gateway.app import create_app
    from gateway.config import Settings
    from gateway.servers import ThreadServer

    upstream = ThreadServer(_SlowFirstToken().app).start()
    settings = Settings(_env_file=None, standard_urls=[upstream.url], speculative_urls=[upstream.url],  # type: ignore[call-arg]
                        health_interval_s=0.1, snapshot_interval_s=0.05)  # fmt: skip
    app = create_app(settings, CollectorRegistry())
    gateway = ThreadServer(app).start()
    learned: list[tuple[float, float, int, bool]] = []
    learn = app.state.learn

    def spy(features: Any, decision: Any, ttft: float, total: float, tokens: int, *args: Any, **kw: Any) -> None:
        learned.append((ttft, total, tokens, features.stream))
        learn(features, decision, ttft, total, tokens, *args, **kw)

    app.state.learn = spy  # type: ignore[method-assign]
    try:
        wait_for(lambda: app.state.health_rounds > 0, what="first health check")
        with httpx.Client(base_url=gateway.url, timeout=10) as client:
            for stream in (True, False):
                r = client.post("/v1/responses", json={"model": "fake-model", "input": "hi", "stream": stream})
                assert r.status_code == 200
        wait_for(lambda: len(learned) == 2, what="both outcomes learned")
    finally:
        gateway.stop()
        upstream.stop()
    (stream_ttft, stream_total, stream_tokens, streamed), (_, whole_total, whole_tokens, _) = learned
    assert streamed and stream_tokens == 3 and whole_tokens == 3  # usage.output_tokens, not events counted
    assert stream_ttft >= 0.25 and stream_ttft <= stream_total  # the first delta, 0.3 s after response.created
    assert whole_total >= 0.25
