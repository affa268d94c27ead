"""Benchmarks of one real engine: ``specgate bench step-cost`` (an engine's step time against ``k`` and the batch
size, and the emulator's step model fitted to it: ``gateway/bench/step_cost.py``) and ``specgate bench
kv-events`` (vLLM's KV-cache events as a precise prefix index: ``gateway/bench/kv_events.py``).

    specgate bench step-cost --engine URL [--engine URL ...] [--concurrency 1,4,8,16] [--tokens 64]
    specgate bench step-cost --cpu-k 0,1,2,4 [...]      # CPU engines launched here, one at a time

With ``--cpu-k`` each engine is the CPU pool's (``backends/pools/cpu``): ``k = 0`` the standard manifest, any
other ``k`` the speculative one with ``num_speculative_tokens_per_batch_size: [[1, 256, k]]``. Each runs with
its compute threads on the last CPU this process may use, this process (the load) on the others, as
``specgate backends launch --cpu`` gives each pool its own half of the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
from rich.console import Console

from gateway.bench.step_cost import (
    COPY_PROMPT,
    StepCostError,
    StepCostResult,
    fit_result,
    fitted_profile,
    measure,
    measure_engine,
    report,
    to_json,
)
from gateway.cli_bench_compare import int_list
from gateway.signals.vllm_metrics import MetricsParseError


def register(bench_actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``step-cost`` to the ``specgate bench`` sub-commands (see gateway/cli_bench.py)."""
    cmd = bench_actions.add_parser(
        "step-cost", help="an engine's step time against k and batch size, and the emulator's step model fitted"
    )
    source = cmd.add_mutually_exclusive_group(required=True)
    source.add_argument("--engine", action="append", help="a vLLM server's URL (repeatable; one with no "
                        "speculation for the fit; each one's k is read from its counters)")  # fmt: skip
    source.add_argument("--cpu-k", type=int_list(0), help="launch CPU engines with these k, one at a time (0: plain)")
    cmd.add_argument("--concurrency", type=int_list(0), default=[1, 4, 8, 16],
                     help="streams at once (default 1,4,8,16)")  # fmt: skip
    cmd.add_argument("--tokens", type=int, default=64, help="tokens per stream, ignore_eos (default 64)")
    cmd.add_argument("--rounds", type=int, default=2, help="rounds per level (default 2)")
    cmd.add_argument("--prompt", default=COPY_PROMPT, help="the prompt (default: one an n-gram drafter matches)")
    cmd.add_argument("--json", type=Path, help="also write the points and the fit as JSON")
    cmd.add_argument("--profile-out", type=Path, help="write an emulator profile: --base-profile with the fitted "
                     "step costs (for specgate simulate --profile PATH)")  # fmt: skip
    cmd.add_argument("--base-profile", default="cpu-smollm2", help="the profile --profile-out copies (default "
                     "cpu-smollm2: the model the CPU pools run)")  # fmt: skip
    cmd.set_defaults(func=run_step_cost)


def run_step_cost(args: argparse.Namespace) -> int:
    console = Console(width=120)
    if 0 in args.concurrency or args.tokens < 2 or args.rounds < 1:
        console.print("specgate bench step-cost: concurrency >= 1, --tokens >= 2 and --rounds >= 1")
        return 2
    try:
        if args.engine:
            result = measure([url.rstrip("/") for url in args.engine], args.concurrency, args.tokens, args.rounds,
                             args.prompt)  # fmt: skip
        else:
            result = _cpu(args.cpu_k, args.concurrency, args.tokens, args.rounds, args.prompt, console)
    except (StepCostError, OSError, httpx.HTTPError, MetricsParseError) as exc:
        console.print(f"specgate bench step-cost: {exc}")
        return 1
    report(result, console)
    if args.json:
        args.json.write_bytes(orjson.dumps(to_json(result), option=orjson.OPT_INDENT_2))
    if args.profile_out:
        return _write_profile(args, result, console)
    return 0


def _write_profile(args: argparse.Namespace, result: StepCostResult, console: Console) -> int:
    import datetime

    import yaml

    from backends.emulator.profiles import ProfileError, load_profile

    if result.fit is None:
        console.print("specgate bench step-cost: --profile-out needs a fit (a plain engine, k = 0)")
        return 1
    try:
        base = load_profile(args.base_profile)
    except ProfileError as exc:
        console.print(f"specgate bench step-cost: {exc}")
        return 2
    ks = ",".join(str(k) for k in sorted({p.k for p in result.points}))
    batches = ",".join(str(b) for b in sorted({p.batch for p in result.points}))
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    note = f"fitted by specgate bench step-cost ({when}; k {ks} at {batches} streams, {args.tokens} tokens)"
    data = fitted_profile(base, result.fit, note)
    args.profile_out.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    try:
        load_profile(args.profile_out)
    except ProfileError as exc:  # a fit the profile schema refuses (e.g. no per-token cost at all)
        console.print(f"specgate bench step-cost: the fitted profile does not load: {exc}")
        return 1
    console.print(f"wrote {args.profile_out} ({data['name']}): specgate simulate --profile {args.profile_out}")
    return 0


