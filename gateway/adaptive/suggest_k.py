"""The speculative pool's k per batch size, from what a gateway learned of both pools.

vLLM (>= 0.32) takes ``num_speculative_tokens_per_batch_size`` in ``--speculative-config``: a ``k`` per range of
batch sizes, ``k = 0`` allowed. The gateway learns both pools' time per output token as their load grows
(``GET /v1/route/model``, ``by_load``): the speculative pool at its ``k`` (``K``) and at the mean acceptance
length ``E_K`` of the traffic it served (``acceptance_length_mean``), the standard pool without drafts. At
batch size ``B`` that gives two step times: a plain step ``T_0(B)`` (the standard pool's time per token: one
token a step) and a speculative step ``T_K(B)`` (the speculative pool's time per token x ``E_K``).

- **Other k.** A speculative step is ``k`` draft passes plus one verification of ``B x (k + 1)`` tokens, both
  linear in ``k`` whether the device is memory- or compute-bound, so ``T_k = T_0 + k / K x (T_K - T_0)``
  (an assumption; exact in the emulator away from the bend between the two regimes). The per-token acceptance
  ``a`` solves ``(1 - a^(K+1)) / (1 - a) = E_K``; ``k`` drafts give ``E_k = (1 - a^(k+1)) / (1 - a)`` tokens.
- **k = 0 is not free.** A speculative engine at ``k = 0`` steps as a plain one plus a measured overhead (vLLM
  issue #49548: +6.56 % at concurrency 2, +21.58 % at 189; interpolated in log batch size, as the emulator
  does): ``T_0 x (1 + overhead(B))``.
- At each batch size the ``k`` with the most tokens a second, ``E_k / T_k``, is chosen, from batch size 1 up
  to the first where ``k = 0`` wins; from there on 0 (vLLM keeps the last range's ``k`` for larger batches).
  Where the pool reports no acceptance, only that switch is judged (``K`` against ``k = 0``).
- **k never rises with the batch size.** A bigger batch makes each draft's verification dearer and nothing
  cheaper, so the best ``k`` can only fall as the batch grows; where the learned curves say otherwise (two
  noisy grid points, or a bend read between them) the table keeps the smaller ``k`` it chose for a smaller
  batch. vLLM accepts either; a table that rises would draft more exactly where drafting pays less.

A pool's load is its requests (running and waiting) over its replicas; batch size ``b`` on every replica of
a pool of ``r`` replicas is pool load ``b x r``. Only batch sizes where both pools' curves have samples are
judged (a gateway that served busy traffic has seen neither pool nearly idle: below the first judged batch
size the pool keeps its ``K``, as drafting pays most where batches are small); past them nothing is claimed.
Pure (no I/O): it reads the model view's dictionary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

# The cost of having speculation configured while it drafts nothing (k = 0), against an engine with no
# speculative config: vLLM issue #49548 (comment of 2026-08-24; vLLM 0.27.1, H100 NVL, Gemma-4-31B FP8 with a
# drafter, a k = 0 dynamic schedule, 400-token context): TPOT 14.374 -> 15.317 ms (+6.56 %) at concurrency 2,
# 77.164 -> 93.820 ms (+21.58 %) at concurrency 189, zero draft tokens in both. (batch, extra share of a step)
# The emulator's k = 0 steps (backends/emulator/timing.py) read the same numbers.
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
    k: int  # the k with the most tokens a second at this batch size


@dataclass(frozen=True, slots=True)
class KSuggestion:
    table: tuple[tuple[int, int, int], ...]  # [from, to, k] entries; empty when nothing was judged
    stop_at: int | None  # the first batch size where drafting stops paying (k = 0); None: not within what was seen
    judged_from: int  # the smallest batch size both pools were seen near (0: none)
    judged_to: int  # the largest judged (the stop, or the largest both were seen near)
    rows: tuple[Row, ...]  # for the report: the first judged, powers of two, each change of k, the stop
    acceptance_length: float | None  # E_K read from the view (None: the pool reports no acceptance)


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
    acceptance = pools["speculative"].get("acceptance_length_mean")
    if acceptance and float(acceptance) > k + 1.0 + 1e-6:  # a step emits at most k + 1 tokens
        raise ValueError(f"the speculative pool's mean acceptance length {float(acceptance):.2f} is above k + 1 = "
                         f"{k + 1}: give its num_speculative_tokens as k")  # fmt: skip
    rate = per_token_acceptance(float(acceptance), k) if acceptance else None
    rows: list[Row] = []
    chosen: list[int] = []  # the k per judged batch size, from judged_from on
    stop_at, judged_from, judged_to = None, 0, 0
    for batch in range(1, max_batch + 1):
        spec_ms, spec_n = _at(speculative, float(batch * speculative_replicas))
        std_ms, std_n = _at(standard, float(batch * standard_replicas))
        if min(spec_n, std_n) < min_samples:  # a pool not seen near this load (busy traffic: the low loads)
            if judged_from:
                break  # past what was seen: nothing claimed
            continue
        judged_from, judged_to = judged_from or batch, batch
        zero_ms = std_ms * (1.0 + zero_k_overhead(batch))
        if rate is None:
            best = k if spec_ms <= zero_ms else 0
        else:
            best = best_k(rate, k, std_ms, spec_ms * float(acceptance), zero_ms)
        if chosen and best > chosen[-1]:
            best = chosen[-1]  # k never rises with the batch size (see the module's docstring)
        row = Row(batch, spec_ms, std_ms, zero_ms, best)
        if batch == judged_from or batch & (batch - 1) == 0 or best != chosen[-1] or best == 0:
            rows.append(row)
        chosen.append(best)
        if best == 0:
            stop_at = batch
            break
    # below the first judged batch size the pool keeps its k
    table = as_ranges([k] * (judged_from - 1) + chosen) if judged_from else ()
    return KSuggestion(
        table, stop_at, judged_from, judged_to, tuple(rows), None if rate is None else float(acceptance)
    )


def as_ranges(ks: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
    """vLLM's ``[from, to, k]`` ranges for ``ks[i]``, the k at batch size ``i + 1`` (runs of one k merged)."""
    table: list[list[int]] = []
    for batch, k in enumerate(ks, start=1):
        if table and table[-1][2] == k:
            table[-1][1] = batch
        else:
            table.append([batch, batch, k])
    return tuple((start, end, k) for start, end, k in table)


