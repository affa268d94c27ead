"""``specgate bench compare``: measure the standard and the speculative pool on the same workload.

    specgate bench compare --standard URL --speculative URL --workload FILE [--workload FILE ...]
                           [--concurrency 1,4] [--json OUT] [--plot PNG]
                           [--max-tokens N] [--per-category N] [--model NAME] [--warmup N]

A workload file is one task category: ``category: NAME`` and ``items: [{id, system?, user? | messages?,
max_tokens}]`` (the shipped files under backends/workloads/data/; other keys, such as the emulator's
ground truth, are ignored here: against real servers everything is measured). A directory means every
``*.yaml`` in it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.bench.compare import BenchItem, CompareConfig, compare
from gateway.bench.compare_report import print_table, write_json, write_plot


class WorkloadFileError(ValueError):
    """A workload file this command cannot read."""


def register(bench_actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``compare`` to the ``specgate bench`` sub-commands (see gateway/cli_bench.py)."""
    cmp = bench_actions.add_parser("compare", help="standard vs speculative pool, per task category")
    cmp.add_argument("--standard", required=True, help="base URL of a standard-pool server")
    cmp.add_argument("--speculative", required=True, help="base URL of a speculative-pool server")
    cmp.add_argument(
        "--workload",
        type=Path,
        action="append",
        required=True,
        help="workload file (one category) or directory; repeatable",
    )
    cmp.add_argument("--concurrency", type=int_list(), default=[1, 4], help="comma-separated levels (default 1,4)")
    cmp.add_argument("--json", type=Path, help="write the results as JSON here")
    cmp.add_argument("--plot", type=Path, help="write a PNG plot of the speedups here")
    cmp.add_argument("--max-tokens", type=int, help="cap every request's max_tokens")
    cmp.add_argument("--per-category", type=int, help="use only the first N prompts of each category")
    cmp.add_argument("--model", help="model name to request (default: the standard server's first model)")
    cmp.add_argument("--timeout", type=float, default=300.0, help="seconds per request (default 300)")
    cmp.add_argument("--warmup", type=int, default=1, help="unmeasured requests per pool first (default 1)")
    cmp.set_defaults(func=run_compare)


def int_list(least: int = 1) -> Callable[[str], list[int]]:
    """An argparse type: a comma-separated list of integers, each at least ``least`` (the bench commands')."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(part) for part in text.split(",") if part.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from exc
        if not values or min(values) < least:
            raise argparse.ArgumentTypeError(f"need integers >= {least}: {text!r}")
        return values

    return parse


def load_items(paths: list[Path], per_category: int | None = None) -> list[BenchItem]:
    files = sorted(f for p in paths for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p]))
    items: list[BenchItem] = []
    for path in files:
        found = _file_items(path)
        items.extend(found[:per_category] if per_category else found)
    if not items:
        raise WorkloadFileError(f"no prompts in {', '.join(str(p) for p in paths)}")
    return items


def _file_items(path: Path) -> list[BenchItem]:
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise WorkloadFileError(f"{path}: cannot read: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("category"), str):
        raise WorkloadFileError(f"{path}: expected a mapping with a 'category' name")
    items = []
    for index, item in enumerate(data.get("items") or []):
        where = f"{path}: items.{index}"
        if not isinstance(item, dict) or not isinstance(item.get("max_tokens"), int):
            raise WorkloadFileError(f"{where}: needs an integer max_tokens")
        items.append(
            BenchItem(str(item.get("id", index)), data["category"], _messages(item, where), item["max_tokens"])
        )
    return items


def _messages(item: dict[str, Any], where: str) -> tuple[dict[str, str], ...]:
    if isinstance(item.get("messages"), list):
        return tuple({"role": str(m["role"]), "content": str(m["content"])} for m in item["messages"])
    if not isinstance(item.get("user"), str):
        raise WorkloadFileError(f"{where}: needs 'user' (and optional 'system') or 'messages'")
    system = [{"role": "system", "content": str(item["system"])}] if item.get("system") else []
    return (*system, {"role": "user", "content": item["user"]})


def run_compare(args: argparse.Namespace) -> int:
    try:
        items = load_items(args.workload, args.per_category)
    except WorkloadFileError as exc:
        print(f"specgate bench compare: {exc}", file=sys.stderr)
        return 2
    config = CompareConfig(
        standard_url=args.standard.rstrip("/"),
        speculative_url=args.speculative.rstrip("/"),
        items=items,
        concurrency=args.concurrency,
        model=args.model,
        max_tokens_cap=args.max_tokens,
        timeout_s=args.timeout,
        warmup=args.warmup,
    )
    try:
        results, meta = asyncio.run(compare(config))
    except httpx.HTTPError as exc:
        print(f"specgate bench compare: cannot reach the pools: {exc}", file=sys.stderr)
        return 1
    print_table(results, meta)
    if args.json:
        write_json(args.json, results, meta)
    if args.plot:
        write_plot(args.plot, results, meta)
    failed = sum(r.standard.errors + r.speculative.errors for r in results)
    return 1 if failed else 0