@contextlib.contextmanager
def _pinned(cpus: set[int]) -> Iterator[None]:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _cpu(ks: list[int], batches: list[int], tokens: int, rounds: int, prompt: str, console: Console) -> StepCostResult:
    from backends.cpu_engine import CpuEngine, CpuServer, default_cache_dir
    from backends.manifest import load_manifest, pool_path
    from gateway.servers import free_port

    engine = CpuEngine(default_cache_dir())
    plain, speculative = (load_manifest(pool_path(pool, cpu=True)) for pool in ("standard", "speculative"))
    if speculative.speculative is None:
        raise StepCostError("the CPU speculative manifest has no speculative block")
    cpus = sorted(os.sched_getaffinity(0))
    compute, load = [cpus[-1]], set(cpus[:-1]) or {cpus[-1]}
    result = StepCostResult()
    logs = Path(tempfile.mkdtemp(prefix="specgate-step-cost-"))
    for k in ks:
        if k > speculative.speculative.num_speculative_tokens:
            raise StepCostError(f"k = {k} is above the manifest's num_speculative_tokens")
        pinned = speculative.speculative.model_copy(update={"num_speculative_tokens_per_batch_size": [(1, 256, k)]})
        manifest = plain if k == 0 else speculative.model_copy(update={"speculative": pinned})
        server = CpuServer(engine, manifest, free_port(), logs / f"k{k}.log", cpus=compute)
        console.print(f"k = {k}: starting a CPU engine (compute on CPU {compute[0]}, log {server.log_path})")
        with _pinned(load):
            server.start()
            try:
                server.wait_healthy(300)
                result.points += asyncio.run(measure_engine(server.url, batches, tokens, rounds, prompt))
            finally:
                server.stop()
    if 0 in ks:
        fit_result(result)
    return result



def register_kv_events(bench_actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``kv-events`` to the ``specgate bench`` sub-commands."""
    cmd = bench_actions.add_parser(
        "kv-events", help="vLLM's KV-cache events from a real CPU engine: their cost to consume, and a precise "
        "prefix index built from them against the gateway's approximate one",
    )  # fmt: skip
    cmd.add_argument("--sessions", type=Path, action="append", help="session file or directory (repeatable; "
                     "default: the shipped backends/workloads/sessions)")  # fmt: skip
    cmd.add_argument("--sessions-per-file", type=int, default=3, help="the first N sessions of each file")
    cmd.add_argument("--turns", type=int, default=4, help="at most N turns per conversation (default 4)")
    cmd.add_argument("--concurrency", type=int, default=3, help="conversations in flight at once (default 3)")
    cmd.add_argument("--max-tokens", type=int, default=48, help="max_tokens of every turn (default 48)")
    cmd.add_argument("--json", type=Path, help="also write the figures and every turn as JSON")
    cmd.set_defaults(func=run_kv_events)


def run_kv_events(args: argparse.Namespace) -> int:
    from backends.workloads.loader import WorkloadError
    from gateway.bench import kv_events
    from gateway.bench.sessions import load_conversations

    console = Console(width=130)
    if args.concurrency < 1 or args.max_tokens < 1 or args.turns < 1 or args.sessions_per_file < 1:
        console.print("specgate bench kv-events: --concurrency, --max-tokens, --turns and --sessions-per-file >= 1")
        return 2
    try:
        conversations = load_conversations(args.sessions, args.sessions_per_file, args.turns)
    except WorkloadError as exc:
        console.print(f"specgate bench kv-events: {exc}")
        return 2
    cpus = sorted(os.sched_getaffinity(0))
    config = kv_events.KvEventsConfig(conversations, args.concurrency, args.max_tokens, cpus=cpus[-1:])
    try:
        result = kv_events.bench_kv_events(config, Path(tempfile.mkdtemp(prefix="specgate-kv-events-")))
    except (OSError, httpx.HTTPError, ValueError) as exc:
        console.print(f"specgate bench kv-events: {exc}")
        return 1
    kv_events.report(result, console)
    if args.json:
        args.json.write_bytes(orjson.dumps(kv_events.to_json(result), option=orjson.OPT_INDENT_2))
    return 0
