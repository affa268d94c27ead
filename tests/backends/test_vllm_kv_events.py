"""``specgate bench kv-events`` with the REAL vLLM 0.32 CPU engine: its KV-cache events reach the subscriber, the
prompts are tokenized as the engine tokenizes them, and the index built from the events predicts the engine's own
count of cached prompt tokens on later turns, where the approximate text index does not see the cached answers."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from backends.cpu_engine import CpuEngine
from gateway.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_kv_events_on_the_real_engine(
    cpu_engine: CpuEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    out = tmp_path / "kv.json"
    argv = ["bench", "kv-events", "--sessions-per-file", "1", "--turns", "3", "--concurrency", "1",
            "--max-tokens", "32", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "consumer CPU" in capsys.readouterr().out
    data = orjson.loads(out.read_bytes())
    turns = data["turns"]
    assert len(turns) >= 6 and data["events"] > 0 and data["stored"] > 0 and data["block_size"] > 0
    assert all(t["tokenized"] == t["prompt_tokens"] for t in turns)  # the template and tokenizer as the engine's
    later = [t for t in turns if t["turn"] >= 2]
    assert all(t["cached"] is not None for t in turns)  # --enable-prompt-tokens-details
    assert sum(t["precise"] == t["cached"] for t in later) >= 0.8 * len(later)
    assert sum(t["cached"] > 0 for t in later) >= len(later) // 2  # a conversation's history is cached
    precise = sum(abs(t["precise"] - t["cached"]) for t in later)
    approximate = sum(abs(t["approximate"] - t["cached"]) for t in later)
    assert precise < approximate  # the answers' blocks, which the text index never sent, are in the events
