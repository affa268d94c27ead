"""One source of truth: the compose file's vLLM services and the Helm chart's pools are what
`specgate backends render` makes of backends/pools/*.yaml, and both ship rules the gateway accepts."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import main
from gateway.config import Settings
from gateway.rules import RoutingRules, default_rules, load_rules, parse_rules
from tests.deploy.conftest import CHART_DIR, COMPOSE_FILE, REPO_ROOT, load_documents, run_tool

POOLS = ["standard", "speculative"]
# Helm value sets whose speculative pool mirrors a shipped example manifest.
EXAMPLE_SETS = {
    "tp2": "backends/pools/examples/ngram-qwen14b-tp2.yaml",
    "tp4": "backends/pools/examples/llama70b-draft8b.yaml",
}
COMPOSE_KEYS_FROM_RENDERER = ["image", "entrypoint", "command", "environment", "volumes", "shm_size", "healthcheck"]


def specgate_render(pool: str, fmt: str) -> Any:
    """What `specgate backends render POOL --format FMT` prints (the CLI's own entry point, in-process)."""
    return yaml.safe_load(_render_text(pool, fmt))


@functools.cache
def _render_text(pool: str, fmt: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exit_code = main(["backends", "render", pool, "--format", fmt])
    assert exit_code == 0
    return out.getvalue()


def compose_services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    return services


@pytest.mark.parametrize("pool", POOLS)
def test_compose_vllm_services_equal_the_rendered_service(pool: str) -> None:
    (rendered,) = specgate_render(pool, "compose")["services"].values()
    # One replica per pool on one machine; the manifest's replica count is for the cluster (Helm).
    service = compose_services()[f"vllm-{pool}"]
    for key in COMPOSE_KEYS_FROM_RENDERER:
        assert service[key] == rendered[key], f"vllm-{pool}.{key} differs from `specgate backends render`"
    (rendered_device,) = rendered["deploy"]["resources"]["reservations"]["devices"]
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert len(device["device_ids"]) == rendered_device["count"]


@pytest.mark.parametrize("pool", POOLS)
def test_helm_default_values_equal_the_rendered_helm_values(pool: str) -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["pools"][pool] == specgate_render(pool, "helm-values")


@pytest.mark.parametrize("value_set", sorted(EXAMPLE_SETS))
def test_helm_value_sets_equal_the_example_manifests(value_set: str) -> None:
    values = yaml.safe_load((CHART_DIR / "ci" / f"{value_set}-values.yaml").read_text())
    assert values["pools"]["speculative"] == specgate_render(EXAMPLE_SETS[value_set], "helm-values")


def _helm_pool_argv(helm: Path, pool: str, *args: str) -> list[str]:
    result = run_tool([helm, "template", "rel", CHART_DIR, *args])
    assert result.returncode == 0, result.stderr
    deployments = [
        d
        for d in load_documents(result.stdout)
        if d["kind"] == "Deployment" and d["metadata"]["labels"].get("specgate.io/pool") == pool
    ]
    assert deployments
    argvs = [d["spec"]["template"]["spec"]["containers"][0] for d in deployments]
    first = argvs[0]["command"] + argvs[0]["args"]
    assert all(c["command"] + c["args"] == first for c in argvs)
    return [str(part) for part in first]


@pytest.mark.tools
@pytest.mark.parametrize("pool", POOLS)
def test_helm_vllm_command_equals_the_rendered_argv(helm: Path, pool: str) -> None:
    assert _helm_pool_argv(helm, pool) == specgate_render(pool, "argv")


@pytest.mark.tools
@pytest.mark.parametrize("value_set", sorted(EXAMPLE_SETS))
def test_helm_value_set_command_equals_the_example_argv(helm: Path, value_set: str) -> None:
    argv = _helm_pool_argv(helm, "speculative", "-f", str(CHART_DIR / "ci" / f"{value_set}-values.yaml"))
    assert argv == specgate_render(EXAMPLE_SETS[value_set], "argv")


def _without_pools(rules: RoutingRules) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(rules.model_dump_json(exclude={"pools"}))
    return data


def test_compose_rules_are_the_reference_policy_with_the_compose_pools() -> None:
    rules = load_rules(REPO_ROOT / "deploy" / "compose" / "rules.yaml")
    assert _without_pools(rules) == _without_pools(default_rules())
    assert all(len(rules.pools[pool].replicas) >= 1 for pool in POOLS)


@pytest.mark.tools
@pytest.mark.parametrize("value_set", ["default", "tp2", "emulated"])
def test_helm_rules_configmap_is_a_valid_rules_file(helm: Path, value_set: str) -> None:
    extra = [] if value_set == "default" else ["-f", str(CHART_DIR / "ci" / f"{value_set}-values.yaml")]
    result = run_tool([helm, "template", "rel", CHART_DIR, "--show-only", "templates/gateway-configmap.yaml", *extra])
    assert result.returncode == 0, result.stderr
    rules = parse_rules(yaml.safe_load(yaml.safe_load(result.stdout)["data"]["rules.yaml"]), "configmap")
    assert _without_pools(rules) == _without_pools(default_rules())
    for pool in POOLS:
        assert len(rules.pools[pool].replicas) >= 1


def _gateway_environments(helm: Path, docker_compose: Path, compose_env: dict[str, str]) -> list[dict[str, str]]:
    result = run_tool(
        [docker_compose, "--project-directory", REPO_ROOT, "-f", COMPOSE_FILE, "config", "--format", "json"],
        env=compose_env,
    )
    assert result.returncode == 0, result.stderr
    environments = [dict(json.loads(result.stdout)["services"]["gateway"]["environment"])]
    for extra in ([], ["-f", str(CHART_DIR / "ci" / "external-redis-values.yaml")]):
        rendered = run_tool(
            [helm, "template", "rel", CHART_DIR, "--show-only", "templates/gateway-deployment.yaml", *extra]
        )
        assert rendered.returncode == 0, rendered.stderr
        container = yaml.safe_load(rendered.stdout)["spec"]["template"]["spec"]["containers"][0]
        environments.append({e["name"]: e.get("value", "redis://from-secret:6379/0") for e in container["env"]})
    return environments


@pytest.mark.tools
def test_the_gateway_accepts_every_setting_compose_and_helm_pass_it(
    helm: Path, docker_compose: Path, compose_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("gateway.signals") is None:
        pytest.skip("SPECGATE_REDIS_URL/SPECGATE_PROMETHEUS_URL are settings of the signals branch; not merged here")
    for environment in _gateway_environments(helm, docker_compose, compose_env):
        assert {"SPECGATE_RULES_FILE", "SPECGATE_REDIS_URL"} <= set(environment)
        with monkeypatch.context() as patch:
            for key, value in environment.items():
                patch.setenv(key, value)
            settings = Settings()
        assert settings.rules_file == Path("/etc/specgate/rules.yaml")
