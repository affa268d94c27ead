"""``specgate bench compare`` for real, on the two vLLM CPU pools, with a tiny workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.cpu_engine import CpuPair
from gateway.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

WORKLOAD = """\
category: {category}
items:
  - id: {category}-1
    system: {system}
    user: {user}
    max_tokens: 40
"""


def test_bench_compare_on_real_pools(cpu_pools: CpuPair, tmp_path: Path) -> None:
    (tmp_path / "code.yaml").write_text(WORKLOAD.format(
        category="code", system="You are a coding assistant. Output the full edited code.",
        user='"Rename x to count:\\n```python\\ndef f(items):\\n    x = 0\\n    for i in items:\\n'
             '        x += i\\n    return x\\n```"'), encoding="utf-8")
    (tmp_path / "chat.yaml").write_text(WORKLOAD.format(
        category="chat", system="You are a friendly assistant.", user="Say hello to a new colleague."),
        encoding="utf-8")
    out = tmp_path / "result.json"
    code = main(["bench", "compare", "--standard", cpu_pools.standard.url, "--speculative",
                 cpu_pools.speculative.url, "--workload", str(tmp_path), "--concurrency", "1,2",
                 "--json", str(out)])
    assert code == 0
    document = json.loads(out.read_text())
    assert document["meta"]["served_by"] == "vllm"
    rows = {(r["concurrency"], r["category"]): r for r in document["results"]}
    assert set(rows) == {(1, "chat"), (1, "code"), (2, "chat"), (2, "code")}
    for row in rows.values():
        assert row["standard"]["errors"] == row["speculative"]["errors"] == 0
        assert row["standard"]["requests"] == row["concurrency"]
        assert row["standard"]["mean_tpot_s"] > 0 and row["speculative"]["mean_tpot_s"] > 0
        assert row["drafted_tokens"] >= 0  # n-gram drafts only where the prompt has a matching n-gram
    for level in (1, 2):
        code_row = rows[(level, "code")]
        assert code_row["drafted_tokens"] > 0 and code_row["accepted_tokens"] > 0
        assert 0.0 < code_row["acceptance_rate"] <= 1.0
