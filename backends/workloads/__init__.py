"""Shipped workloads (prompts with ground truth, in splits) and the prompt key shared by the emulator and simulator."""

from backends.workloads.loader import (
    RECORDED_SPLITS,
    SPLITS,
    Workload,
    WorkloadItem,
    count_prompt_tokens,
    count_tokens,
    load_split,
    load_workload,
    prompt_key,
)

__all__ = [
    "RECORDED_SPLITS",
    "SPLITS",
    "Workload",
    "WorkloadItem",
    "count_prompt_tokens",
    "count_tokens",
    "load_split",
    "load_workload",
    "prompt_key",
]
