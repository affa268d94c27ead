"""``specgate bench sessions`` for real, short: two agent conversations of three turns through the gateways
(prefix index off and on) to the CPU pools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.cpu_engine import CpuPair
from backends.workloads.sessions import SESSIONS_DIR, load_session_file
from gateway.bench.sessions import PHASES
from gateway.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_bench_sessions_on_real_pools(cpu_pools: CpuPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, sessions = tmp_path / "sessions.json", SESSIONS_DIR / "agent-tools.yaml"
    code = main([
        "bench", "sessions", "--standard", cpu_pools.standard.url, "--speculative", cpu_pools.speculative.url,
        "--sessions", str(sessions), "--sessions-per-file", "2", "--turns", "3", "--concurrency", "2",
        "--max-tokens", "8", "--min-samples", "2", "--repeat", "1", "--json", str(out),
    ])  # fmt: skip
    printed = capsys.readouterr().out
    print(printed)
    assert code == 0, printed  # no turn failed, in any phase
    result = json.loads(out.read_text())
    assert [run["phase"] for run in result["runs"]] == list(PHASES)
    outcomes = result["outcomes"]
    assert len(outcomes) == 4 * 2 * 3
    assert all(o["pool"] == o["phase"] for o in outcomes if o["phase"] in ("standard", "speculative"))
    assert all(o["completion_tokens"] <= 8 for o in outcomes)
    # turns >= 2 resent what the engine answered before, not the session file's recorded answers
    recorded = {turn.answer for session in load_session_file(sessions).sessions for turn in session.turns}
    for o in outcomes:
        earlier = sorted((e for e in outcomes if (e["phase"], e["conversation"]) == (o["phase"], o["conversation"])
                          and e["turn"] < o["turn"]), key=lambda e: e["turn"])  # fmt: skip
        assert o["resent"] == [e["answer"] for e in earlier]
        assert not set(o["resent"]) & recorded
    # the engines' own prefix caches: each pinned phase's pool looked up and found the conversations' prefixes
    # (the shared tool prompt and the earlier turns), the other pool saw nothing
    for run in result["runs"][:2]:
        served, other = run["cache"][run["phase"]], run["cache"]["speculative" if run["phase"] == "standard" else
                                                                 "standard"]  # fmt: skip
        assert served["queries"] > 0 and served["hits"] > 0
        assert other["queries"] == 0
    assert result["phases"]["cache-aware"]["hit_rate"]["all"] > 0
    assert "cache-aware / cache-blind" in printed
