"""What the learned model knows, as JSON for ``GET /v1/route/model`` and ``POST /v1/route/explain``.

Pure functions of the model (no I/O). Times are in milliseconds; the load grid is the model's own.
"""

from __future__ import annotations

import math
from typing import Any

from gateway.adaptive.model import NODES, PROMPT_BINS, LatencyModel, Offset, PoolModel, Prediction
from gateway.adaptive.predictor import predictor_view
from gateway.rules import RoutingRules

GRID_LOADS = tuple(2**i - 1 for i in range(NODES))


def prediction_view(prediction: Prediction, objective: str) -> dict[str, Any]:
    return {
        "pool": prediction.pool,
        "objective": objective,
        "predicted_ms": round(prediction.value(objective) * 1000, 1),
        "interval_ms": [round(prediction.low_s * 1000, 1), round(prediction.high_s * 1000, 1)],
        "ttft_ms": round(prediction.ttft_s * 1000, 1),
        "e2e_ms": round(prediction.e2e_s * 1000, 1),
        "tpot_ms": round(prediction.tpot_s * 1000, 2),
        "output_tokens": round(prediction.output_tokens, 1),
        "load": prediction.load,
        "samples": round(prediction.samples, 1),
        "cost_ms": round(prediction.cost_s * 1000, 1),
    }


def model_view(model: LatencyModel | None, rules: RoutingRules, now_s: float, warm: bool) -> dict[str, Any]:
    """The learned model per pool and segment, readable: curves at the grid's loads, per-segment factors."""
    if model is None:
        return {"enabled": rules.uses_fastest, "warm": False, "observations": 0, "pools": {}, "segments": {}}
    return {
        "enabled": rules.uses_fastest,
        "warm": warm,
        "objective": rules.objective,
        "observations": model.version,
        "min_samples": rules.adaptive.min_samples,
        "pools": {name: _pool_view(pool, now_s) for name, pool in model.pools.items()},
        "predictor": predictor_view(model.predictor),
        "segments": {
            segment: {
                "samples": lengths.count,
                "output_tokens_mean": round(lengths.prefix[-1] / lengths.count, 1),
                "output_tokens_p50": lengths.sorted_tokens[lengths.count // 2],
                "output_tokens_p90": lengths.sorted_tokens[min(lengths.count - 1, lengths.count * 9 // 10)],
            }
            for segment, lengths in sorted(model.lengths.items())
        },
    }


def _pool_view(pool: PoolModel, now_s: float) -> dict[str, Any]:
    return {
        "samples": round(pool.samples, 1),
        "last_observed_s_ago": None if pool.last_observed_s is None else round(now_s - pool.last_observed_s, 1),
        "by_load": [
            {
                "load": load,
                "ttft_ms": round(math.exp(pool.ttft.values[i]) * 1000, 1),
                "tpot_ms": round(math.exp(pool.tpot.values[i]) * 1000, 2),
                "samples": round(min(pool.ttft.weights[i], pool.tpot.weights[i]), 1),
            }
            for i, load in enumerate(GRID_LOADS)
        ],
        "tpot_factor_by_segment": {seg: _factor(off) for seg, off in sorted(pool.tpot_offsets.items())},
        "ttft_factor_by_prompt_tokens": {
            _prompt_label(b): _factor(off) for b, off in sorted(pool.ttft_offsets.items())
        },
        # the pool's geometric mean acceptance length (tokens per step; its curve's tpot is at this acceptance):
        # None where the pool reports none (a standard pool)
        "acceptance_length_mean": None if pool.acceptance_mean is None else round(math.exp(pool.acceptance_mean), 4),
        "acceptance_length_by_segment": {
            seg: {"mean": round(off.value, 3), "samples": round(off.weight, 1)}
            for seg, off in sorted(pool.acceptance.items())
        },
        # seconds of the first token's time a thousand prompt tokens held in the replica's prefix cache save
        "ttft_saved_s_per_1k_cached_tokens": round(pool.prefill_rate * 1000.0, 4),
        "residual_sigma": {"ttft": round(math.sqrt(pool.ttft_var), 3), "tpot": round(math.sqrt(pool.tpot_var), 3)},
        "templates": _templates_view(pool),
        # log tpot per unit of a request's predicted log acceptance length over its segment's (about -1 where
        # the pool reports acceptance, 0 where acceptance does not change its speed)
        "content_slope": round(pool.slope, 3),
        # time per token while the other pool has work, over while it is idle: pools that share hardware (1.0
        # until the data show it clearly)
        "tpot_factor_while_other_busy": round(math.exp(pool.cross), 3),
        "while_other_busy_fit": None if pool.cross_fit is None else {
            "log_factor": round(pool.cross_fit[0], 3), "standard_error": round(pool.cross_fit[1], 3),
            "spread": round(pool.cross_fit[2], 1),
        },
    }


def _templates_view(pool: PoolModel) -> dict[str, Any]:
    """How many system-prompt templates the pool has offsets for, per segment, and the range of their
    factors over the segment's (digests only: no prompt text is kept)."""
    by_segment: dict[str, int] = {}
    for key in pool.template_offsets:
        segment = key.split("#", 1)[0]
        by_segment[segment] = by_segment.get(segment, 0) + 1
    shifts = list(pool.template_shift.values())
    return {
        "count": len(pool.template_offsets),
        "by_segment": dict(sorted(by_segment.items())),
        "factor_range": [round(math.exp(min(shifts)), 3), round(math.exp(max(shifts)), 3)] if shifts else None,
    }


def _factor(offset: Offset) -> dict[str, float]:
    return {"factor": round(math.exp(offset.shrunk), 3), "samples": round(offset.weight, 1)}


def _prompt_label(index: int) -> str:
    low = 0 if index == 0 else PROMPT_BINS[index - 1]
    return f"{low}+" if index == len(PROMPT_BINS) else f"{low}-{PROMPT_BINS[index]}"
