"""``specgate rules suggest URL``: turn what a gateway learned into a readable static rules file.

For operators who want static rules: read ``GET /v1/route/model`` of a running gateway and, per task, find
up to which load the speculative pool is predicted to serve a typical request of that task at a lower cost
(its latency plus the delay it adds to the others, as ``fastest`` weighs it) than the standard pool at the
same load. Each such task becomes one rule ``{task: [t], pools: {speculative: {running: {lt: N}, waiting:
{lt: 1}}}} -> speculative``; the default pool is standard. The thresholds are the model's, at the grid
loads it learned (0, 1, 3, 7, ...), so the file reproduces the learned choices, without the split near
balance, the SLO headers or the tracking of drift that ``fastest`` gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from gateway.rules import RoutingRules

TYPICAL_PROMPT_BIN = "128-512"


def segment_task(segment: str) -> str:
    return segment.split("/", 1)[0]


def e2e_ms(pool: Mapping[str, Any], index: int, segment: str, tokens: float) -> float:
    """The model's cost of a typical request of ``segment`` at grid point ``index``: its end-to-end time plus
    the delay it adds to the others on the pool (as ``fastest`` weighs it), from the curve's slope there."""
    grid = pool["by_load"]
    point = grid[index]
    factor = pool["tpot_factor_by_segment"].get(segment, {}).get("factor", 1.0)
    ttft_factor = pool["ttft_factor_by_prompt_tokens"].get(TYPICAL_PROMPT_BIN, {}).get("factor", 1.0)
    own = point["ttft_ms"] * ttft_factor + max(tokens - 1, 1) * point["tpot_ms"] * factor
    after = grid[min(index + 1, len(grid) - 1)]
    slope = (after["tpot_ms"] - point["tpot_ms"]) / max(after["load"] - point["load"], 1) * factor
    return float(own + point["load"] * slope * tokens)


def speculative_up_to(view: Mapping[str, Any], segment: str) -> float | None:
    """The grid load up to which speculative is predicted faster for ``segment`` (None: at no load).

    Only grid loads both pools were observed at count: past the last of them the curves are the model's
    extrapolation, and a static threshold drawn from an extrapolation can send every request to one pool
    however loaded it is. Winning at every observed load gives the first load past them."""
    pools = view["pools"]
    tokens = view["segments"].get(segment, {}).get("output_tokens_mean", 128.0)
    spec, std = pools["speculative"], pools["standard"]
    loads = [point["load"] for point in spec["by_load"]]
    seen = [i for i in range(len(loads)) if min(p["by_load"][i].get("samples", 1) for p in (spec, std)) > 0]
    if not seen:
        return None
    wins = {i: e2e_ms(spec, i, segment, tokens) < e2e_ms(std, i, segment, tokens) for i in range(seen[-1] + 1)}
    if not wins[0]:
        return None
    for i in range(seen[-1] + 1):
        if not wins[i]:
            return float(loads[i])
    return float(loads[seen[-1] + 1]) if seen[-1] + 1 < len(loads) else float(loads[-1])


def suggest(view: Mapping[str, Any], base: RoutingRules) -> dict[str, Any]:
    """A rules file (as data) with the base file's pools, tasks and defaults and one rule per task."""
    if not view.get("pools") or {"standard", "speculative"} - set(view["pools"]):
        raise ValueError("the model has not seen both pools yet: nothing to suggest")
    by_task: dict[str, str] = {}
    segments = view["segments"]
    for segment in sorted(segments, key=lambda seg: -segments[seg]["samples"]):
        by_task.setdefault(segment_task(segment), segment)  # each task's most frequent segment speaks for it
    rules: list[dict[str, Any]] = [
        rule.model_dump(mode="json", exclude_defaults=True, by_alias=True)
        for rule in base.rules
        if rule.name.startswith("pinned-")
    ]
    for task, segment in sorted(by_task.items()):
        if task not in base.task_names():
            continue
        limit = speculative_up_to(view, segment)
        if limit is None:
            continue
        # and no queue there: past its batch limit a pool only queues, whatever the model says of the load
        when = {"task": [task], "pools": {"speculative": {"running": {"lt": limit}, "waiting": {"lt": 1}}}}
        rules.append({"name": f"learned-{task}", "when": when, "pool": "speculative"})
    data = base.model_dump(mode="json", exclude={"rules", "adaptive", "objective"}, by_alias=True)
    data.update(rules=rules, default_pool="standard")
    return data


def render(data: Mapping[str, Any], source: str, observations: int) -> str:
    header = (
        f"# Suggested by `specgate rules suggest` from {source} ({observations} observed requests).\n"
        "# Static thresholds from the learned model: each task goes to the speculative pool while that pool\n"
        "# runs fewer requests than the load at which the model predicts the standard pool finishes first.\n"
    )
    return header + yaml.safe_dump(dict(data), sort_keys=False, allow_unicode=True)
