"""How well the per-request predictor predicts acceptance on requests it did not learn from.

``python -m gateway.adaptive.quality [WORKLOAD.yaml ...]`` (the shipped workload by default): the items are
split in two by a hash of their ids, the predictor learns from the first half (each item seen ``passes``
times, in random order, with the acceptance length a speculative engine would report for it: the mean of
its drafts' accepted tokens, each drawn from the item's per-token acceptance), and is then asked about the
second half. The error is compared with predicting each item's task mean (over the learned half, by the
true task: the best a per-task table could do). Figures come from the workload's ground truth, not from an
engine: what they say depends on whether the workload's acceptance follows its content (in the shipped
workload it is drawn per item at random around its category's mean, so no content can predict it).

``--offline`` adds a reference fitted offline with hindsight, to tell a weak learner from a weak signal: ridge
regression on the learned half's true per-token acceptance less its task's mean, over the predictor's own
slots, with its penalty chosen on the asked half (a large penalty gives the task mean back). It is not a
bound (the predictor learns log acceptance length online, a different fit), but a predictor far behind it
would be leaving signal in its own features.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gateway.adaptive.content import Content, ContentReader
from gateway.adaptive.predictor import Predictor
from gateway.adaptive.suggest_k import per_token_acceptance as rate_of
from gateway.adaptive.suggest_k import tokens_per_step
from gateway.features import Classifier, extract_features
from gateway.rules import RoutingRules, default_rules


class Item(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def acceptance(self) -> float: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def messages(self) -> Sequence[Mapping[str, str]]: ...


@dataclass(frozen=True, slots=True)
class Quality:
    items_learned: int
    items_asked: int
    mae_length: float  # acceptance length (tokens per step), predictor
    mae_length_task: float  # ... predicting the task's mean
    mae_rate: float  # per-token acceptance, predictor
    mae_rate_task: float
    mae_log_tokens: float  # output length (log tokens), predictor
    mae_log_tokens_task: float

    @property
    def gain(self) -> float:
        """How much lower the predictor's acceptance error is than the task mean's (0.3: 30 % lower)."""
        return 1.0 - self.mae_rate / self.mae_rate_task if self.mae_rate_task else 0.0


def reported_length(rng: random.Random, rate: float, k: int, tokens: int) -> float:
    """The mean acceptance length vLLM would report for one request: its drafts' accepted tokens + 1, each
    draft geometric in ``rate`` and truncated at ``k``, over as many drafts as its output needs."""
    steps = max(1, round(tokens / tokens_per_step(rate, k)))
    total = 0
    for _ in range(steps):
        accepted = 0
        while accepted < k and rng.random() < rate:
            accepted += 1
        total += accepted + 1
    return total / steps


def held_out(item_id: str) -> bool:
    return hashlib.blake2b(item_id.encode(), digest_size=2).digest()[0] % 2 == 1


def _prepared(items: Sequence[Item]) -> tuple[list[Content], list[int], list[int], dict[str, list[int]]]:
    """The items' content features, the learned and the asked half (indices), the learned ones by task."""
    rules = default_rules()
    classifier, reader = Classifier(rules), ContentReader()
    contents = [_content(item, rules, classifier, reader) for item in items]
    learned = [i for i, item in enumerate(items) if not held_out(item.id)]
    asked = [i for i, item in enumerate(items) if held_out(item.id)]
    by_task: dict[str, list[int]] = {}
    for i in learned:
        by_task.setdefault(items[i].task, []).append(i)
    return contents, learned, asked, by_task


def _task_length(items: Sequence[Item], peers: Sequence[int], k: int) -> float:
    """The baseline: the mean acceptance length of ``peers`` (the learned items of a request's task)."""
    return statistics.fmean(tokens_per_step(items[j].acceptance, k) for j in peers)


def evaluate(items: Sequence[Item], k: int = 5, passes: int = 20, seed: int = 0) -> Quality:
    contents, learned, asked, by_task = _prepared(items)
    rng, predictor = random.Random(seed), Predictor()
    for _ in range(passes):
        for i in rng.sample(learned, len(learned)):
            item = items[i]
            tokens = min(item.output_tokens, item.max_tokens)
            predictor.observe(contents[i], reported_length(rng, item.acceptance, k, tokens), tokens)
    model = predictor.freeze()
    errors: dict[str, list[float]] = {name: [] for name in ("len", "len_task", "rate", "rate_task", "log", "log_task")}
    for i in asked:
        item = items[i]
        peers = by_task.get(item.task) or learned
        truth = tokens_per_step(item.acceptance, k)
        task_length = _task_length(items, peers, k)
        task_log = statistics.fmean(math.log(min(items[j].output_tokens, items[j].max_tokens)) for j in peers)
        said = model.absolute(contents[i])
        length = min(max(math.exp(said["acc"]), 1.0), k + 1.0)
        errors["len"].append(abs(length - truth))
        errors["len_task"].append(abs(task_length - truth))
        errors["rate"].append(abs(rate_of(length, k) - item.acceptance))
        errors["rate_task"].append(abs(rate_of(task_length, k) - item.acceptance))
        log_tokens = math.log(min(item.output_tokens, item.max_tokens))
        errors["log"].append(abs(said["len"] - log_tokens))
        errors["log_task"].append(abs(task_log - log_tokens))
    mae = {name: statistics.fmean(values) if values else 0.0 for name, values in errors.items()}
    return Quality(len(learned), len(asked), mae["len"], mae["len_task"], mae["rate"], mae["rate_task"],
                   mae["log"], mae["log_task"])  # fmt: skip


