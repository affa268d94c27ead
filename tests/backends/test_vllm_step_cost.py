"""``specgate bench step-cost`` against the REAL vLLM 0.32 CPU servers: the plain pool and the n-gram pool (k = 4)
measured through real streams, each one's k read from its own counters, and the step model fitted."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from backends.cpu_engine import CpuPair
from backends.manifest import load_manifest, pool_path
from gateway.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_step_cost_on_the_real_pools(cpu_pools: CpuPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    k = load_manifest(pool_path("speculative", cpu=True)).speculative
    assert k is not None
    out = tmp_path / "steps.json"
    argv = ["bench", "step-cost", "--engine", cpu_pools.standard.url, "--engine", cpu_pools.speculative.url,
            "--concurrency", "1,4", "--tokens", "16", "--rounds", "1", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "fit: plain step" in capsys.readouterr().out
    data = orjson.loads(out.read_bytes())
    ks = {p["engine"]: p["k"] for p in data["points"]}
    assert ks == {cpu_pools.standard.url: 0, cpu_pools.speculative.url: k.num_speculative_tokens}
    for point in data["points"]:
        assert 0.001 < point["step_s"] < 2.0  # one engine step on the CPU: milliseconds, not the whole stream
        assert (point["acceptance"] is None) == (point["k"] == 0)
        if point["acceptance"] is not None:
            assert 0.0 < point["acceptance"] <= 1.0  # the copy prompt: the n-gram drafter finds matches
    fit = data["fit"]
    assert fit["overhead_s"] + fit["per_token_s"] > 0 and fit["draft_cost_ratio"] >= 0 and fit["verify_cost_ratio"] >= 0
