"""vLLM's other endpoints through the gateway: the allow-list, the 404s (control endpoints above all), and
forwarding with the relay's retry, deadlines, metrics and headers, but no routing decision."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.bench.fake_upstream import FakeUpstream
from gateway.config import Settings
from gateway.errors import InvalidRequest, MethodNotAllowed, NotFound
from gateway.passthrough import ENDPOINTS, Endpoint, EndpointTable, upstream_target
from gateway.servers import ThreadServer
from tests.conftest import Gateway, Upstreams, dead_url

StartGateway = Callable[..., Gateway]

# vLLM 0.32's control and development endpoints (vllm/entrypoints/serve/dev, rl/online, serve/lora,
# serve/profile, serve/elastic_ep, serve/fault_tolerance, scale_out/token_in_token_out, sagemaker): never
# reachable through the gateway.
CONTROL = [
    ("POST", "/sleep"),
    ("POST", "/wake_up"),
    ("GET", "/is_sleeping"),
    ("POST", "/release_kv_cache_memory"),
    ("POST", "/pause"),
    ("POST", "/resume"),
    ("GET", "/is_paused"),
    ("POST", "/abort_requests"),
    ("POST", "/inference/v1/abort_requests"),
    ("POST", "/inference/v1/generate"),
    ("POST", "/collective_rpc"),
    ("POST", "/init_weight_transfer_engine"),
    ("POST", "/shutdown_weight_transfer_engine"),
    ("POST", "/start_weight_update"),
    ("POST", "/start_draft_weight_update"),
    ("POST", "/update_weights"),
    ("POST", "/finish_weight_update"),
    ("POST", "/update_weight_version"),
    ("GET", "/weight_info"),
    ("POST", "/weight_checker"),
    ("GET", "/get_world_size"),
    ("POST", "/start_profile"),
    ("POST", "/stop_profile"),
    ("POST", "/reset_prefix_cache"),
    ("POST", "/reset_mm_cache"),
    ("POST", "/reset_encoder_cache"),
    ("GET", "/server_info"),
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"),
    ("POST", "/scale_elastic_ep"),
    ("POST", "/is_scaling_elastic_ep"),
    ("POST", "/fault_tolerance/apply"),
    ("GET", "/fault_tolerance/status"),
    ("POST", "/invocations"),
    ("GET", "/ping"),
    ("GET", "/load"),
    ("GET", "/kv_event_sources"),
]


OWN_CALLS = frozenset({"/health", "/v1/models", "/metrics"})  # the gateway's health checks and scrapes


def everything_seen(upstreams: Upstreams) -> list[tuple[str, str]]:
    """(method, raw path) of what reached the fakes besides the gateway's own health checks and scrapes."""
    seen = [*upstreams.standard.seen, *upstreams.speculative.seen]
    return [(method, path) for method, path, _ in seen if path not in OWN_CALLS]


@dataclass
class Shared:
    """One gateway in front of two fakes for the many refusal tests (each checks that nothing got through)."""

    url: str
    upstreams: Upstreams


@pytest.fixture(scope="module")
def shared() -> Iterator[Shared]:
    std, spec = FakeUpstream(name="standard"), FakeUpstream(name="speculative")
    with ThreadServer(std.app()) as s1, ThreadServer(spec.app()) as s2:
        settings = Settings(_env_file=None, standard_urls=[s1.url], speculative_urls=[s2.url], reload_rules=False)  # type: ignore[call-arg]
        with ThreadServer(create_app(settings, CollectorRegistry())) as gw:
            yield Shared(gw.url, Upstreams(std, spec, s1.url, s2.url))


@pytest.mark.parametrize(("method", "path"), CONTROL, ids=[p for _, p in CONTROL])
def test_control_endpoints_are_404_and_never_reach_a_replica(shared: Shared, method: str, path: str) -> None:
    response = httpx.request(method, f"{shared.url}{path}", json={} if method == "POST" else None)
    assert response.status_code == 404
    error = {"message": f"Invalid URL ({method} {path})", "type": "invalid_request_error", "param": None, "code": None}
    assert response.json() == {"error": error}
    assert "x-specgate-pool" not in response.headers
    assert everything_seen(shared.upstreams) == []


