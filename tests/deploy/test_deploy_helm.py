"""helm/specgate: lint, render for every value set, validate against Kubernetes schemas, and check that
the GPU count, the tensor-parallel size and the speculative flags follow the values."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.manifest import load_manifest
from backends.render import render_helm_values, speculative_config
from tests.deploy.conftest import CHART_DIR, REPO_ROOT, load_documents, run_tool

pytestmark = pytest.mark.tools

VALUE_SETS = ["default", "tp2", "tp4", "tp8", "external-redis", "emulated"]
KUBERNETES_VERSIONS = ["1.30.0", "1.34.0"]
Render = Callable[..., list[dict[str, Any]]]


def values_args(value_set: str) -> list[str]:
    return [] if value_set == "default" else ["-f", str(CHART_DIR / "ci" / f"{value_set}-values.yaml")]


def values_of(value_set: str) -> dict[str, Any]:
    """The effective values (chart defaults merged with the set's file) as helm itself would merge them."""
    merged: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    if value_set != "default":
        _deep_merge(merged, yaml.safe_load((CHART_DIR / "ci" / f"{value_set}-values.yaml").read_text()))
    return merged


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> None:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value


@pytest.fixture(scope="session")
def render(helm: Path) -> Render:
    cache: dict[tuple[str, ...], list[dict[str, Any]]] = {}

    def _render(*args: str) -> list[dict[str, Any]]:
        if args not in cache:
            result = run_tool([helm, "template", "rel", CHART_DIR, "--namespace", "llm", *args])
            assert result.returncode == 0, result.stderr
            cache[args] = load_documents(result.stdout)
        return cache[args]

    return _render


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def pool_deployments(docs: list[dict[str, Any]], pool: str) -> list[dict[str, Any]]:
    return [
        doc
        for name, doc in sorted(by_kind(docs, "Deployment").items())
        if doc["metadata"]["labels"].get("specgate.io/pool") == pool
    ]


def flag_value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_lint_strict(helm: Path, value_set: str) -> None:
    result = run_tool([helm, "lint", "--strict", CHART_DIR, *values_args(value_set)])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("k8s_version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_rendered_manifests_pass_kubernetes_validate_strict(
    render: Render, kubernetes_validate: Path, value_set: str, k8s_version: str
) -> None:
    docs = render(*values_args(value_set))
    core = [doc for doc in docs if not doc["apiVersion"].startswith("monitoring.coreos.com/")]
    stream = yaml.safe_dump_all(core)
    result = run_tool([kubernetes_validate, "--strict", "-k", k8s_version, "--quiet", "-"], stdin=stream)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(core) >= 8


def test_kubernetes_validate_rejects_an_unknown_field(kubernetes_validate: Path) -> None:
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"portz": []}}
    result = run_tool([kubernetes_validate, "--strict", "-k", "1.30.0", "-"], stdin=yaml.safe_dump(bad))
    assert result.returncode != 0


