"""What the gateway computes for many requests, as one JSON line, for comparing a compiled build with the source.

``python -m tests.compiled_probe`` prints which modules this process runs compiled and digests of, for every
item of the shipped, evaluation, one-prompt and recorded workloads: the features read from its body (task,
copy cue, token estimates, template, content slots, prefix blocks and session) and the decision at several
loads, cold, warming up and warm (pool, reason and every prediction's figures, floats by ``repr``). The
compiled build must print the same digests as the source (tests/test_compiled.py).

Numbers are compared as floats: a compiled function stores an ``int`` given for a ``float`` field or argument as
the float (``5`` reads ``5.0``), where the interpreter keeps the int; the value is the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path

from backends.workloads.loader import load_workload
from gateway.adaptive.content import content_of
from gateway.adaptive.learner import Learner, Observation
from gateway.adaptive.model import segment_of
from gateway.compiled import compiled_modules
from gateway.decide import decide
from gateway.features import Classifier, RequestFeatures, extract_features
from gateway.prefix_index import PrefixReader
from gateway.rules import default_rules, reference_rules
from gateway.snapshot import POOL_NAMES, PoolSnapshot, Snapshot

WORKLOADS = Path(__file__).resolve().parents[1] / "backends" / "workloads"
SETS = ("data", "eval", "families/one-prompt/eval", "recorded/sharegpt", "recorded/humaneval")


def _features() -> list[tuple[RequestFeatures, float]]:
    rules = default_rules()
    classifier = Classifier(rules, read_content=True, prefixes=PrefixReader())
    out = []
    for name in SETS:
        for item in load_workload(sorted((WORKLOADS / name).glob("*.yaml"))).items:
            body = item.request_body("m")
            out.append((extract_features(body, "chat", {"x-session-id": item.id}, rules, classifier, 0.5),
                        item.acceptance))  # fmt: skip
    return out


def _plain(value: object) -> object:
    """``value`` with every number a float, dataclasses and sequences as tuples (see the module's note)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return tuple(_plain(getattr(value, field.name)) for field in dataclasses.fields(value))
    if isinstance(value, tuple | list):
        return tuple(_plain(item) for item in value)
    return value


def _line(f: RequestFeatures) -> str:
    content = content_of(f)
    slots = (content.slots, content.segment, content.units) if content is not None else None
    return repr(_plain((f.task, f.copy, f.prompt_tokens, f.max_tokens, f.template, f.n, f.temperature, f.stream,
                        slots, f.blocks, f.session, f.prefix_bytes)))  # fmt: skip


def _learner(features: list[tuple[RequestFeatures, float]], count: int) -> Learner:
    learner, rng = Learner(), random.Random(0)
    for index in range(count):
        f, acceptance = features[index % len(features)]
        pool = POOL_NAMES[index % 2]
        load = rng.randint(0, 100)
        tpot = (0.03 if pool == "standard" else 0.012) * (1 + load / (300 if pool == "standard" else 60))
        tokens = rng.randint(20, 400)
        learner.observe(Observation(
            pool, segment_of(f.task, f.copy), f.prompt_tokens, load, 0.05, 0.05 + tokens * tpot, tokens,
            1 + 4 * acceptance if pool != "standard" else None, at_s=1.0, content=content_of(f),
        ))  # fmt: skip
    return learner


def probe() -> dict[str, object]:
    features = _features()
    shipped, reference = default_rules(), reference_rules()
    lines = [_line(f) for f, _ in features]
    decisions = []
    for count in (0, 6, 1500):  # cold, warming up (a few samples a pool), warm
        model = _learner(features, count).model(1.0) if count else None
        for running in (0, 3, 40, 200):
            pools = {name: PoolSnapshot(name, 1, 1, running=running + i, waiting=i, inflight=2)
                     for i, name in enumerate(POOL_NAMES)}  # fmt: skip
            snapshot = Snapshot(pools=pools, model=model)
            for f, _ in features:
                for rules in (shipped, reference):
                    decisions.append(repr(_plain(decide(f, snapshot, rules))))
    digest = hashlib.sha256
    return {
        "compiled": compiled_modules(),
        "requests": len(features),
        "features": digest("\n".join(lines).encode()).hexdigest(),
        "decisions": digest("\n".join(decisions).encode()).hexdigest(),
        "decided": len(decisions),
    }


if __name__ == "__main__":
    print(json.dumps(probe()))
