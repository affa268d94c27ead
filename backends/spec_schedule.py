"""vLLM's dynamic speculative decoding: ``num_speculative_tokens_per_batch_size`` in ``--speculative-config``.

vLLM 0.32 (``vllm/config/speculative.py``, ``vllm/v1/spec_decode/dynamic/utils.py``) takes a list of
``[range_start, range_end, k]`` entries: inclusive batch-size ranges, positive, sorted or not but never
overlapping, the first starting at 1, ``k >= 0`` (``k = 0``: no draft at that batch size). The scheduler then
drafts, at each step, the ``k`` of the step's batch size (its scheduled requests, prefills included): a gap
between two ranges keeps the previous range's ``k``, batch sizes past the last range keep the last ``k``, and
every ``k`` is capped at ``num_speculative_tokens`` (the maximum, which sizes vLLM's buffers).

One validator and one lookup, shared by the pool manifests (``backends/manifest.py``) and the emulator's
profiles (``backends/emulator/profiles.py``). This module rejects a ``k`` above ``num_speculative_tokens``,
which vLLM would silently cap, because it is nearly always a mistake in the table.
"""

from __future__ import annotations

from collections.abc import Sequence

Schedule = tuple[tuple[int, int, int], ...]


def validate_schedule(entries: Sequence[Sequence[int]], max_k: int) -> Schedule:
    """The entries as a sorted tuple of ``(start, end, k)``; ``ValueError`` naming what is wrong."""
    if not entries:
        raise ValueError("num_speculative_tokens_per_batch_size must not be empty")
    parsed: list[tuple[int, int, int]] = []
    for entry in entries:
        if len(entry) != 3:
            raise ValueError(f"each entry is [range_start, range_end, k]; got {list(entry)}")
        start, end, k = (int(value) for value in entry)
        if start <= 0 or end <= 0:
            raise ValueError(f"batch-size range ({start}, {end}) must be positive")
        if start > end:
            raise ValueError(f"batch-size range start must be <= end: ({start}, {end}, {k})")
        if not 0 <= k <= max_k:
            raise ValueError(f"k must be between 0 and num_speculative_tokens ({max_k}); got {k} for ({start}, {end})")
        parsed.append((start, end, k))
    parsed.sort()
    previous_end = 0
    for start, end, _ in parsed:
        if start <= previous_end:
            raise ValueError(f"batch-size ranges overlap at {start}")
        previous_end = end
    if parsed[0][0] != 1:
        raise ValueError("the first batch-size range must start at 1 (every batch size needs a k)")
    return tuple(parsed)


def k_for_batch(schedule: Schedule, batch: int, max_k: int) -> int:
    """The ``k`` vLLM drafts at ``batch`` scheduled requests: the last range starting at or below it."""
    k = schedule[0][2]
    for start, _, entry_k in schedule:
        if start > batch:
            break
        k = entry_k
    return min(k, max_k)


def parse_schedule(text: str) -> Schedule:
    """A table written ``FROM-TO:K,...`` (``9-32:2``; ``33:0`` is the range 33-33, whose ``k`` holds for every
    larger batch), as ``specgate simulate --speculative-k`` takes it; ``ValueError`` naming the bad entry. The
    table is not checked against a ``num_speculative_tokens`` here: the profile that takes it does that."""
    entries: list[tuple[int, int, int]] = []
    for part in (p.strip() for p in text.split(",")):
        span, colon, k = part.partition(":")
        start, dash, end = span.partition("-")
        try:
            if not colon:
                raise ValueError
            entries.append((int(start), int(end) if dash else int(start), int(k)))
        except ValueError:
            raise ValueError(f"a k table entry is FROM-TO:K or FROM:K (e.g. 1-8:5,9-32:2,33:0); got {part!r}") from None
    return validate_schedule(entries, max(k for _, _, k in entries))
