"""The CPU engine's paths and server command line (no engine needed)."""

from __future__ import annotations

import os
from pathlib import Path

from backends.cpu_engine import OMP_BIND, CpuEngine, cpu_fleet, cpu_pair, default_cache_dir, split_cpus
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


def test_split_cpus_gives_each_pool_its_own_disjoint_half() -> None:
    assert split_cpus({1, 0}) == [(0,), (1,)]
    assert split_cpus(range(5)) == [(0, 1, 2), (3, 4)]
    assert split_cpus({3, 7, 5, 1}) == [(1, 3), (5, 7)]
    assert split_cpus({0}) == [(), ()]  # one CPU: nothing to split, vLLM binds as it likes


def test_server_env_binds_the_compute_threads_unless_already_bound(tmp_path: Path) -> None:
    engine, manifest = CpuEngine(tmp_path), load_manifest(pool_path("speculative", cpu=True))
    assert engine.server_env(manifest, base={}, cpus=(2, 3))[OMP_BIND] == "2,3"
    assert OMP_BIND not in engine.server_env(manifest, base={})
    assert engine.server_env(manifest, base={OMP_BIND: "nobind"}, cpus=(2, 3))[OMP_BIND] == "nobind"


def test_a_cpu_pair_puts_the_two_pools_on_different_cpus(tmp_path: Path) -> None:
    manifests = (load_manifest(pool_path("standard", cpu=True)), load_manifest(pool_path("speculative", cpu=True)))
    pair = cpu_pair(CpuEngine(tmp_path), manifests, (9100, 9101), tmp_path)
    available = os.sched_getaffinity(0)
    if len(available) < 2:
        assert pair.standard.cpus == pair.speculative.cpus == ()
    else:
        assert pair.standard.cpus and pair.speculative.cpus
        assert not set(pair.standard.cpus) & set(pair.speculative.cpus)
        assert set(pair.standard.cpus) | set(pair.speculative.cpus) == available


def test_a_cpu_fleet_gives_each_pool_its_replicas_on_its_own_ports_and_cpus(tmp_path: Path) -> None:
    manifests = (load_manifest(pool_path("standard", cpu=True)), load_manifest(pool_path("speculative", cpu=True)))
    fleet = cpu_fleet(CpuEngine(tmp_path), manifests, 2, tmp_path)
    standard, speculative = fleet.pools["standard"], fleet.pools["speculative"]
    assert [s.port for s in standard] == [manifests[0].port, manifests[0].port + 2]
    assert [s.port for s in speculative] == [manifests[1].port, manifests[1].port + 2]
    assert len({s.port for s in fleet.servers}) == 4 and len({s.log_path for s in fleet.servers}) == 4
    assert standard[0].cpus == standard[1].cpus and speculative[0].cpus == speculative[1].cpus
    if len(os.sched_getaffinity(0)) >= 2:
        assert not set(standard[0].cpus) & set(speculative[0].cpus)