def test_no_control_endpoint_is_on_the_allow_list() -> None:
    allowed = {(e.method, e.path) for e in ENDPOINTS}
    assert not allowed & set(CONTROL)


@pytest.mark.parametrize(
    "path",
    [
        "/nope",
        "/v1/chat/completions/../../sleep",
        "/v1/responses/../sleep",
        "/v1/responses/..",
        "/v1/responses/.hidden",
        "/v1/responses/a/b",
        "/v1/responses/%2e%2e/sleep",
        "/v1/responses/resp_1%2F..%2Fsleep",
        "/tokenize/",
        "/TOKENIZE",
        "//tokenize",
        "/tokenize%00",
    ],
)
def test_tricks_and_unknown_paths_get_openais_404(shared: Shared, path: str) -> None:
    response = httpx.post(f"{shared.url}{path}", json={})
    assert response.status_code in (404, 405), response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] is None
    assert everything_seen(shared.upstreams) == []


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/tokenize", ("POST", "/tokenize", None)),
        ("GET", "/version", ("GET", "/version", None)),
        ("GET", "/v1/responses/resp_abc123", ("GET", "/v1/responses/{id}", "resp_abc123")),
        ("POST", "/v1/responses/resp_abc.1:2-3/cancel", ("POST", "/v1/responses/{id}/cancel", "resp_abc.1:2-3")),
        ("POST", "/v1/responses/render", ("POST", "/v1/responses/render", None)),
    ],
)
def test_table_matches_exact_paths_and_id_segments(
    method: str, path: str, expected: tuple[str, str, str | None]
) -> None:
    endpoint, rid = EndpointTable().match(method, path)
    assert (endpoint.method, endpoint.path, rid) == expected


