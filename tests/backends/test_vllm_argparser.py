"""The rendered argv against the REAL vLLM 0.32.0 argument parser, run in the CPU engine's venv."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from backends.cpu_engine import REPO_ROOT, CpuEngine
from backends.manifest import PoolManifest, load_manifest, pool_path, shipped_manifests
from backends.render import render_argv, speculative_config

pytestmark = pytest.mark.vllm

SHIPPED = shipped_manifests()
IDS = [path.relative_to(pool_path("standard").parent).as_posix() for path in SHIPPED]


@pytest.fixture(scope="module")
def parse(cpu_engine: CpuEngine, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Runs all argvs of one module through one vLLM process (importing vLLM takes ~10 s here)."""
    cache: dict[str, dict[str, Any]] = {}

    def run(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = tmp_path_factory.mktemp("argparse") / "results.json"
        env = {"HF_HUB_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1", "PATH": "/usr/bin:/bin"}
        completed = subprocess.run(
            [str(cpu_engine.python), str(REPO_ROOT / "scripts/vllm_parse_args.py"), str(out)],
            input=json.dumps(requests), capture_output=True, text=True, env=env, timeout=240, check=False)
        assert completed.returncode == 0, completed.stderr[-3000:]
        results: list[dict[str, Any]] = json.loads(out.read_text())
        return results

    def for_manifests(cases: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        missing = {key: case for key, case in cases.items() if key not in cache}
        if missing:
            cache.update(zip(missing, run(list(missing.values())), strict=True))
        return {key: cache[key] for key in cases}

    return for_manifests


def serve_argv(manifest: PoolManifest, version: str = "0.32.0") -> list[str]:
    return render_argv(manifest, version)[1:]  # the parser is `vllm`'s; drop the program name


def dynamic_cpu_manifest(cpu_engine: CpuEngine) -> PoolManifest:
    """The CPU speculative pool with a per-batch-size k table (k = 0 past 4 requests), on the local model."""
    manifest = load_manifest(pool_path("speculative", cpu=True))
    assert manifest.speculative is not None
    spec = manifest.speculative.model_copy(update={"num_speculative_tokens_per_batch_size": [(1, 4, 4), (5, 16, 0)]})
    return manifest.model_copy(update={"model": str(cpu_engine.model_dir(manifest)), "speculative": spec})


def all_cases(cpu_engine: CpuEngine) -> dict[str, dict[str, Any]]:
    cases = {f"current:{i}": {"argv": serve_argv(load_manifest(p))} for i, p in zip(IDS, SHIPPED, strict=True)}
    for pool in ("standard", "speculative"):
        manifest = load_manifest(pool_path(pool, cpu=True))
        local = manifest.model_copy(update={"model": str(cpu_engine.model_dir(manifest))})
        cases[f"engine:{pool}"] = {"argv": serve_argv(local), "engine_config": True}
    for example in ("llama70b-draft8b.yaml", "ngram-qwen14b-tp2.yaml"):
        manifest = load_manifest(pool_path("standard").parent / "examples" / example)
        cases[f"legacy:{example}"] = {"argv": serve_argv(manifest, "0.9.2")}
    cases["engine:dynamic"] = {"argv": serve_argv(dynamic_cpu_manifest(cpu_engine)), "engine_config": True}
    cpu_model = str(cpu_engine.model_dir(load_manifest(pool_path("standard", cpu=True))))
    bad_draft_tp = {"method": "draft_model", "model": cpu_model, "num_speculative_tokens": 3,
                    "draft_tensor_parallel_size": 2}
    cases["draft-tp-2"] = {"argv": ["serve", cpu_model, "--speculative-config", json.dumps(bad_draft_tp)],
                           "engine_config": True}
    return cases


@pytest.mark.parametrize("case", IDS)
def test_current_argv_is_accepted_and_parsed_as_the_manifest_says(
    case: str, parse: Any, cpu_engine: CpuEngine
) -> None:
    result = parse(all_cases(cpu_engine))[f"current:{case}"]
    assert result["accepted"], result
    parsed = result["parsed"]
    manifest = load_manifest(SHIPPED[IDS.index(case)])
    assert parsed["model"] == manifest.model
    assert parsed["served_model_name"] == [manifest.served_model_name]
    assert parsed["tensor_parallel_size"] == manifest.tensor_parallel_size
    assert parsed["pipeline_parallel_size"] == manifest.pipeline_parallel_size
    assert parsed["port"] == manifest.port
    if manifest.max_model_len is not None:
        assert parsed["max_model_len"] == manifest.max_model_len
    if manifest.max_num_seqs is not None:
        assert parsed["max_num_seqs"] == manifest.max_num_seqs
    if manifest.gpu_memory_utilization is not None:
        assert parsed["gpu_memory_utilization"] == manifest.gpu_memory_utilization
    expected_spec = speculative_config(manifest.speculative) if manifest.speculative else None
    assert parsed["speculative_config"] == expected_spec


@pytest.mark.parametrize("pool", ["standard", "speculative"])
def test_cpu_pair_builds_a_full_engine_config(pool: str, parse: Any, cpu_engine: CpuEngine) -> None:
    result = parse(all_cases(cpu_engine))[f"engine:{pool}"]
    assert result["accepted"], result
    assert result["parsed"]["enforce_eager"] is True


def test_a_per_batch_size_k_table_builds_a_full_engine_config(parse: Any, cpu_engine: CpuEngine) -> None:
    result = parse(all_cases(cpu_engine))["engine:dynamic"]
    assert result["accepted"], result
    spec = dynamic_cpu_manifest(cpu_engine).speculative
    assert spec is not None
    assert result["parsed"]["speculative_config"] == speculative_config(spec)
    assert result["parsed"]["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 4, 4], [5, 16, 0]]


@pytest.mark.parametrize("example", ["llama70b-draft8b.yaml", "ngram-qwen14b-tp2.yaml"])
def test_legacy_flags_are_rejected_by_vllm_0_32(example: str, parse: Any, cpu_engine: CpuEngine) -> None:
    result = parse(all_cases(cpu_engine))[f"legacy:{example}"]
    assert result["accepted"] is False and result["stage"] == "argparse"
    assert "unrecognized arguments: --speculative-model" in result["error"]


def test_vllm_rejects_the_draft_tp_our_schema_rejects(parse: Any, cpu_engine: CpuEngine) -> None:
    result = parse(all_cases(cpu_engine))["draft-tp-2"]
    assert result["accepted"] is False and result["stage"] == "engine"
    assert "cannot be other value than 1 or target model tensor_parallel_size" in result["error"]


def test_parser_script_exists() -> None:
    assert Path(REPO_ROOT / "scripts/vllm_parse_args.py").is_file()
