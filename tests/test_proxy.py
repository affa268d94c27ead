"""The gateway as a real HTTP server in front of fake upstreams: routing, streaming, errors, retries."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import Gateway, Upstreams, dead_url, wait_for

StartGateway = Callable[..., Gateway]


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], **extra}


def test_routes_by_task_with_transparency_headers(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway()
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", json=chat("Translate into English: 你好"))
        assert r.status_code == 200
        assert (r.headers["x-specgate-pool"], r.headers["x-specgate-task"]) == ("speculative", "translation")
        assert r.headers["x-specgate-reason"] == "draft-friendly-task"
        assert r.json()["served_by"] == "speculative"
        r = client.post("/v1/chat/completions", json=chat("How are you?"))
        assert (r.headers["x-specgate-pool"], r.headers["x-specgate-reason"]) == ("standard", "default")
        assert r.json()["served_by"] == "standard"
    assert (
        gw.sample(
            "specgate_requests_total",
            pool="speculative",
            reason="draft-friendly-task",
            task="translation",
            status="200",
        )
        == 1
    )


def test_body_and_headers_are_forwarded_but_not_the_client_key(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway()
    body = chat("hello", max_tokens=7, temperature=0.2, top_p=0.9, user="u1", logit_bias={"5": 1}, extra_field=[1])
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer k", "x-trace": "t1"})
    assert r.status_code == 200
    assert upstreams.standard.last_body == body
    assert "Authorization" not in upstreams.standard.last_headers  # the client's key never reaches a pool
    assert upstreams.standard.last_headers["x-trace"] == "t1"


def test_completions_endpoint(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway()
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/completions", json={"model": "fake-model", "prompt": "def fib(n):", "max_tokens": 64})
    assert r.status_code == 200
    assert r.headers["x-specgate-task"] == "code" and r.headers["x-specgate-pool"] == "speculative"
    assert r.json()["object"] == "text_completion"


def test_stream_is_relayed_chunk_by_chunk(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway()
    events, sent_when_received = [], []
    headers = {"x-fake-chunks": "8", "x-fake-interval": "0.25"}
    with httpx.Client(base_url=gw.url, timeout=10) as client, client.stream(
        "POST", "/v1/chat/completions", json=chat("write a poem", stream=True), headers=headers
    ) as r:
        assert r.status_code == 200
        assert r.headers["x-accel-buffering"] == "no"
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-specgate-pool"] == "standard"
        for line in r.iter_lines():
            if line:
                events.append(line)
                sent_when_received.append(upstreams.standard.events_sent)
    assert events[-1] == "data: [DONE]" and len(events) == 9
    # each event reached the client while the upstream was still pacing the rest (2 s in all)
    assert sent_when_received[0] < 4, sent_when_received
    assert sent_when_received[:4] == sorted(sent_when_received[:4]) and sent_when_received[3] < 8
    gw.settled(1)  # the gateway records the request just after the response's last write
    assert gw.sample("specgate_ttft_seconds_count", pool="standard") == 1
    assert gw.sample("specgate_tpot_seconds_count", pool="standard") == 1


def test_upstream_errors_reach_the_client_intact(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway()
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", json=chat("hi"), headers={"x-fake-status": "400"})
    assert r.status_code == 400
    error = {"message": "fake upstream error 400", "type": "BadRequestError", "param": None, "code": 400}
    assert r.json() == {"error": error}
    assert r.headers["x-specgate-pool"] == "standard"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"model": "fake-model", "messages": "hi"}', 400, "messages"),
        (
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}',
            400,
            "max_tokens",
        ),
        (b'{"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    ],
    ids=["malformed", "not-object", "messages-type", "max-tokens-type", "unknown-model"],
)
def test_bad_requests_get_openai_errors(gateway: StartGateway, body: bytes, status: int, param: str | None) -> None:
    gw = gateway()
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["message"]


def test_body_over_limit_is_413(gateway: StartGateway) -> None:
    gw = gateway(max_body_bytes=2048)
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", json=chat("x" * 4000))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_dead_replica_is_retried_on_the_other_pool(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway(standard_urls=[dead_url()], health_interval_s=60)
    gw.app.state.pools.pools["standard"].replicas[0].set_healthy(True)  # as if its last check had passed
    gw.app.state.refresh_snapshot()
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", json=chat("hi"))
    assert r.status_code == 200
    assert r.headers["x-specgate-pool"] == "speculative"
    assert "retry: speculative" in r.headers["x-specgate-reason"]
    assert gw.sample("specgate_retries_total", from_pool="standard", to_pool="speculative") == 1
    assert not gw.app.state.pools.pools["standard"].replicas[0].healthy  # skipped until it recovers


def test_retry_prefers_another_replica_of_the_same_pool(gateway: StartGateway, upstreams: Upstreams) -> None:
    dead = dead_url()
    gw = gateway(standard_urls=[dead, upstreams.standard_url], health_interval_s=60)
    replicas = gw.app.state.pools.pools["standard"].replicas
    for replica in replicas:
        replica.set_healthy(True)
    heavy = replicas[1].book(10**9)  # makes the dead replica the cheaper pick
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", json=chat("hi"))
    heavy.release()
    assert r.status_code == 200 and r.headers["x-specgate-pool"] == "standard"
    assert gw.sample("specgate_retries_total", from_pool="standard", to_pool="standard") == 1


def test_connection_reset_everywhere_is_502(gateway: StartGateway) -> None:
    gw = gateway()
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", json=chat("hi"), headers={"x-fake-reset": "1"})
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "upstream_error"


def test_no_healthy_replica_is_503(gateway: StartGateway, upstreams: Upstreams) -> None:
    upstreams.standard.healthy = upstreams.speculative.healthy = False
    gw = gateway()
    wait_for(lambda: not gw.app.state.snapshot.pool("standard").available, what="replicas marked down")
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/chat/completions", json=chat("hi"))
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_backend"
        assert client.get("/ready").status_code == 503
        assert client.get("/health").status_code == 200
        upstreams.standard.healthy = True
        wait_for(lambda: client.get("/ready").status_code == 200, what="recovery")
        assert client.post("/v1/chat/completions", json=chat("hi")).status_code == 200


def test_first_byte_timeout_is_504(gateway: StartGateway) -> None:
    gw = gateway(first_byte_timeout_s=0.3)
    start = time.monotonic()
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        r = client.post("/v1/chat/completions", json=chat("hi"), headers={"x-fake-delay": "3"})
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    assert time.monotonic() - start < 2.0  # two attempts of 0.3 s plus the sweeper's granularity


def test_idle_stream_ends_with_an_error_event(gateway: StartGateway) -> None:
    gw = gateway(idle_timeout_s=0.3)
    headers = {"x-fake-chunks": "10", "x-fake-stall-after": "2"}
    with (
        httpx.Client(base_url=gw.url, timeout=10) as client,
        client.stream("POST", "/v1/chat/completions", json=chat("hi", stream=True), headers=headers) as r,
    ):
        lines = [line for line in r.iter_lines() if line]
    assert r.status_code == 200
    assert len(lines) == 3 and '"upstream_timeout"' in lines[-1]


@pytest.mark.parametrize("client", ["auto", "aiohttp"])  # told by the server's DirectBody / by ASGI receive
def test_client_disconnect_mid_stream_cancels_upstream(
    gateway: StartGateway, upstreams: Upstreams, client: str
) -> None:
    gw = gateway(upstream_client=client)
    headers = {"x-fake-chunks": "200", "x-fake-interval": "0.05"}
    with (
        httpx.Client(base_url=gw.url, timeout=10) as client,
        client.stream("POST", "/v1/chat/completions", json=chat("hi", stream=True), headers=headers) as r,
    ):
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert gw.app.state.pools.total_booked() > 0
    wait_for(lambda: upstreams.standard.cancelled == 1, what="upstream request cancelled")
    wait_for(lambda: gw.app.state.pools.total_booked() == 0, what="booking released")
    wait_for(
        lambda: gw.sample("specgate_requests_total", pool="standard", reason="default", task="chat", status="499") == 1,
        what="disconnect counted",
    )


def test_models_health_ready_metrics(gateway: StartGateway) -> None:
    gw = gateway()
    with httpx.Client(base_url=gw.url) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["fake-model"]
        ready = client.get("/ready").json()
        assert ready["ready"] and ready["pools"]["speculative"]["healthy"] == 1
        assert "specgate_replica_healthy" in client.get("/metrics").text


def test_explain_decides_without_forwarding(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway()
    with httpx.Client(base_url=gw.url) as client:
        r = client.post("/v1/route/explain", json=chat("用Python写一个函数", max_tokens=40))
        bad = client.post("/v1/route/explain", json=chat("x", max_tokens=-1))
    assert r.status_code == 200
    data = r.json()
    assert data["decision"]["pool"] == "standard" and data["decision"]["rule"] == "short-output"
    assert data["features"]["task"] == "code" and data["features"]["max_tokens"] == 40
    assert data["snapshot"]["pools"]["speculative"]["healthy_replicas"] == 1
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    assert upstreams.standard.requests == upstreams.speculative.requests == 0


@pytest.mark.parametrize("client", ["aiohttp", "httpx", "httpx-aiohttp", "raw"])
def test_other_upstream_clients_relay_the_same(gateway: StartGateway, upstreams: Upstreams, client: str) -> None:
    gw = gateway(upstream_client=client)
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        r = http.post("/v1/chat/completions", json=chat("Translate: hi", max_tokens=60))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 60
        with http.stream(
            "POST", "/v1/chat/completions", json=chat("hi", stream=True), headers={"x-fake-chunks": "4"}
        ) as s:
            lines = [line for line in s.iter_lines() if line]
        assert len(lines) == 5 and lines[-1] == "data: [DONE]"
        assert http.post("/v1/chat/completions", json=chat("x"), headers={"x-fake-status": "422"}).status_code == 422


def test_unknown_paths_and_methods_get_openai_errors(gateway: StartGateway) -> None:
    """Found by tests/fuzz: FastAPI answered {"detail": "Not Found"}, not OpenAI's error shape."""
    gw = gateway()
    with httpx.Client(base_url=gw.url) as client:
        for response, status in ((client.get("/v1/nothing"), 404), (client.delete("/health"), 405)):
            assert response.status_code == status
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"


