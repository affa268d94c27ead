"""``specgate bench decide``: the cost of one routing decision, per policy, measured side by side in one run.

Times ``decide(features, snapshot, rules)`` (and feature extraction, and the adaptive policy's per-request
snapshot refresh) over a fixed set of requests from the shipped workload: the reference rules, the shipped
rules while the model warms up (they fall through to the reference rules), and the shipped rules with a
warm model (``fastest``: the per-request predictor's estimate, both pools' predictions and the choice).
The whole-decision row is what a request costs: its features read from the body (the content features
included), the snapshot with fresh in-flight counts, and ``decide``, with the model's memo of predictions
answering where an earlier call asked the same (the shipped workload repeats), and again with it missing every
call (a loaded gateway's usual case: its loads change between requests); the last rows the same with the prefix index
on (each prompt's blocks and session key read with its features), then also with what each pool's chosen
replica is expected to hold read for the pool choice (``PoolSet.expected_cached``, two replicas a pool). Median
and p99 in microseconds.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from backends.workloads.loader import WorkloadItem, load_workload
from gateway.adaptive.content import Content, ContentReader, content_of
from gateway.adaptive.learner import Learner, Observation
from gateway.adaptive.model import segment_of
from gateway.decide import decide
from gateway.features import Classifier, RequestFeatures, extract_features
from gateway.metrics import GatewayMetrics
from gateway.pools import PoolSet
from gateway.prefix_index import PrefixIndex, PrefixReader
from gateway.rules import RoutingRules, default_rules, reference_rules
from gateway.snapshot import POOL_NAMES, PoolSnapshot, Snapshot


def _features(rules: RoutingRules) -> list[RequestFeatures]:
    classifier = Classifier(rules)
    return [extract_features(item.request_body("m"), "chat", {}, rules, classifier) for item in load_workload().items]


def _texts(item: WorkloadItem) -> tuple[str | None, str | None]:
    messages = item.request_body("m")["messages"]
    system = next((m["content"] for m in messages if m["role"] in ("system", "developer")), None)
    users = [m["content"] for m in messages if m["role"] == "user"]
    return system, users[-1] if users else None


def _content(reader: ContentReader, item: WorkloadItem, f: RequestFeatures) -> Content:
    """The request's content features: as extracted with it, or read here (a tree whose feature extraction
    does not read them yet)."""
    found = content_of(f)
    if found is not None:
        return found
    return reader.read(*_texts(item), f.task, f.copy, f.prompt_tokens, f.max_tokens, f.n, f.temperature)


def _warm_model(features: list[RequestFeatures]) -> Learner:
    """A learner that has seen 2,000 requests of the workload on both pools, with their content and (on the
    speculative pool) acceptance, so that the per-request predictor is learned too."""
    learner, rng, reader = Learner(), random.Random(0), ContentReader()
    items = load_workload().items
    for index in range(2000):
        f = features[index % len(features)]
        item = items[index % len(items)]
        pool = POOL_NAMES[index % 2]
        load = rng.randint(0, 100)
        tpot = (0.03 if pool == "standard" else 0.012) * (1 + load / (300 if pool == "standard" else 60))
        tokens = rng.randint(20, 400)
        acceptance = 1 + 4 * item.acceptance if pool != "standard" else None
        learner.observe(Observation(pool, segment_of(f.task, f.copy), f.prompt_tokens, load, 0.05,
                                    0.05 + tokens * tpot, tokens, acceptance, at_s=1.0,
                                    content=_content(reader, item, f)))  # fmt: skip
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
    assert warm.model is not None and warm.model.predictor is not None
    predictor = warm.model.predictor
    items = load_workload().items
    classifier = Classifier(shipped)
    reader = ContentReader()
    texts = [_texts(item) for item in items]
    contents = [_content(reader, item, f) for item, f in zip(items, features, strict=True)]
    # the parsed bodies, as the gateway's handler hands them over (building one per call would time the bench)
    bodies = [item.request_body("m") for item in items]
    it = iter(range(10**9))

    def pick() -> RequestFeatures:
        return features[next(it) % len(features)]

    def read_content() -> Content:
        index = next(it) % len(items)
        f = features[index]
        return reader.read(*texts[index], f.task, f.copy, f.prompt_tokens, f.max_tokens, f.n, f.temperature)

    def whole() -> object:
        index = next(it) % len(items)
        f = extract_features(bodies[index], "chat", {}, shipped, classifier)
        if content_of(f) is None:  # a tree that does not read them with the features yet: their cost counts
            reader.read(*texts[index], f.task, f.copy, f.prompt_tokens, f.max_tokens, f.n, f.temperature)
        return decide(f, warm.with_inflight({"standard": 3}), shipped)

    indexed = Classifier(shipped, prefixes=PrefixReader())  # the prefix index on (a pool of several replicas)
    prefixes = PrefixReader()

    def whole_indexed() -> object:
        index = next(it) % len(items)
        f = extract_features(bodies[index], "chat", {}, shipped, indexed)
        if content_of(f) is None:
            reader.read(*texts[index], f.task, f.copy, f.prompt_tokens, f.max_tokens, f.n, f.temperature)
        return decide(f, warm.with_inflight({"standard": 3}), shipped)

    # the gateway's request path with the index on: what each pool's chosen replica is expected to hold is read
    # before the decision (GatewayState.see_cache), two replicas a pool, half the prompts held on one of them
    pool_set = PoolSet(GatewayMetrics(CollectorRegistry()), random.Random(0), index=PrefixIndex())
    pool_set.configure({name: [f"http://{name}-{i}:8000" for i in range(2)] for name in POOL_NAMES})
    assert pool_set.index is not None
    for index, body in enumerate(bodies[::2]):
        pool_set.index.record(f"http://{POOL_NAMES[index % 2]}-0:8000", prefixes.chat(body["messages"], None, {})[0])

    def whole_cached() -> object:
        index = next(it) % len(items)
        f = extract_features(bodies[index], "chat", {}, shipped, indexed)
        if content_of(f) is None:
            reader.read(*texts[index], f.task, f.copy, f.prompt_tokens, f.max_tokens, f.n, f.temperature)
        f.cached_tokens = pool_set.expected_cached(f.blocks, f.prefix_bytes, f.prompt_tokens)
        return decide(f, warm.with_inflight({"standard": 3}), shipped)

    return {
        "decide: reference rules": _time(lambda: decide(pick(), cold, reference), rounds),
        "decide: shipped rules, warming up": _time(lambda: decide(pick(), cold, shipped), rounds),
        "decide: shipped rules, warm (fastest)": _time(lambda: decide(pick(), warm, shipped), rounds),
        # the same, every call a question the model has not answered yet (a new load, or a cleared memo)
        "decide: shipped rules, warm, not remembered": _time(lambda: _unremembered(pick(), warm, shipped), rounds),
        "snapshot with fresh in-flight counts": _time(lambda: warm.with_inflight({"standard": 3}), rounds),
        "extract_features (workload prompts)": _time(
            lambda: extract_features(bodies[next(it) % len(bodies)], "chat", {}, shipped, classifier),
            rounds,
        ),
        "content features alone (ContentReader.read)": _time(read_content, rounds),
        "predictor estimate alone (both targets)": _time(
            lambda: predictor.estimate(contents[next(it) % len(contents)]), rounds
        ),
        "whole decision: extract_features + snapshot + decide, warm": _time(whole, rounds),
        # the same, the model's memo missed every call: a gateway's loads change from request to request, and its
        # model is rebuilt every snapshot interval, so under load this is the usual case
        "whole decision, warm, not remembered": _time(lambda: _forgetting(whole, warm), rounds),
        "prefix blocks + session key alone (PrefixReader.chat)": _time(
            lambda: prefixes.chat(bodies[next(it) % len(bodies)]["messages"], None, {}), rounds
        ),
        "whole decision, prefix index on (blocks read with the features)": _time(whole_indexed, rounds),
        "whole decision, index on, each pool's expected cached tokens read": _time(whole_cached, rounds),
    }


def _forgetting(call: Callable[[], object], snapshot: Snapshot) -> object:
    assert snapshot.model is not None
    snapshot.model.memo.clear()
    return call()


def _unremembered(features: RequestFeatures, snapshot: Snapshot, rules: RoutingRules) -> object:
    assert snapshot.model is not None
    snapshot.model.memo.clear()
    return decide(features, snapshot, rules)


def medians(rounds: int) -> dict[str, object]:
    """Each row's median (us) and which modules ran compiled: one side of ``--compiled``, as JSON."""
    from gateway.compiled import compiled_modules

    rows = {name: statistics.median(samples) for name, samples in measure(rounds).items()}
    return {"compiled": compiled_modules(), "rows": rows}