def tokens_per_step(rate: float, k: int) -> float:
    """Mean tokens a step emits with ``k`` drafts at per-token acceptance ``rate``: ``(1 - a^(k+1)) / (1 - a)``."""
    return float(k + 1) if rate >= 1.0 else (1.0 - rate ** (k + 1)) / (1.0 - rate)


def per_token_acceptance(length: float, k: int) -> float:
    """The per-token acceptance whose :func:`tokens_per_step` at ``k`` is ``length`` (bisection; clipped)."""
    low, high = 0.0, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if tokens_per_step(mid, k) < length else (low, mid)
    return (low + high) / 2


def best_k(rate: float, k: int, plain_ms: float, speculative_step_ms: float, zero_k_ms: float) -> int:
    """The ``k`` (0 to ``k``) with the most tokens a second: ``k = 0`` at ``zero_k_ms`` a token, ``j >= 1`` at
    ``tokens_per_step(rate, j)`` tokens a step of ``plain_ms + j / k x (speculative_step_ms - plain_ms)``."""
    extra = max(speculative_step_ms - plain_ms, 0.0) / k
    speeds = [1.0 / zero_k_ms] + [tokens_per_step(rate, j) / (plain_ms + j * extra) for j in range(1, k + 1)]
    return max(range(k + 1), key=speeds.__getitem__)


def table_text(table: Sequence[Sequence[int]]) -> str:
    """``FROM-TO:K,...``, as ``specgate simulate --speculative-k`` takes it."""
    return ",".join(f"{a}-{b}:{k}" for a, b, k in table)
