"""``specgate bench route`` for real, short: the CPU pools behind two gateways (reference rules, adaptive)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.cpu_engine import CpuPair
from backends.spec_schedule import validate_schedule
from backends.workloads.loader import DATA_DIR
from gateway.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_bench_route_on_real_pools(cpu_pools: CpuPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "route.json"
    code = main([
        "bench", "route", "--standard", cpu_pools.standard.url, "--speculative", cpu_pools.speculative.url,
        "--workload", str(DATA_DIR / "code.yaml"), "--workload", str(DATA_DIR / "chat.yaml"), "--per-category", "2",
        "--concurrency", "1,4", "--max-tokens", "16", "--min-samples", "4", "--repeat", "2", "--json", str(out),
        "--suggest-k", "4",
    ])  # fmt: skip
    printed = capsys.readouterr().out
    print(printed)
    assert code == 0, printed  # no request failed, in any phase
    result = json.loads(out.read_text())
    phases = {(o["concurrency"], o["phase"]) for o in result["outcomes"]}
    assert phases == {(c, p) for c in (1, 4) for p in ("standard", "speculative", "rules", "adaptive")}
    # two passes (the second in reverse order): every phase ran each prompt twice, 4 prompts at least per level
    counts = {key: sum(1 for o in result["outcomes"] if (o["concurrency"], o["phase"]) == key) for key in phases}
    assert counts == {(c, p): 2 * max(4, c) for c, p in phases}
    pinned = [o for o in result["outcomes"] if o["phase"] in ("standard", "speculative")]
    assert all(o["pool"] == o["phase"] for o in pinned)
    assert result["learned_after"] is not None  # 4 per pool: the pinned phases warm it up
    adaptive = [o for o in result["outcomes"] if o["phase"] == "adaptive" and o["concurrency"] == 4]
    assert all(o["reason"].startswith("fastest") for o in adaptive)
    assert "specgate bench route: real pools" in printed
    # suggest-k on what the adaptive gateway learned from the real engines: a table vLLM would take for the CPU
    # pool (k = 4, n-gram), read around the acceptance the real speculative engine reported per request
    suggestion = result["k_suggestion"]
    assert suggestion is not None and suggestion["table"], printed
    validate_schedule(suggestion["table"], 4)
    assert 1.0 < suggestion["acceptance_length"] <= 5.0
    assert "suggested speculative k table (suggest-k)" in printed