@dataclass(frozen=True, slots=True)
class OfflineReference:
    """The offline ridge fit with hindsight (per-token acceptance MAE), beside the task mean's."""

    mae_rate_task: float
    mae_ridge: float
    ridge_penalty: float

    def gain(self, mae: float) -> float:
        return 1.0 - mae / self.mae_rate_task if self.mae_rate_task else 0.0


RIDGE_PENALTIES = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 1e4)


def offline_reference(items: Sequence[Item], k: int = 5) -> OfflineReference:
    """The offline ridge reference on the same split as :func:`evaluate` (see the module's docstring)."""
    import numpy as np  # a report's dependency (numpy comes with matplotlib), never imported on the request path

    contents, learned, asked, by_task = _prepared(items)
    if not learned or not asked:
        raise ValueError("the split needs items on both sides")
    truth = np.array([item.acceptance for item in items])
    rates = {task: rate_of(_task_length(items, peers, k), k) for task, peers in by_task.items()}  # as evaluate's
    overall = rate_of(_task_length(items, learned, k), k)
    base = np.array([rates.get(item.task, overall) for item in items])
    used = sorted({s for i in learned for s in contents[i].slots})  # the segment is the baseline, unpenalised
    column = {slot: c for c, slot in enumerate(used)}
    x = np.zeros((len(items), len(used)))
    for i, content in enumerate(contents):
        for slot in content.slots:
            if slot in column:
                x[i, column[slot]] += 1.0
    x_learned, x_asked = x[learned], x[asked]
    residual, y_asked = truth[learned] - base[learned], truth[asked]
    gram, moment = x_learned.T @ x_learned, x_learned.T @ residual
    ridge = []
    for penalty in RIDGE_PENALTIES:
        weights = np.linalg.solve(gram + penalty * np.eye(len(used)), moment)
        said = np.clip(base[asked] + x_asked @ weights, 0.0, 1.0)
        ridge.append((float(np.abs(said - y_asked).mean()), penalty))
    task_error = float(np.abs(base[asked] - y_asked).mean())
    best, penalty = min(ridge)
    return OfflineReference(task_error, best, penalty)


def _content(item: Item, rules: RoutingRules, classifier: Classifier, reader: ContentReader) -> Content:
    messages = [dict(m) for m in item.messages]
    features = extract_features({"model": "m", "messages": messages, "max_tokens": item.max_tokens}, "chat", {},
                                rules, classifier)  # fmt: skip
    system = next((m["content"] for m in messages if m["role"] in ("system", "developer")), None)
    users = [m["content"] for m in messages if m["role"] == "user"]
    return reader.read(system, users[-1] if users else None, features.task, features.copy, features.prompt_tokens,
                       features.max_tokens, features.n, features.temperature)  # fmt: skip


def main(argv: Sequence[str]) -> int:
    from backends.workloads.loader import load_workload  # the command's I/O, kept out of the pure part

    parser = argparse.ArgumentParser(
        prog="python -m gateway.adaptive.quality",
        description="How well the per-request predictor predicts acceptance on items it did not learn from.",
    )
    parser.add_argument("paths", nargs="*", type=Path, metavar="WORKLOAD",
                        help="workload YAML files or directories of them (default: the shipped development split)")
    parser.add_argument("--offline", action="store_true",
                        help="add the offline ridge reference fitted with hindsight")  # fmt: skip
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        parser.error(f"no such workload file or directory: {', '.join(missing)}")
    offline, paths = args.offline, args.paths
    workload = load_workload([f for p in paths for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p])] or None)
    q = evaluate(workload.items)
    print(f"predictor quality on held-out items ({q.items_learned} learned, {q.items_asked} asked; k = 5)")
    print(f"acceptance length MAE: predictor {q.mae_length:.3f}, task mean {q.mae_length_task:.3f}")
    print(f"per-token acceptance MAE: predictor {q.mae_rate:.4f}, task mean {q.mae_rate_task:.4f} "
          f"({_relation(q.gain)})")
    print(f"output length MAE (log tokens): predictor {q.mae_log_tokens:.3f}, task mean {q.mae_log_tokens_task:.3f}")
    if offline:
        c = offline_reference(workload.items)
        print(f"offline, with hindsight: ridge on the predictor's slots, fitted to the learned half's true acceptance, "
              f"penalty {c.ridge_penalty:g} chosen on the asked half: per-token acceptance MAE {c.mae_ridge:.4f} "
              f"({_relation(c.gain(c.mae_ridge))} than the task mean's {c.mae_rate_task:.4f})")
    return 0


def _relation(gain: float) -> str:
    return f"{gain:.0%} lower" if gain >= 0 else f"{-gain:.0%} higher"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
