"""The CPU engine's paths and server command line (no engine needed)."""

from __future__ import annotations

from pathlib import Path

from backends.cpu_engine import CpuEngine, default_cache_dir
from backends.manifest import load_manifest, pool_path


def test_cache_dir_from_environment_or_repo(tmp_path: Path) -> None:
    assert default_cache_dir({"SPECGATE_CACHE": str(tmp_path)}) == tmp_path
    assert default_cache_dir({}).name == ".cache"


def test_server_argv_uses_the_module_entry_point_the_local_model_and_loopback(tmp_path: Path) -> None:
    engine = CpuEngine(tmp_path)
    manifest = load_manifest(pool_path("speculative", cpu=True))
    argv = engine.server_argv(manifest, port=9100)
    assert argv[:3] == [str(tmp_path / "vllm-venv/bin/python"), "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[3:7] == ["--model", str(tmp_path / "models/SmolLM2-135M-Instruct"), "--host", "127.0.0.1"]
    assert argv[argv.index("--port") + 1] == "9100"
    assert argv.count("--port") == 1
    assert "--speculative-config" in argv and "--enforce-eager" in argv


def test_server_env_adds_the_cpu_settings(tmp_path: Path) -> None:
    env = CpuEngine(tmp_path).server_env(load_manifest(pool_path("standard", cpu=True)), base={"PATH": "/bin"})
    assert env == {"PATH": "/bin", "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1",
                   "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_missing_lists_what_is_not_prepared(tmp_path: Path) -> None:
    engine = CpuEngine(tmp_path)
    manifest = load_manifest(pool_path("standard", cpu=True))
    assert len(engine.missing(manifest)) == 2
    (tmp_path / "vllm-venv").mkdir()
    (tmp_path / "vllm-venv/.specgate-ready").touch()
    model = tmp_path / "models/SmolLM2-135M-Instruct"
    model.mkdir(parents=True)
    (model / ".specgate-ready").touch()
    assert engine.missing(manifest) == []
