"""docker-compose.yml: `docker compose config -q` per profile (and failing for broken variants), the
default profile, GPU reservations per pool replica, the rules directory mount and the pool aliases."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import Settings
from tests.deploy.conftest import COMPOSE_FILE, REPO_ROOT, run_tool

pytestmark = pytest.mark.tools

PROFILES = ["emulated", "gpu"]


def compose(docker_compose: Path, env: dict[str, str], *args: str, file: Path = COMPOSE_FILE) -> Any:
    return run_tool([docker_compose, "--project-directory", REPO_ROOT, "-f", file, *args], env=env)


def resolved(docker_compose: Path, env: dict[str, str], profile: str) -> dict[str, Any]:
    result = compose(docker_compose, env, "--profile", profile, "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = json.loads(result.stdout)
    return config


def raw_compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


@pytest.mark.parametrize("profile", PROFILES)
def test_config_is_valid_for_each_profile(docker_compose: Path, compose_env: dict[str, str], profile: str) -> None:
    result = compose(docker_compose, compose_env, "--profile", profile, "config", "-q")
    assert result.returncode == 0, result.stderr


def _services(docker_compose: Path, env: dict[str, str], *args: str) -> set[str]:
    result = compose(docker_compose, env, *args, "config", "--services")
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


CORE = {"gateway", "redis", "prometheus", "grafana"}
EMULATORS = {"emulator-standard", "emulator-speculative"}
VLLM = {"vllm-standard", "vllm-speculative"}


def test_each_profile_selects_its_own_pools(docker_compose: Path, compose_env: dict[str, str]) -> None:
    assert _services(docker_compose, compose_env, "--profile", "emulated") == CORE | EMULATORS
    assert _services(docker_compose, compose_env, "--profile", "gpu") == CORE | VLLM


def test_default_profile_is_emulated_and_gpu_overrides_it(docker_compose: Path, compose_env: dict[str, str]) -> None:
    assert _services(docker_compose, compose_env) == CORE | EMULATORS  # .env: COMPOSE_PROFILES=emulated
    assert _services(docker_compose, {**compose_env, "COMPOSE_PROFILES": "gpu"}) == CORE | VLLM


def test_the_compose_env_file_does_not_disturb_the_gateway_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)  # where both docker compose and the gateway's settings read .env
    assert (REPO_ROOT / ".env").is_file()
    assert Settings().port == 8080


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value

    return mutate


BROKEN = [
    ("unknown-service-key", _set("services.gateway.replicaz", 2), "'replicaz' not allowed"),
    (
        "depends-on-missing-service",
        _set("services.gateway.depends_on", {"cache": {"condition": "service_healthy"}}),
        'undefined service "cache"',
    ),
    (
        "gpu-count-not-a-number",
        _set(
            "services.vllm-standard.deploy.resources.reservations.devices",
            [{"driver": "nvidia", "count": "two", "capabilities": ["gpu"]}],
        ),
        "devices[0].count",
    ),
    (
        "healthcheck-bad-duration",
        _set("services.vllm-speculative.healthcheck.interval", "fifteen seconds"),
        "invalid duration",
    ),
    (
        "undeclared-named-volume",
        _set("volumes", {"prometheus-data": {}, "grafana-data": {}}),
        "undefined volume hf-cache",
    ),
    ("bad-port", _set("services.gateway.ports", ["80800:8080"]), "invalid hostPort"),
]


@pytest.mark.parametrize(("mutate", "error"), [(m, e) for _, m, e in BROKEN], ids=[i for i, _, _ in BROKEN])
def test_config_fails_for_a_broken_variant(
    docker_compose: Path,
    compose_env: dict[str, str],
    tmp_path: Path,
    mutate: Callable[[dict[str, Any]], None],
    error: str,
) -> None:
    data = copy.deepcopy(raw_compose())
    mutate(data)
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(data, sort_keys=False))
    result = compose(docker_compose, compose_env, "--profile", "gpu", "config", "-q", file=broken)
    assert result.returncode != 0, "docker compose accepted a broken file"
    assert error in result.stderr


def test_unmodified_copy_still_passes(docker_compose: Path, compose_env: dict[str, str], tmp_path: Path) -> None:
    # The broken-variant tests only mean something if the same round trip of the good file passes.
    copy_file = tmp_path / "docker-compose.yml"
    copy_file.write_text(yaml.safe_dump(raw_compose(), sort_keys=False))
    result = compose(docker_compose, compose_env, "--profile", "gpu", "config", "-q", file=copy_file)
    assert result.returncode == 0, result.stderr


def _flag(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_each_vllm_replica_reserves_its_own_gpus_per_tensor_parallel_size(
    docker_compose: Path, compose_env: dict[str, str]
) -> None:
    services = resolved(docker_compose, compose_env, "gpu")["services"]
    vllm = {name: svc for name, svc in services.items() if name.startswith("vllm-")}
    assert vllm
    seen: list[str] = []
    for name, service in vllm.items():
        command = service["command"]
        gpus = int(_flag(command, "--tensor-parallel-size")) * int(_flag(command, "--pipeline-parallel-size"))
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert len(device["device_ids"]) == gpus, name
        assert "count" not in device, f"{name}: count gives every container the first N GPUs"
        seen += device["device_ids"]
        assert int(service["shm_size"]) >= max(8, 4 * gpus) * 1024**3
        assert service["volumes"][0]["source"] == "hf-cache"
        assert "/health" in " ".join(service["healthcheck"]["test"])
    assert len(seen) == len(set(seen)), f"GPU ids reserved twice: {sorted(seen)}"


def test_hf_token_comes_from_the_environment(docker_compose: Path, compose_env: dict[str, str]) -> None:
    env = {**compose_env, "HF_TOKEN": "hf_from_shell"}
    services = resolved(docker_compose, env, "gpu")["services"]
    assert services["vllm-speculative"]["environment"]["HF_TOKEN"] == "hf_from_shell"


@pytest.mark.parametrize("profile", PROFILES)
def test_every_replica_in_the_rules_file_has_a_service_in_each_profile(
    docker_compose: Path, compose_env: dict[str, str], profile: str
) -> None:
    rules = yaml.safe_load((REPO_ROOT / "deploy" / "compose" / "rules.yaml").read_text())
    services = resolved(docker_compose, compose_env, profile)["services"]
    aliases = {
        alias
        for svc in services.values()
        for alias in ((svc.get("networks") or {}).get("default") or {}).get("aliases", [])
    }
    for pool in ("standard", "speculative"):
        for url in rules["pools"][pool]["replicas"]:
            host = url.split("//", 1)[1].split(":", 1)[0]
            assert host in aliases, f"{url}: no {profile} service answers to {host}"


def test_rules_directory_is_mounted_so_edits_reload(docker_compose: Path, compose_env: dict[str, str]) -> None:
    gateway = resolved(docker_compose, compose_env, "emulated")["services"]["gateway"]
    (mount,) = [v for v in gateway["volumes"] if v["target"] == "/etc/specgate"]
    assert mount["type"] == "bind" and Path(mount["source"]).is_dir()
    assert (Path(mount["source"]) / "rules.yaml").is_file()
    assert gateway["command"][:3] == ["serve", "--rules", "/etc/specgate/rules.yaml"]
    assert gateway["environment"]["SPECGATE_REDIS_URL"] == "redis://redis:6379/0"
    assert gateway["environment"]["SPECGATE_PROMETHEUS_URL"] == "http://prometheus:9090"


def test_monitoring_mounts_point_at_the_repository_folders(docker_compose: Path, compose_env: dict[str, str]) -> None:
    services = resolved(docker_compose, compose_env, "emulated")["services"]
    mounts = {
        (name, v["target"]): v["source"]
        for name, svc in services.items()
        for v in svc.get("volumes", [])
        if v["type"] == "bind"
    }
    assert mounts[("prometheus", "/etc/prometheus")] == str(REPO_ROOT / "deploy" / "prometheus")
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    grafana = REPO_ROOT / "deploy" / "grafana"
    assert mounts[("grafana", "/etc/grafana/provisioning")] == str(grafana / "provisioning")
    assert mounts[("grafana", "/var/lib/grafana/dashboards")] == str(grafana / "dashboards")
    provider = yaml.safe_load((grafana / "provisioning" / "dashboards" / "specgate.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_emulators_run_the_gateway_image(docker_compose: Path, compose_env: dict[str, str]) -> None:
    services = resolved(docker_compose, compose_env, "emulated")["services"]
    for pool in ("standard", "speculative"):
        command = services[f"emulator-{pool}"]["command"]
        assert services[f"emulator-{pool}"]["image"] == services["gateway"]["image"]
        assert command[0] == "emulate" and f"--{pool}" in command
        assert _flag(command, "--host") == "0.0.0.0" and _flag(command, "--port") == "8000"


def test_prometheus_scrape_targets_are_compose_services(docker_compose: Path, compose_env: dict[str, str]) -> None:
    config_file = REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml"
    if not config_file.is_file():
        pytest.skip("deploy/prometheus/prometheus.yml is written on the signals branch; not merged here yet")
    hosts = set()
    for profile in PROFILES:
        for name, service in resolved(docker_compose, compose_env, profile)["services"].items():
            hosts.add(name)
            hosts.update(((service.get("networks") or {}).get("default") or {}).get("aliases", []))
    config = yaml.safe_load(config_file.read_text())
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                assert target.rsplit(":", 1)[0] in hosts, f"{job['job_name']}: {target} is no compose service"


def test_compose_variables_stay_out_of_the_gateway_namespace() -> None:
    # The gateway rejects unknown SPECGATE_* variables at start-up; a compose knob exported in the same
    # shell (SPECGATE_TAG=...) would break `specgate serve` there.
    variables = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", COMPOSE_FILE.read_text()))
    assert variables, "no variables found: the pattern is wrong"
    assert not {name for name in variables if name.startswith("SPECGATE_")}


def test_only_the_gateway_port_is_published_on_all_interfaces(
    docker_compose: Path, compose_env: dict[str, str]
) -> None:
    services = resolved(docker_compose, compose_env, "gpu")["services"]
    published = {name: port for name, svc in services.items() for port in svc.get("ports", [])}
    assert set(published) == {"gateway", "prometheus", "grafana"}
    assert published["prometheus"]["host_ip"] == published["grafana"]["host_ip"] == "127.0.0.1"
    assert published["gateway"]["published"] == "8080"


def test_gateway_reads_its_secrets_from_an_optional_env_file(
    docker_compose: Path, compose_env: dict[str, str], tmp_path: Path
) -> None:
    """No file: valid and open. With one (here a copy of the project next to a secrets file): the keys arrive."""
    assert raw_compose()["services"]["gateway"]["env_file"] == [{"path": "./specgate-secrets.env", "required": False}]
    project = tmp_path / "project"
    project.mkdir()
    (project / "specgate-secrets.env").write_text("SPECGATE_ADMIN_TOKEN=adm-1\nSPECGATE_KEYS={keys: []}\n")
    result = run_tool(
        [docker_compose, "--project-directory", project, "-f", COMPOSE_FILE, "--profile", "emulated", "config",
         "--format", "json"], env=compose_env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    environment = json.loads(result.stdout)["services"]["gateway"]["environment"]
    assert environment["SPECGATE_ADMIN_TOKEN"] == "adm-1" and environment["SPECGATE_KEYS"] == "{keys: []}"
