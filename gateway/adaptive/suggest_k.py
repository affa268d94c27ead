"""Where the speculative pool should stop drafting, from what a gateway learned of both pools.

vLLM (>= 0.32) takes ``num_speculative_tokens_per_batch_size`` in ``--speculative-config``: a ``k`` per range of
batch sizes, ``k = 0`` allowed. The gateway cannot see what another ``k`` would do, but it learns both pools'
time per output token as their load grows (``GET /v1/route/model``, ``by_load``): the speculative pool at its
``k`` and at the acceptance of the traffic it served, the standard pool without drafts. A speculative engine
running ``k = 0`` steps as a plain one does plus a measured overhead (vLLM issue #49548: +6.56 % at
concurrency 2, +21.58 % at 189; interpolated in log batch size, as the emulator does). So, per batch size,
the speculative pool should draft where its learned time per token beats the standard pool's times that
overhead, and stop from the first batch size where it does not:

    k                  for batch sizes 1 .. B - 1
    0                  from B on (vLLM keeps the last range's k for every larger batch)

A pool's load is its requests (running and waiting) over its replicas; batch size ``b`` on every replica of
a pool of ``r`` replicas is pool load ``b x r``. Only batch sizes where both pools' curves have samples are
judged (a gateway that served busy traffic has seen neither pool nearly idle: below the first judged batch
size drafting is taken to pay, as it does most where batches are small); past them nothing is claimed.
Pure (no I/O): it reads the model view's dictionary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

# vLLM issue #49548: TPOT of an engine with a speculative config at k = 0 over one without, at two concurrencies
ZERO_K_OVERHEAD = ((2, 0.0656), (189, 0.2158))
MAX_BATCH = 256  # vLLM's default max_num_seqs


def zero_k_overhead(batch: int) -> float:
    """Extra share of a step's time at ``k = 0`` with ``batch`` requests (held flat outside the two points)."""
    (low_batch, low), (high_batch, high) = ZERO_K_OVERHEAD
    if batch <= low_batch:
        return low
    if batch >= high_batch:
        return high
    return low + (high - low) * math.log(batch / low_batch) / math.log(high_batch / low_batch)


@dataclass(frozen=True, slots=True)
class Row:
    batch: int
    speculative_ms: float  # learned time per output token on the speculative pool at this batch size
    standard_ms: float  # ... on the standard pool
    zero_k_ms: float  # the standard pool's, plus the k = 0 overhead: what the speculative pool would run at k = 0


@dataclass(frozen=True, slots=True)
class KSuggestion:
    table: tuple[tuple[int, int, int], ...]  # [from, to, k] entries; empty when nothing was judged
    stop_at: int | None  # the first batch size where drafting stops paying; None: not within what was seen
    judged_from: int  # the smallest batch size both pools were seen near (0: none)
    judged_to: int  # the largest judged (the stop, or the largest both were seen near)
    rows: tuple[Row, ...]  # the batch sizes judged (powers of two and the switch), for the report


def _curve(pool: Mapping[str, Any]) -> list[tuple[float, float, float]]:
    """The pool's grid as (log2(1 + load), log tpot, samples), in load order."""
    return [(math.log2(1.0 + float(p["load"])), math.log(max(float(p["tpot_ms"]), 1e-6)), float(p["samples"]))
            for p in sorted(pool["by_load"], key=lambda p: float(p["load"]))]  # fmt: skip


def _at(curve: Sequence[tuple[float, float, float]], load: float) -> tuple[float, float]:
    """(tpot in ms, samples) at ``load``: linear in log2(1 + load) between grid points, as the model reads it."""
    u = math.log2(1.0 + load)
    for (u0, v0, w0), (u1, v1, w1) in pairwise(curve):
        if u <= u1:
            f = 0.0 if u1 == u0 else min(max((u - u0) / (u1 - u0), 0.0), 1.0)
            return math.exp(v0 + f * (v1 - v0)), w0 + f * (w1 - w0)
    return math.exp(curve[-1][1]), curve[-1][2]


def suggest_k(
    view: Mapping[str, Any], k: int, standard_replicas: int = 1, speculative_replicas: int = 1,
    min_samples: float = 3.0, max_batch: int = MAX_BATCH,
) -> KSuggestion:  # fmt: skip
    """The table for the speculative pool's ``--speculative-config`` from a model view (``GET
    /v1/route/model``); ``k``: the pool's ``num_speculative_tokens``. ``ValueError`` when the view has not
    learned both pools or the arguments make no sense."""
    if k < 1 or standard_replicas < 1 or speculative_replicas < 1 or max_batch < 1:
        raise ValueError("k, the replica counts and the largest batch size must be at least 1")
    pools = view.get("pools") or {}
    if "standard" not in pools or "speculative" not in pools:
        raise ValueError("the gateway has not learned both pools yet (GET /v1/route/model shows no curve for one)")
    standard, speculative = _curve(pools["standard"]), _curve(pools["speculative"])
    rows: list[Row] = []
    stop_at, judged_from, judged_to = None, 0, 0
    for batch in range(1, max_batch + 1):
        spec_ms, spec_n = _at(speculative, float(batch * speculative_replicas))
        std_ms, std_n = _at(standard, float(batch * standard_replicas))
        if min(spec_n, std_n) < min_samples:  # a pool not seen near this load (busy traffic: the low loads)
            continue
        judged_from, judged_to = judged_from or batch, batch
        row = Row(batch, spec_ms, std_ms, std_ms * (1.0 + zero_k_overhead(batch)))
        if spec_ms > row.zero_k_ms:
            stop_at = batch
            rows.append(row)
            break
        if batch & (batch - 1) == 0 or batch == judged_from:
            rows.append(row)
    if judged_to == 0:
        table: tuple[tuple[int, int, int], ...] = ()
    elif stop_at is None:
        table = ((1, judged_to, k),)
    elif stop_at == 1:
        table = ((1, 1, 0),)
    else:  # below the first batch size judged, drafting is taken to pay (it pays most where batches are small)
        table = ((1, stop_at - 1, k), (stop_at, stop_at, 0))
    return KSuggestion(table, stop_at, judged_from, judged_to, tuple(rows))


def table_text(table: Sequence[Sequence[int]]) -> str:
    """``FROM-TO:K,...``, as ``specgate simulate --speculative-k`` takes it."""
    return ",".join(f"{a}-{b}:{k}" for a, b, k in table)
