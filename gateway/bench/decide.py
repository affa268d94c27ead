"""``specgate bench decide``: the cost of one routing decision, per policy, measured side by side in one run.

Times ``decide(features, snapshot, rules)`` (and feature extraction, and the adaptive policy's per-request
snapshot refresh) over a fixed set of requests from the shipped workload: the reference rules, the shipped
rules while the model warms up (they fall through to the reference rules), and the shipped rules with a
warm model (``fastest``: both pools' predictions and the choice). Median and p99 in microseconds.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from backends.workloads.loader import load_workload
from gateway.adaptive.learner import Learner, Observation
from gateway.adaptive.model import segment_of
from gateway.decide import decide
from gateway.features import Classifier, RequestFeatures, extract_features
from gateway.rules import RoutingRules, default_rules, reference_rules
from gateway.snapshot import POOL_NAMES, PoolSnapshot, Snapshot


def _features(rules: RoutingRules) -> list[RequestFeatures]:
    classifier = Classifier(rules)
    return [extract_features(item.request_body("m"), "chat", {}, rules, classifier) for item in load_workload().items]


def _warm_model(features: list[RequestFeatures]) -> Learner:
    learner, rng = Learner(), random.Random(0)
    for index in range(2000):
        f = features[index % len(features)]
        pool = POOL_NAMES[index % 2]
        load = rng.randint(0, 100)
        tpot = (0.03 if pool == "standard" else 0.012) * (1 + load / (300 if pool == "standard" else 60))
        tokens = rng.randint(20, 400)
        learner.observe(Observation(pool, segment_of(f.task, f.copy), f.prompt_tokens, load, 0.05,
                                    0.05 + tokens * tpot, tokens, at_s=1.0))  # fmt: skip
    return learner


def _time(call: Callable[[], object], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - started) / 1000)
    return samples


def measure(rounds: int = 20_000) -> dict[str, list[float]]:
    reference, shipped = reference_rules(), default_rules()
    features = _features(shipped)
    pools = {name: PoolSnapshot(name, 1, 1, running=12, waiting=0, inflight=3) for name in POOL_NAMES}
    cold = Snapshot(pools=pools)
    warm = Snapshot(pools=pools, model=_warm_model(features).model(1.0))
    items = load_workload().items
    classifier = Classifier(shipped)
    it = iter(range(10**9))

    def pick() -> RequestFeatures:
        return features[next(it) % len(features)]

    return {
        "decide: reference rules": _time(lambda: decide(pick(), cold, reference), rounds),
        "decide: shipped rules, warming up": _time(lambda: decide(pick(), cold, shipped), rounds),
        "decide: shipped rules, warm (fastest)": _time(lambda: decide(pick(), warm, shipped), rounds),
        # the same, every call a question the model has not answered yet (a new load, or a cleared memo)
        "decide: shipped rules, warm, not remembered": _time(lambda: _unremembered(pick(), warm, shipped), rounds),
        "snapshot with fresh in-flight counts": _time(lambda: warm.with_inflight({"standard": 3}), rounds),
        "extract_features (workload prompts)": _time(
            lambda: extract_features(items[next(it) % len(items)].request_body("m"), "chat", {}, shipped, classifier),
            rounds,
        ),
    }


def _unremembered(features: RequestFeatures, snapshot: Snapshot, rules: RoutingRules) -> object:
    assert snapshot.model is not None
    snapshot.model.memo.clear()
    return decide(features, snapshot, rules)


def main(rounds: int) -> int:
    results = measure(rounds)
    table = Table(title=f"specgate bench decide: microseconds per call, {rounds} calls each (this machine)")
    for column in ("what", "median us", "p99 us", "vs reference rules (median)"):
        table.add_column(column, justify="left" if column == "what" else "right")
    base = statistics.median(results["decide: reference rules"])
    for name, samples in results.items():
        ordered = sorted(samples)
        median = statistics.median(ordered)
        table.add_row(name, f"{median:.2f}", f"{ordered[int(len(ordered) * 0.99)]:.2f}", f"{median / base:.2f}x")
    Console(width=120).print(table)
    return 0