def compare_compiled(rounds: int, passes: int = 2, wheel: Path | None = None) -> int:
    """``--compiled``: this tree's compiled build (a wheel built as ``pip install .`` builds it) against its
    source, each in a process of its own, alternating (source, compiled, compiled, source, ...) so that a drift
    in the machine's speed hits both; the median of each side's passes, and compiled / source."""
    from gateway.bench.compiled_build import REPO_ROOT, compiled_tree, python_env
    from gateway.bench.overhead_compare import order

    console = Console(width=120)
    if wheel is None:
        console.print("building this tree's compiled wheel (mypyc; a minute or a few)")
    sides: dict[str, list[dict[str, float]]] = {"source": [], "compiled": []}
    with compiled_tree(wheel) as site:
        roots = {"source": REPO_ROOT, "compiled": site}
        for label in order(passes):  # base head, head base, ...: the source is the base
            side = "source" if label == "base" else "compiled"
            code = f"import json; from gateway.bench.decide import medians; print(json.dumps(medians({rounds})))"
            done = subprocess.run([sys.executable, "-P", "-c", code], cwd=roots[side], env=python_env(roots[side]),
                                  capture_output=True, text=True, check=False)  # fmt: skip
            if done.returncode != 0:
                console.print(f"[red]the {side} side failed:[/]\n{done.stderr[-2000:]}")
                return 1
            found = json.loads(done.stdout.strip().splitlines()[-1])
            if bool(found["compiled"]) != (side == "compiled"):
                console.print(f"[red]the {side} side ran compiled modules {found['compiled']}[/]")
                return 1
            sides[side].append(found["rows"])
            console.print(f"  {side}: done")
    table = Table(title=f"specgate bench decide --compiled: median us per call, {rounds} calls a row, {passes} passes "
                  "a side (this machine)")  # fmt: skip
    for column in ("what", "source us", "compiled us", "compiled / source"):
        table.add_column(column, justify="left" if column == "what" else "right")
    for name in sides["source"][0]:
        source = statistics.median(p[name] for p in sides["source"])
        compiled = statistics.median(p[name] for p in sides["compiled"])
        table.add_row(name, f"{source:.2f}", f"{compiled:.2f}", f"{compiled / source:.2f}x")
    console.print(table)
    return 0


def main(rounds: int, compiled: bool = False, wheel: Path | None = None) -> int:
    if compiled:
        return compare_compiled(rounds, wheel=wheel)
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