@pytest.mark.parametrize(
    ("method", "path", "error"),
    [
        ("GET", "/tokenize", MethodNotAllowed),
        ("DELETE", "/v1/responses/resp_1", MethodNotAllowed),
        ("POST", "/v1/responses/", NotFound),
        ("GET", "/v1/responses/../version", NotFound),
        ("POST", "/v1/responses/x/cancel/more", NotFound),
    ],
)
def test_table_refuses(method: str, path: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        EndpointTable().match(method, path)


def test_a_new_endpoint_is_one_line() -> None:
    table = EndpointTable((*ENDPOINTS, Endpoint("POST", "/v1/brand_new")))
    assert table.match("POST", "/v1/brand_new")[0].path == "/v1/brand_new"


@pytest.mark.parametrize(
    ("path", "body"),
    [("/tokenize", {"model": "fake-model", "prompt": "hi"}), ("/v1/embeddings", {"model": "fake-model", "input": "x"})],
)
def test_forwarded_unchanged_to_the_default_pool(
    gateway: StartGateway, upstreams: Upstreams, path: str, body: dict[str, str]
) -> None:
    gw = gateway()
    response = httpx.post(f"{gw.url}{path}?drop=me", json=body, headers={"x-request-id": "req-42"})
    assert response.status_code == 200, response.text
    echo = response.json()
    assert response.headers["x-request-id"] == "req-42"  # the client's id stays the client's
    assert echo["request_id"] not in ("", "req-42")  # the pool gets one of the gateway's: clients may repeat theirs
    assert (echo["upstream"], echo["method"], echo["path"], echo["query"]) == ("standard", "POST", path, "")
    assert echo["body"] == httpx.Request("POST", "http://x", json=body).content.decode()
    assert response.headers["x-specgate-pool"] == "standard"
    assert response.headers["x-specgate-reason"] == "passthrough"
    assert everything_seen(upstreams) == [("POST", path)]
    labels = {"pool": "standard", "reason": "passthrough", "task": "none", "status": "200"}
    gw.settled(1)  # recorded just after its last byte went out: the client may read it first
    assert gw.sample("specgate_requests_total", **labels) == 1
    assert gw.sample("specgate_ttft_seconds_count", pool="standard") == 0  # generation latency only


def test_multipart_bodies_keep_their_content_type(gateway: StartGateway) -> None:
    gw = gateway()
    files = {"file": ("a.wav", b"RIFF....WAVEfmt ", "audio/wav")}
    response = httpx.post(f"{gw.url}/v1/audio/transcriptions", files=files, data={"model": "fake-model"})
    echo = response.json()
    assert echo["content_type"].startswith("multipart/form-data; boundary=")
    assert "RIFF....WAVEfmt" in echo["body"] and 'name="model"' in echo["body"]


def test_query_strings_only_where_the_entry_takes_one(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway()
    assert httpx.get(f"{gw.url}/version?x=1").json()["query"] == ""
    assert everything_seen(upstreams) == [("GET", "/version")]


@pytest.mark.parametrize(
    ("query", "target"),
    [(b"", "/v1/responses/r"), (b"stream=true&starting_after=3", "/v1/responses/r?stream=true&starting_after=3")],
)
def test_upstream_target_keeps_a_clean_query(query: bytes, target: str) -> None:
    endpoint = EndpointTable().match("GET", "/v1/responses/r")[0]
    assert upstream_target(endpoint, "/v1/responses/r", query) == target


@pytest.mark.parametrize("query", [b"a=1 HTTP/1.1\r\nHost: evil", b"a=<x>", b'a="', b"a=1#frag", b"a=\x00"])
def test_upstream_target_refuses_characters_a_url_does_not_allow(query: bytes) -> None:
    endpoint = EndpointTable().match("GET", "/v1/responses/r")[0]
    with pytest.raises(InvalidRequest):
        upstream_target(endpoint, "/v1/responses/r", query)


def test_passthrough_pool_setting_and_fallback(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway(passthrough_pool="speculative")
    assert httpx.post(f"{gw.url}/tokenize", json={}).json()["upstream"] == "speculative"
    upstreams.speculative.healthy = False
    gw2 = gateway(passthrough_pool="speculative")
    response = httpx.post(f"{gw2.url}/tokenize", json={})
    assert response.json()["upstream"] == "standard"
    assert response.headers["x-specgate-reason"] == "passthrough; fallback: speculative unavailable"


def test_retry_before_the_first_byte_on_the_other_pool(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway(standard_urls=[dead_url()], health_interval_s=60)
    gw.app.state.pools.pools["standard"].replicas[0].set_healthy(True)  # as if its last check had passed
    gw.app.state.refresh_snapshot()
    response = httpx.post(f"{gw.url}/detokenize", json={"tokens": [1, 2]})
    assert response.status_code == 200
    assert response.json()["upstream"] == "speculative"
    assert response.headers["x-specgate-reason"] == "passthrough; retry: speculative"
    assert gw.sample("specgate_retries_total", from_pool="standard", to_pool="speculative") == 1
    dead = gw.app.state.pools.pools["standard"].replicas[0].url
    assert gw.sample("specgate_upstream_errors_total", pool="standard", replica=dead, kind="connect") == 1


def test_upstream_errors_come_back_intact(gateway: StartGateway) -> None:
    gw = gateway()
    response = httpx.post(f"{gw.url}/score", json={}, headers={"x-fake-status": "400"})
    assert response.status_code == 400 and response.json()["path"] == "/score"


def test_no_replica_left_is_a_clear_503(gateway: StartGateway) -> None:
    gw = gateway(standard_urls=[dead_url()], speculative_urls=[dead_url()], health_interval_s=60)
    response = httpx.post(f"{gw.url}/tokenize", json={})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_healthy_backend"


def test_first_byte_deadline_applies(gateway: StartGateway) -> None:
    gw = gateway(first_byte_timeout_s=0.3)
    response = httpx.post(f"{gw.url}/pooling", json={}, headers={"x-fake-delay": "3"}, timeout=10)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"


def test_models_by_id_and_fastapi_paths_in_openais_shape(gateway: StartGateway) -> None:
    gw = gateway()
    assert httpx.get(f"{gw.url}/v1/models/fake-model").json()["id"] == "fake-model"
    missing = httpx.get(f"{gw.url}/v1/models/org/other")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    wrong_method = httpx.post(f"{gw.url}/health")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("client", ["raw", "aiohttp", "httpx", "httpx-aiohttp"])
def test_every_upstream_client_forwards_get_and_post(gateway: StartGateway, client: str) -> None:
    gw = gateway(upstream_client=client)
    version = httpx.get(f"{gw.url}/version")
    assert (version.json()["method"], version.json()["path"]) == ("GET", "/version")
    tokens = httpx.post(f"{gw.url}/tokenize", json={"prompt": "x"})
    assert (tokens.json()["method"], tokens.json()["body"]) == ("POST", '{"prompt":"x"}')


KEYS = """
keys:
  - name: app
    key: sk-app
  - name: spec-only
    key: sk-spec
    pools: [speculative]
"""


def test_keys_guard_the_pass_through_too(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway(keys=KEYS)
    anonymous = httpx.post(f"{gw.url}/tokenize", json={"prompt": "x"})
    assert anonymous.status_code == 401 and anonymous.json()["error"]["type"] == "invalid_request_error"
    assert everything_seen(upstreams) == []
    allowed = httpx.post(f"{gw.url}/tokenize", json={"prompt": "x"}, headers={"authorization": "Bearer sk-app"})
    assert allowed.status_code == 200 and allowed.json()["upstream"] == "standard"
    steered = httpx.post(f"{gw.url}/tokenize", json={"prompt": "x"}, headers={"authorization": "Bearer sk-spec"})
    assert steered.json()["upstream"] == "speculative"  # the key's pools bound the pass-through as well
    assert "key: standard not allowed" in steered.headers["x-specgate-reason"]


GENERATING_KEYS = """
keys:
  - name: capped
    key: sk-capped
    max_tokens: 100
    tpm: 1000
"""


@pytest.mark.parametrize("path", ["/v1/messages", "/cohere/v2/chat", "/v1/chat/completions/batch"])
def test_a_keys_cap_and_token_limit_hold_on_the_generating_pass_through(
    gateway: StartGateway, upstreams: Upstreams, path: str
) -> None:
    """Another API's chat under a key: the max_tokens cap and the token limit hold as for chat completions."""
    gw = gateway(keys=GENERATING_KEYS)
    bucket = gw.app.state.access.limiter.keys["capped"].tokens
    assert bucket is not None
    messages: list[object] = [{"role": "user", "content": "hello"}]
    conversations = 1
    if path.endswith("/batch"):
        messages, conversations = [messages, messages], 2
    with httpx.Client(base_url=gw.url, headers={"authorization": "Bearer sk-capped"}) as client:
        over = client.post(path, json={"messages": messages, "max_tokens": 500})
        assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"
        assert everything_seen(upstreams) == []  # refused before it reached a pool
        filled = client.post(path, json={"messages": messages}, headers={"x-fake-usage": "7"})
        assert filled.status_code == 200, filled.text
        assert '"max_tokens":100' in filled.json()["body"]  # the cap is sent when the request names none
        booked = 1000 - int(filled.headers["x-ratelimit-remaining-tokens"])
        assert booked >= 100 * conversations  # charged up front as chat is: max_tokens per conversation
    # corrected by the usage the reply reported, once the relay has finished (just after the client's read)
    gw.settled(1)
    spent = bucket.limit - bucket.level  # not refilled since the admission: only a request refills it
    assert 7 < spent <= booked - 90, (spent, booked)  # the prompt estimate and 7 tokens of 100 x conversations