def test_explain_shows_the_expected_prefix_hit_per_replica(gateway: StartGateway, upstreams: Upstreams) -> None:
    """Two replicas a pool (one fake server under two host names): the prefix index is on (`auto`); a request
    sent through the gateway is then expected on the replica it went to, and explain says so."""
    twin = {
        "standard_urls": [upstreams.standard_url, upstreams.standard_url.replace("127.0.0.1", "localhost")],
        "speculative_urls": [upstreams.speculative_url, upstreams.speculative_url.replace("127.0.0.1", "localhost")],
    }
    gw = gateway(**twin)
    body = {"model": "fake-model", "messages": [
        {"role": "system", "content": "You answer questions about the shop's opening hours. " * 30},
        {"role": "user", "content": "Are you open on Sunday?"}]}  # fmt: skip
    with httpx.Client(base_url=gw.url) as client:
        before = client.post("/v1/route/explain", json=body).json()["prefix"]
        sent = client.post("/v1/chat/completions", json=body)
        pool = sent.headers["x-specgate-pool"]
        gw.settled(1)
        after = client.post("/v1/route/explain", json=body).json()
    assert before["on"] and before["blocks"] >= 4 and before["session"].startswith("p:")
    assert before["request_worth_blocks"] is None  # no model yet: the fixed slack alone prices affinity
    assert all(r["expected_hit_blocks"] == 0 for rows in before["pools"].values() for r in rows)
    hits = [r["expected_hit_blocks"] for r in after["prefix"]["pools"][pool]]
    assert sorted(hits) == [0, before["blocks"]] and after["prefix"]["pools"][pool][0]["affinity_eligible"]
    assert "blocks" not in after["features"] and after["features"]["session"] == before["session"]
    # the decision read the prompt as held on the pool it went to, and on no replica of the other
    assert before["cached_tokens"] == {"standard": 0, "speculative": 0}
    other = "speculative" if pool == "standard" else "standard"
    cached = after["prefix"]["cached_tokens"]
    assert 0 < cached[pool] <= after["features"]["prompt_tokens"] and cached[other] == 0
    replica = next(r["replica"] for r in after["prefix"]["pools"][pool] if r["expected_hit_blocks"])
    assert gw.sample("specgate_prefix_cache_queries_total", pool=pool, replica=replica) == before["blocks"]
    assert gw.sample("specgate_prefix_cache_hits_total", pool=pool, replica=replica) == 0


def test_explain_says_when_the_prefix_index_is_off(gateway: StartGateway) -> None:
    gw = gateway()  # one replica a pool: `auto` reads no blocks
    with httpx.Client(base_url=gw.url) as client:
        prefix = client.post("/v1/route/explain", json=chat("Are you open on Sunday? " * 50)).json()["prefix"]
    assert prefix["on"] is False and prefix["blocks"] == 0 and prefix["session"] is None
    assert prefix["cached_tokens"] is None  # no blocks: the decision reads the whole prompt, as it always did
    assert [r["expected_hit_blocks"] for r in prefix["pools"]["standard"]] == [0]
