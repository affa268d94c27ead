"""Recording a workload on the REAL vLLM 0.32 CPU speculative server (backends/workloads/record.py): a few
items recorded, written, and read back through the loader. The session's shared CPU pools serve it."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.cpu_engine import CpuPair
from backends.workloads.loader import DATA_DIR, load_workload
from backends.workloads.record import RecordConfig, load_prompts, record, write_recording

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_three_items_recorded_on_the_real_cpu_engine(cpu_pools: CpuPair, tmp_path: Path) -> None:
    prompts = load_prompts([DATA_DIR / "code.yaml"])[:3]
    config = RecordConfig(cpu_pools.speculative.url, concurrency=3, max_tokens_cap=64)
    recorded = record(prompts, config)
    assert recorded.k == 4 and recorded.vllm_version == "0.32.0"
    assert all(m.error is None and m.spec is not None for m in recorded.measurements)
    paths = write_recording(recorded, config, tmp_path, "specgate workloads record (test)", {"method": "ngram"})
    items = load_workload(paths).items
    assert len(items) == 3
    assert all(0 < item.acceptance <= 1 and 0 < item.output_tokens <= 64 for item in items)
