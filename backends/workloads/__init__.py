"""Shipped workloads (prompts with ground truth) and the prompt key shared by the emulator and simulator."""

from backends.workloads.loader import (
    Workload,
    WorkloadItem,
    count_prompt_tokens,
    count_tokens,
    load_workload,
    prompt_key,
)

__all__ = ["Workload", "WorkloadItem", "count_prompt_tokens", "count_tokens", "load_workload", "prompt_key"]