@pytest.mark.parametrize("value_set", ["default", "tp2", "tp4", "tp8", "external-redis"])
def test_gpu_count_tp_flag_shm_and_replicas_follow_the_values(render: Render, value_set: str) -> None:
    docs = render(*values_args(value_set))
    for pool_name, pool in values_of(value_set)["pools"].items():
        deployments = pool_deployments(docs, pool_name)
        assert len(deployments) == pool["replicas"]
        gpus = pool["tensorParallelSize"] * pool.get("pipelineParallelSize", 1)
        for deployment in deployments:
            pod = deployment["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
            assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
            assert flag_value(container["args"], "--tensor-parallel-size") == str(pool["tensorParallelSize"])
            assert container["args"][0] == pool["model"]
            shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
            assert shm == {"medium": "Memory", "sizeLimit": f"{max(8, 4 * gpus)}Gi"}
            assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tensor_parallel_size_set_on_the_command_line_reaches_gpus_and_flag(render: Render, tp: int) -> None:
    docs = render(
        "--set",
        f"pools.speculative.tensorParallelSize={tp}",
        "--set",
        f"pools.speculative.speculative.draftTensorParallelSize={tp}",
    )
    (container,) = pool_deployments(docs, "speculative")[0]["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == tp
    assert flag_value(container["args"], "--tensor-parallel-size") == str(tp)
    config = json.loads(str(flag_value(container["args"], "--speculative-config")))
    assert config["draft_tensor_parallel_size"] == tp


@pytest.mark.parametrize("value_set", ["default", "tp2", "tp4", "tp8"])
def test_speculative_flags_follow_the_values(render: Render, value_set: str) -> None:
    docs = render(*values_args(value_set))
    spec = values_of(value_set)["pools"]["speculative"]["speculative"]
    for deployment in pool_deployments(docs, "speculative"):
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        config = json.loads(str(flag_value(args, "--speculative-config")))
        with_weights = spec["method"] in {"draft_model", "eagle", "eagle3", "medusa"}
        ngram = spec["method"] == "ngram"
        expected = {
            "method": spec["method"],
            "model": spec.get("draftModel") if with_weights else None,
            "num_speculative_tokens": spec["numSpeculativeTokens"],
            "draft_tensor_parallel_size": spec.get("draftTensorParallelSize") if with_weights else None,
            "prompt_lookup_max": spec.get("promptLookupMax") if ngram else None,
            "prompt_lookup_min": spec.get("promptLookupMin") if ngram else None,
        }
        assert config == {key: value for key, value in expected.items() if value is not None}
    for deployment in pool_deployments(docs, "standard"):
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert not [arg for arg in args if arg.startswith("--speculative")]


def test_rules_configmap_lists_every_pool_replica_service(render: Render) -> None:
    docs = render(*values_args("tp2"))
    rules = yaml.safe_load(by_kind(docs, "ConfigMap")["rel-specgate-rules"]["data"]["rules.yaml"])
    services = by_kind(docs, "Service")
    for pool_name in ("standard", "speculative"):
        urls = rules["pools"][pool_name]["replicas"]
        names = [d["metadata"]["name"] for d in pool_deployments(docs, pool_name)]
        assert urls == [f"http://{name}:8000" for name in names]
        for name in names:
            selector = services[name]["spec"]["selector"]
            assert selector["specgate.io/replica"] == name
    assert rules["rules"] == values_of("tp2")["gateway"]["rules"]["rules"]


def test_rules_are_mounted_as_a_directory_so_edits_reload_without_restart(render: Render) -> None:
    gateway = by_kind(render(), "Deployment")["rel-specgate-gateway"]
    pod = gateway["spec"]["template"]["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "rules"]
    assert mount["mountPath"] == "/etc/specgate" and "subPath" not in mount
    assert "--rules" in pod["containers"][0]["args"]
    assert pod["containers"][0]["args"][pod["containers"][0]["args"].index("--rules") + 1] == (
        "/etc/specgate/rules.yaml"
    )
    # A checksum annotation would roll the pods on every rules edit; the reload makes it unnecessary.
    annotations = gateway["spec"]["template"]["metadata"].get("annotations", {})
    assert not any("checksum" in key for key in annotations)


def test_gateway_probes_pdb_and_default_bundled_redis(render: Render) -> None:
    docs = render()
    gateway = by_kind(docs, "Deployment")["rel-specgate-gateway"]
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert by_kind(docs, "PodDisruptionBudget")["rel-specgate-gateway"]["spec"]["minAvailable"] == 1
    env = {e["name"]: e for e in container["env"]}
    assert env["SPECGATE_REDIS_URL"]["value"] == "redis://rel-specgate-redis:6379/0"
    assert "rel-specgate-redis" in by_kind(docs, "Service")
    assert "HorizontalPodAutoscaler" not in {doc["kind"] for doc in docs}


def test_vllm_pods_survive_a_long_model_load_and_read_hf_token_from_a_secret(render: Render) -> None:
    for deployment in pool_deployments(render(), "speculative"):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        probe = container["startupProbe"]
        assert probe["periodSeconds"] * probe["failureThreshold"] >= 600
        (token,) = [e for e in container["env"] if e["name"] == "HF_TOKEN"]
        assert token["valueFrom"]["secretKeyRef"]["name"] == "rel-specgate-hf-token"
        assert deployment["spec"]["strategy"]["type"] == "Recreate"


def test_external_redis_set_scales_on_cpu_and_a_custom_metric(render: Render) -> None:
    docs = render(*values_args("external-redis"))
    assert "rel-specgate-redis" not in by_kind(docs, "Deployment")
    gateway = by_kind(docs, "Deployment")["rel-specgate-gateway"]
    assert "replicas" not in gateway["spec"]  # the HPA owns it
    env = {e["name"]: e for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SPECGATE_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "specgate-redis", "key": "url"}
    assert env["SPECGATE_PROMETHEUS_URL"]["value"] == "http://prometheus-operated.monitoring.svc:9090"
    metrics = by_kind(docs, "HorizontalPodAutoscaler")["rel-specgate-gateway"]["spec"]["metrics"]
    assert [m["type"] for m in metrics] == ["Resource", "Pods"]
    assert metrics[1]["pods"]["metric"]["name"] == "specgate_inflight_requests"
    assert "rel-specgate" in by_kind(docs, "Ingress")


def test_monitors_select_the_gateway_service_and_the_pool_pods(render: Render) -> None:
    docs = render(*values_args("external-redis"))
    service = by_kind(docs, "Service")["rel-specgate"]
    monitor = by_kind(docs, "ServiceMonitor")["rel-specgate-gateway"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pod_monitor = by_kind(docs, "PodMonitor")["rel-specgate-pools"]
    for deployment in pool_deployments(docs, "standard") + pool_deployments(docs, "speculative"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_network_policies_admit_the_gateway_to_pools_and_redis(render: Render) -> None:
    docs = render()
    gateway = by_kind(docs, "Deployment")["rel-specgate-gateway"]
    gateway_labels = gateway["spec"]["template"]["metadata"]["labels"]
    for name in ("rel-specgate-pools", "rel-specgate-redis"):
        peers = by_kind(docs, "NetworkPolicy")[name]["spec"]["ingress"][0]["from"]
        selectors = [p["podSelector"]["matchLabels"] for p in peers if "podSelector" in p]
        assert any(sel.items() <= gateway_labels.items() for sel in selectors)


def test_emulated_set_runs_the_emulator_without_gpus(render: Render) -> None:
    docs = render(*values_args("emulated"))
    assert "nvidia.com/gpu" not in yaml.safe_dump_all(docs)
    assert "PersistentVolumeClaim" not in {doc["kind"] for doc in docs}
    for pool_name in ("standard", "speculative"):
        (deployment,) = pool_deployments(docs, pool_name)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["specgate", "emulate"]
        assert f"--{pool_name}" in container["args"]
        assert container["image"] == "specgate/gateway:0.1.0"


def test_helm_test_hook_posts_a_chat_completion_through_the_gateway(render: Render) -> None:
    pod = by_kind(render(), "Pod")["rel-specgate-test-request"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["args"][0]
    assert "http://rel-specgate:8080/v1/chat/completions" in script
    compile(script, "helm-test", "exec")  # the embedded probe is valid Python


def test_notes_tell_how_to_call_the_gateway(helm: Path, tmp_path: Path) -> None:
    # helm renders NOTES.txt only on install (needs a cluster), so render a copy through tpl.
    chart = tmp_path / "specgate"
    shutil.copytree(CHART_DIR, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "NOTES.preview")
    (chart / "templates" / "notes-preview.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ tpl (.Files.Get "NOTES.preview") . | quote }}}\n'
    )
    result = run_tool([helm, "template", "rel", chart, "--show-only", "templates/notes-preview.yaml"])
    assert result.returncode == 0, result.stderr
    notes = yaml.safe_load(result.stdout)["data"]["notes"]
    assert "port-forward svc/rel-specgate 8080:8080" in notes
    assert "OPENAI_BASE_URL=http://127.0.0.1:8080/v1" in notes
    assert "helm test rel" in notes


def test_dashboard_configmap_carries_the_dashboard_for_the_grafana_sidecar(render: Render) -> None:
    configmap = by_kind(render(*values_args("external-redis")), "ConfigMap")["rel-specgate-dashboard"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART_DIR.parents[1] / "deploy" / "grafana" / "dashboards" / "specgate.json").read_text())
    assert json.loads(configmap["data"]["specgate.json"]) == shipped
    assert "rel-specgate-dashboard" not in by_kind(render(), "ConfigMap")


def test_gateway_drains_streams_before_it_stops(render: Render) -> None:
    pod = by_kind(render(), "Deployment")["rel-specgate-gateway"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 60
    assert pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    sleep = int(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    grace = float(env["SPECGATE_SHUTDOWN_GRACE_S"])  # the gateway's own drain fits in what the kubelet allows
    assert grace > 0 and sleep + grace < pod["terminationGracePeriodSeconds"]
    assert grace == pod["terminationGracePeriodSeconds"] - sleep - 5


def test_no_pod_gets_service_link_variables_that_look_like_settings(helm: Path) -> None:
    # Release "specgate" names the gateway Service "specgate"; with service links the kubelet would set
    # SPECGATE_PORT=tcp://... in every pod of the namespace, which the gateway reads as its port setting.
    result = run_tool([helm, "template", "specgate", CHART_DIR])
    assert result.returncode == 0, result.stderr
    docs = load_documents(result.stdout)
    assert "specgate" in by_kind(docs, "Service")
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
    pods += [d["spec"] for d in docs if d["kind"] == "Pod"]
    assert pods and all(pod["enableServiceLinks"] is False for pod in pods)


def test_the_service_monitor_sends_the_admin_token_when_metrics_need_it(render: Render) -> None:
    monitor = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "gateway.auth.adminTokenSecret=specgate-admin"]
    open_metrics = by_kind(render(*monitor), "ServiceMonitor")["rel-specgate-gateway"]["spec"]["endpoints"][0]
    assert "authorization" not in open_metrics
    docs = render(*monitor, "--set", "gateway.auth.metricsNeedAdmin=true")
    endpoint = by_kind(docs, "ServiceMonitor")["rel-specgate-gateway"]["spec"]["endpoints"][0]
    secret = {"name": "specgate-admin", "key": "admin-token"}
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": secret}
    container = by_kind(docs, "Deployment")["rel-specgate-gateway"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["SPECGATE_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == secret  # the token the gateway checks


def test_keys_admin_token_and_pool_keys_come_from_secrets(render: Render) -> None:
    default = by_kind(render(), "Deployment")["rel-specgate-gateway"]["spec"]["template"]["spec"]
    names = {e["name"] for e in default["containers"][0]["env"]}
    assert not names & {"SPECGATE_KEYS_FILE", "SPECGATE_ADMIN_TOKEN", "SPECGATE_STANDARD_API_KEY"}  # open
    docs = render(*values_args("external-redis"))
    spec = by_kind(docs, "Deployment")["rel-specgate-gateway"]["spec"]["template"]["spec"]
    container = spec["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["SPECGATE_KEYS_FILE"]["value"] == "/etc/specgate-keys/keys.yaml"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "keys")
    assert mount == {"name": "keys", "mountPath": "/etc/specgate-keys", "readOnly": True}
    volume = next(v for v in spec["volumes"] if v["name"] == "keys")
    assert volume["secret"]["secretName"] == "specgate-keys"
    assert env["SPECGATE_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "specgate-admin", "key": "admin-token"}
    for pool in ("STANDARD", "SPECULATIVE"):
        ref = env[f"SPECGATE_{pool}_API_KEY"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "specgate-vllm-keys", "key": pool.lower(), "optional": True}
    test_pod = by_kind(docs, "Pod")["rel-specgate-test-request"]["spec"]["containers"][0]
    assert test_pod["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "specgate-test-key", "key": "api-key"}
    assert not any("value" in e for e in env.values() if "KEY" in e["name"] and e["name"] != "SPECGATE_KEYS_FILE")


def test_a_per_batch_size_k_table_reaches_the_speculative_config(render: Render, tmp_path: Path) -> None:
    """The dynamic example manifest's Helm values render to the same --speculative-config as its argv."""
    manifest = load_manifest(REPO_ROOT / "backends/pools/examples/dynamic-eagle3-llama8b.yaml")
    assert manifest.speculative is not None
    values = tmp_path / "dynamic-values.yaml"
    values.write_text(yaml.safe_dump({"pools": {"speculative": render_helm_values(manifest)}}))
    for deployment in pool_deployments(render("-f", str(values)), "speculative"):
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        config = json.loads(str(flag_value(args, "--speculative-config")))
        assert config == speculative_config(manifest.speculative)
        assert config["num_speculative_tokens_per_batch_size"][-1] == [97, 128, 0]
