"""The per-batch-size k table (backends/spec_schedule.py): the validator and the lookup, and both against vLLM
0.32.0's own functions (vllm/v1/spec_decode/dynamic/utils.py, read from the CPU engine's venv)."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import pytest

from backends.cpu_engine import CpuEngine
from backends.spec_schedule import k_for_batch, parse_schedule, validate_schedule

TABLES: list[list[list[int]]] = [
    [[1, 16, 3], [17, 48, 2], [49, 96, 1], [97, 128, 0]],
    [[1, 4, 5], [32, 64, 2]],  # a gap (5-31) and a tail past 64 keep the previous k
    [[40, 256, 0], [1, 39, 4]],  # unsorted
    [[1, 1, 0], [2, 8, 9]],  # k above num_speculative_tokens: vLLM caps it, the validator refuses it
    [[2, 16, 3]],  # not from 1
    [[1, 16, 3], [16, 32, 1]],  # overlap
    [[1, 16, -1]],
    [[1, 16]],
]


@pytest.mark.parametrize(
    ("entries", "error"),
    [(TABLES[4], "start at 1"), (TABLES[5], "overlap"), (TABLES[6], "between 0"), (TABLES[7], r"\[range_start")],
    ids=["not-from-1", "overlap", "negative-k", "two-items"],
)
def test_bad_tables_are_refused_with_the_reason(entries: list[list[int]], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        validate_schedule(entries, max_k=5)


def test_the_lookup_carries_k_through_gaps_and_the_tail() -> None:
    schedule = validate_schedule(TABLES[1], max_k=5)
    assert [k_for_batch(schedule, batch, 5) for batch in (1, 4, 5, 31, 32, 64, 65, 1000)] == [5, 5, 5, 5, 2, 2, 2, 2]
    assert k_for_batch(schedule, 3, max_k=4) == 4  # capped at num_speculative_tokens, as vLLM does


def _vllm_dynamic_utils(cpu_engine: CpuEngine) -> ModuleType:
    """vLLM's own module, loaded by path (it imports nothing, so vLLM itself is not imported)."""
    found = sorted(cpu_engine.venv.glob("lib/python3*/site-packages/vllm/v1/spec_decode/dynamic/utils.py"))
    if not found:
        pytest.skip(f"no vLLM dynamic speculation module under {cpu_engine.venv}")
    spec = importlib.util.spec_from_file_location("vllm_dynamic_sd_utils", found[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.vllm
@pytest.mark.parametrize("entries", TABLES, ids=[str(i) for i in range(len(TABLES))])
def test_validator_and_lookup_agree_with_vllm(entries: list[list[int]], cpu_engine: CpuEngine) -> None:
    vllm = _vllm_dynamic_utils(cpu_engine)
    max_k, max_batch = 5, 300
    dense: Any
    try:
        dense = vllm.build_dynamic_sd_schedule_lookup(entries, max_batch, max_k)
    except ValueError:
        dense = None
    try:
        schedule = validate_schedule(entries, max_k)
    except ValueError as exc:
        assert dense is None or "num_speculative_tokens" in str(exc)  # k > max: vLLM caps, we refuse
        return
    assert dense is not None
    assert [k_for_batch(schedule, batch, max_k) for batch in range(1, max_batch + 1)] == dense[1:]


def test_a_table_written_on_the_command_line_parses_to_vllms_entries() -> None:
    assert parse_schedule("1-8:5,9-32:2,33:0") == ((1, 8, 5), (9, 32, 2), (33, 33, 0))
    assert parse_schedule(" 9-32:2 , 1-8:3 ") == ((1, 8, 3), (9, 32, 2))  # sorted, spaces allowed
    for bad, error in [("1-8", "FROM-TO:K"), ("1-x:2", "FROM-TO:K"), ("2-8:3", "must start at 1"),
                       ("1-8:3,8-9:1", "overlap")]:  # fmt: skip
        with pytest.raises(ValueError, match=error):
            parse_schedule(bad)
