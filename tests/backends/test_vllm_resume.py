"""A stream cut mid-answer under REAL vLLM 0.32 CPU servers is resumed on the other pool (gateway/resume.py).

The standard replica is reached through a forwarder process (tests/backends/forwarder.py) that SIGKILLs itself
after a few events of the stream: to the gateway that replica died mid-stream. The shared engines keep running
(other tests use them); the continuation runs on the real speculative server with vLLM's
``continue_final_message``.

Greedy decoding, yet the spliced answer is not always the uncut one: measured on these servers, a continuation
from the same text (either pool; the text re-tokenises to the same tokens) matched the uncut answer after 8
tokens and differed after 4 and 16 (the continuation's prompt is computed in one prefill, the uncut answer's
tokens one decode step at a time, and a near tie in this small model's argmax flips). So the test checks the
splice, not the words after it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.cpu_engine import CpuPair
from backends.manifest import load_manifest, pool_path
from gateway.app import create_app
from gateway.config import Settings
from gateway.rules import reference_rules_path
from gateway.servers import ThreadServer, free_port
from gateway.signals.vllm_metrics import parse_vllm_metrics
from tests.conftest import wait_for
from tests.sse import events, parsed, text

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MODEL = load_manifest(pool_path("standard", cpu=True)).served_model_name
REPO = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a lost cat."}]
KILL_AFTER_BYTES = 2500  # the response head and about eight events of vLLM's stream


def body() -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 64, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip


def finished(url: str) -> float:
    return parse_vllm_metrics(httpx.get(f"{url}/metrics", timeout=10).text).finished_requests


@pytest.fixture
def forwarder(cpu_pools: CpuPair) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    target = cpu_pools.standard.url.rsplit(":", 1)[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "tests.backends.forwarder", str(port), target, str(KILL_AFTER_BYTES)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_replica_killed_mid_stream_leaves_one_complete_answer(
    cpu_pools: CpuPair, forwarder: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    started = time.monotonic()
    rules = tmp_path / "rules.yaml"
    rules.write_text(reference_rules_path().read_text(encoding="utf-8") + "\nresume: {streams: true}\n")
    with pytest.MonkeyPatch.context() as env:
        for key in [key for key in os.environ if key.startswith("SPECGATE_")]:
            env.delenv(key)  # scripts/test exports SPECGATE_CACHE / SPECGATE_VENV, which Settings refuses
        settings = Settings(standard_urls=[forwarder[0]], speculative_urls=[cpu_pools.speculative.url],
                            rules_file=rules, reload_rules=False, health_interval_s=0.2)  # fmt: skip
    uncut = parsed(events(httpx.post(f"{cpu_pools.standard.url}/v1/chat/completions", json=body(), timeout=120)))
    app = create_app(settings)
    with ThreadServer(app) as gateway:
        wait_for(lambda: app.state.health_rounds > 0, 30, "first health check")
        spec_before = finished(cpu_pools.speculative.url)
        response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body(), timeout=120,
                              headers={"x-specgate-pool": "standard"})  # fmt: skip
        raw = events(response)
        assert forwarder[1].wait(timeout=10) == -9  # the "replica" died by SIGKILL during the stream
        registry = app.state.metrics.registry
        wait_for(
            lambda: registry.get_sample_value("specgate_stream_resumes_total", {"outcome": "ok"}) == 1,
            10,
            "the resume counted",
        )  # recorded just after the response's last write
        samples = {o: app.state.metrics.registry.get_sample_value("specgate_stream_resumes_total", {"outcome": o})
                   for o in ("ok", "ended", "failed")}  # fmt: skip
        wait_for(lambda: finished(cpu_pools.speculative.url) == spec_before + 1, 10, "the continuation counted")
    spliced = parsed(raw)
    cut_text, whole = text(spliced), text(uncut)
    same = next((i for i, (a, b) in enumerate(zip(contents(spliced), contents(uncut), strict=False)) if a != b), None)
    print(
        f"\nresume under real vLLM: {len(raw)} events, {len(contents(spliced))} with content, usage "
        f"{spliced[-1].get('usage')} (uncut {uncut[-1].get('usage')}); identical to the uncut answer: "
        f"{cut_text == whole} (first differing content event: {same}); {time.monotonic() - started:.1f} s"
    )
    assert samples == {"ok": 1, "ended": 0, "failed": 0}
    assert response.headers["x-specgate-pool"] == "standard"  # the head came from the replica that died
    assert raw.count(b"data: [DONE]") == 1 and raw[-1] == b"data: [DONE]"
    assert not any("error" in e for e in spliced)
    assert len({(e["id"], e["created"], e["model"]) for e in spliced}) == 1
    assert sum(1 for e in spliced for c in e["choices"] if "role" in c["delta"]) == 1
    assert [c["finish_reason"] for e in spliced for c in e["choices"] if c["finish_reason"]] == ["length"]
    # What the dead replica sent is the uncut answer's start (same server, greedy); the continuation carries on
    # from it (no second opening, no chat-template text) and the token counts add up to the uncut ones.
    assert same is None or same >= 4
    opening = "".join(contents(uncut)[:4])
    assert cut_text.startswith(opening) and cut_text.count(opening) == 1 and "<|im" not in cut_text
    assert spliced[-1]["usage"] == uncut[-1]["usage"]  # 64 completion tokens; the prompt counted once


def contents(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["delta"]["content"] for e in chunks for c in e.get("choices", []) if c["delta"].get("content")]
