"""Stored responses belong to the key that created them (issue #27, items 4 and 5), through a real gateway with
keys in front of two fake Responses API replicas that keep what they create, as vLLM does: another key's
retrieve, cancel or ``previous_response_id`` is a 404 that reaches no replica; a client-chosen id
(``request_id``) never takes over one in use; one key's flood of responses does not evict another key's."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway.app import SpecgateApp, create_app
from gateway.config import Settings
from gateway.rules import reference_rules_path
from gateway.servers import ThreadServer
from tests.conftest import wait_for

MODEL = "fake-model"
KEYS = "keys:\n" + "".join(f"  - {{name: {name}, key: sk-{name}}}\n" for name in ("alice", "bob", "mallory"))


class ResponsesReplica:
    """vLLM's Responses API as far as stored responses go: ``request_id`` names the response (else a random
    id), it is kept in this replica's memory, and retrieve, cancel and ``previous_response_id`` read it there
    (unknown: vLLM's 404). ``seen`` notes every call but health checks and model lists."""

    def __init__(self) -> None:
        self.stored: dict[str, dict[str, Any]] = {}
        self.seen: list[tuple[str, str, dict[str, Any]]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/responses", self._create)
        app.router.add_get("/v1/responses/{rid}", self._retrieve)
        app.router.add_post("/v1/responses/{rid}/cancel", self._cancel)
        return app

    def reached(self, rid: str) -> list[tuple[str, str]]:
        """The calls that named ``rid``: in their path, as ``previous_response_id`` or as ``request_id``."""
        fields = ("previous_response_id", "request_id")
        return [(method, path) for method, path, body in self.seen if rid in path or rid in map(body.get, fields)]

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": MODEL, "object": "model"}]})

    async def _create(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((request.method, request.path, body))
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.stored:
            return _not_found(previous)
        rid = body.get("request_id") or f"resp_{uuid.uuid4().hex}"
        text = f"{body.get('input')}" + (f" (after {self.stored[previous]['output_text']})" if previous else "")
        usage = {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
        done = {"id": rid, "object": "response", "status": "completed", "output_text": text, "usage": usage}
        self.stored[rid] = done
        if not body.get("stream"):
            return web.json_response(done)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        created = {"type": "response.created", "response": {**done, "status": "in_progress"}}
        for event in (created, {"type": "response.output_text.delta", "delta": text}):
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await response.write(b"data: " + orjson.dumps({"type": "response.completed", "response": done}) + b"\n\n")
        await response.write_eof()
        return response

    async def _retrieve(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path, {}))
        stored = self.stored.get(request.match_info["rid"])
        return web.json_response(stored) if stored is not None else _not_found(request.match_info["rid"])

    async def _cancel(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path, {}))
        stored = self.stored.get(request.match_info["rid"])
        return web.json_response({**stored, "status": "cancelled"}) if stored else _not_found(request.match_info["rid"])


def _not_found(rid: str) -> web.Response:
    error = {"message": f"Response with id '{rid}' not found.", "type": "invalid_request_error", "code": 404}
    return web.json_response({"error": {**error, "param": "response_id"}}, status=404)


@dataclass
class Setup:
    replicas: list[ResponsesReplica]
    start: Callable[..., tuple[str, SpecgateApp]]

    def reached(self, rid: str) -> list[tuple[str, str]]:
        return [call for replica in self.replicas for call in replica.reached(rid)]


@pytest.fixture
def setup() -> Iterator[Setup]:
    yield from serve_replicas()


def serve_replicas() -> Iterator[Setup]:
    """Two replicas (one per pool) and a starter of gateways with :data:`KEYS` in front of them."""
    with ExitStack() as stack:
        replicas = [ResponsesReplica(), ResponsesReplica()]
        urls = [stack.enter_context(ThreadServer(replica.app())).url for replica in replicas]

        def start(**overrides: Any) -> tuple[str, SpecgateApp]:
            values: dict[str, Any] = {
                "standard_urls": urls[:1], "speculative_urls": urls[1:], "health_interval_s": 0.1,
                "snapshot_interval_s": 0.05, "rules_file": reference_rules_path(), "reload_rules": False, "keys": KEYS,
            }  # fmt: skip
            values.update(overrides)
            app = create_app(Settings(_env_file=None, **values), CollectorRegistry())  # type: ignore[call-arg]
            server = stack.enter_context(ThreadServer(app))
            wait_for(lambda: app.state.health_rounds > 0, what="first health check")
            return server.url, app

        yield Setup(replicas, start)


def client(url: str, name: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"authorization": f"Bearer sk-{name}"}, timeout=10)


def create(url: str, name: str, text: str, stream: bool = False, **extra: Any) -> httpx.Response:
    with client(url, name) as http:
        return http.post("/v1/responses", json={"model": MODEL, "input": text, "stream": stream, **extra})


def created_id(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    if not response.headers["content-type"].startswith("text/event-stream"):
        rid: str = response.json()["id"]
        return rid
    first = next(line for line in response.text.splitlines() if line.startswith("data:"))
    rid = orjson.loads(first[5:])["response"]["id"]
    return rid


def not_found(rid: str, param: str = "response_id") -> dict[str, Any]:
    return {"message": f"Response with id '{rid}' not found.", "type": "invalid_request_error", "param": param,
            "code": None}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
def test_another_key_can_neither_read_cancel_nor_continue_a_response(setup: Setup, stream: bool) -> None:
    url, _ = setup.start()
    rid = created_id(create(url, "alice", "alice's secret", stream=stream))
    with client(url, "alice") as alice:
        assert alice.get(f"/v1/responses/{rid}").json()["output_text"] == "alice's secret"
    before = setup.reached(rid)
    with client(url, "bob") as bob:
        for method, path in (("GET", f"/v1/responses/{rid}"), ("POST", f"/v1/responses/{rid}/cancel")):
            answer = bob.request(method, path)
            assert answer.status_code == 404 and answer.json()["error"] == not_found(rid), (method, answer.text)
            assert "x-specgate-pool" not in answer.headers  # the gateway's own answer: no replica was asked
        body = {"model": MODEL, "input": "and then?", "previous_response_id": rid}
        continued = bob.post("/v1/responses", json=body)
        assert continued.status_code == 404, continued.text
        assert continued.json()["error"] == not_found(rid, "previous_response_id")
        unknown = bob.get("/v1/responses/resp_nobody_has_this")  # the same answer as for an id nobody has
        assert unknown.status_code == 404 and unknown.json()["error"] == not_found("resp_nobody_has_this")
    assert setup.reached(rid) == before
    with client(url, "alice") as alice:  # the owner still can
        body = {"model": MODEL, "input": "and then?", "previous_response_id": rid}
        assert alice.post("/v1/responses", json=body).json()["output_text"] == "and then? (after alice's secret)"
        assert alice.post(f"/v1/responses/{rid}/cancel").json()["status"] == "cancelled"


def test_an_unknown_previous_response_id_reaches_no_replica(setup: Setup) -> None:
    """An id the gateway does not know for this key (expired, evicted, another gateway's without Redis) is a 404
    here: sent to the decider's pick, it could land on the replica that holds another key's conversation."""
    url, _ = setup.start()
    setup.replicas[0].stored["resp_held"] = {"id": "resp_held", "output_text": "someone's text"}
    answer = create(url, "bob", "go on", previous_response_id="resp_held")
    assert answer.status_code == 404 and answer.json()["error"] == not_found("resp_held", "previous_response_id")
    assert setup.reached("resp_held") == []
    bad = create(url, "bob", "go on", previous_response_id="../admin")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "previous_response_id"


def test_a_client_chosen_id_never_takes_over_one_in_use(setup: Setup) -> None:
    url, _ = setup.start()
    rid = created_id(create(url, "alice", "alice's secret"))
    before = setup.reached(rid)
    for name in ("mallory", "alice"):  # vLLM would store the new response over the one it holds under that id
        taken = create(url, name, "mallory's text", request_id=rid)
        assert taken.status_code == 400, taken.text
        assert taken.json()["error"]["param"] == "request_id" and "already in use" in taken.json()["error"]["message"]
    assert setup.reached(rid) == before
    with client(url, "alice") as alice:
        assert alice.get(f"/v1/responses/{rid}").json()["output_text"] == "alice's secret"
    own = created_id(create(url, "mallory", "mallory's text", request_id="resp_mallory_1"))  # a new id is fine
    assert own == "resp_mallory_1"
    with client(url, "mallory") as mallory, client(url, "alice") as alice:
        assert mallory.get(f"/v1/responses/{own}").json()["output_text"] == "mallory's text"
        assert alice.get(f"/v1/responses/{own}").status_code == 404


def test_one_keys_flood_does_not_evict_another_keys_responses(setup: Setup) -> None:
    url, app = setup.start(responses_max_ids=4)
    kept = created_id(create(url, "alice", "alice's secret"))
    flood = [created_id(create(url, "mallory", f"cheap {i}")) for i in range(12)]
    with client(url, "alice") as alice:
        assert alice.get(f"/v1/responses/{kept}").json()["output_text"] == "alice's secret"
    with client(url, "mallory") as mallory:
        assert mallory.get(f"/v1/responses/{flood[-1]}").status_code == 200
        assert mallory.get(f"/v1/responses/{flood[0]}").status_code == 404  # its own oldest went
    registry = app.state.metrics.registry
    assert registry.get_sample_value("specgate_response_ids_evicted_total") == 13 - 4
