"""The renderer: argv for a pinned vLLM version, shell, compose and Helm values, all from one manifest."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from backends.manifest import PoolManifest, load_manifest, pool_path, shipped_manifests
from backends.render import (
    RenderError,
    parse_version,
    render_argv,
    render_compose_service,
    render_engine_args,
    render_helm_values,
    render_shell,
    speculative_config,
    uses_speculative_config,
)

SHIPPED = shipped_manifests()
IDS = [path.relative_to(pool_path("standard").parent).as_posix() for path in SHIPPED]


def flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_cpu_speculative_argv_golden() -> None:
    assert render_argv(load_manifest(pool_path("speculative", cpu=True))) == [
        "vllm", "serve", "HuggingFaceTB/SmolLM2-135M-Instruct",
        "--served-model-name", "smollm2-135m-instruct",
        "--max-model-len", "2048",
        "--max-num-seqs", "16",
        "--port", "8102",
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2}',
        "--enforce-eager", "--dtype", "bfloat16", "--per-request-spec-decode-metrics", "summary",
    ]


def test_seventy_b_argv_golden_current_and_legacy() -> None:
    manifest = load_manifest(pool_path("standard").parent / "examples" / "llama70b-draft8b.yaml")
    common = [
        "vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct",
        "--served-model-name", "llama-3.1-70b-instruct",
        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "1",
        "--gpu-memory-utilization", "0.9", "--max-model-len", "8192", "--max-num-seqs", "64", "--port", "8000",
    ]
    assert render_argv(manifest, "0.32.0") == [
        *common, "--speculative-config",
        '{"method":"draft_model","model":"meta-llama/Llama-3.1-8B-Instruct",'
        '"num_speculative_tokens":5,"draft_tensor_parallel_size":1}',
        "--enable-prefix-caching",
    ]
    assert render_argv(manifest, "0.9.2") == [
        *common, "--speculative-model", "meta-llama/Llama-3.1-8B-Instruct", "--num-speculative-tokens", "5",
        "--speculative-draft-tensor-parallel-size", "1", "--enable-prefix-caching",
    ]


@pytest.mark.parametrize("path", SHIPPED, ids=IDS)
def test_argv_carries_every_manifest_field(path: Path) -> None:
    manifest = load_manifest(path)
    argv = render_argv(manifest)
    assert argv[:3] == ["vllm", "serve", manifest.model]
    assert flag_value(argv, "--served-model-name") == manifest.served_model_name
    assert flag_value(argv, "--port") == str(manifest.port)
    if manifest.device == "gpu":
        assert flag_value(argv, "--tensor-parallel-size") == str(manifest.tensor_parallel_size)
        assert flag_value(argv, "--pipeline-parallel-size") == str(manifest.pipeline_parallel_size)
    else:
        assert "--tensor-parallel-size" not in argv
    for flag, value in (("--max-model-len", manifest.max_model_len), ("--max-num-seqs", manifest.max_num_seqs),
                        ("--gpu-memory-utilization", manifest.gpu_memory_utilization)):
        assert flag_value(argv, flag) == (None if value is None else str(value))
    assert argv[len(argv) - len(manifest.extra_args):] == manifest.extra_args
    config = flag_value(argv, "--speculative-config")
    if manifest.speculative is None:
        assert config is None
    else:
        assert config is not None and json.loads(config) == speculative_config(manifest.speculative)
        assert json.loads(config)["num_speculative_tokens"] == manifest.speculative.num_speculative_tokens


GPU = [(path, name) for path, name in zip(SHIPPED, IDS, strict=True) if not name.startswith("cpu/")]


@pytest.mark.parametrize("path", [path for path, _ in GPU], ids=[name for _, name in GPU])
def test_compose_and_helm_agree_with_argv(path: Path) -> None:
    manifest = load_manifest(path)
    argv = render_argv(manifest, "0.32.0")
    service = render_compose_service(manifest, "0.32.0")
    assert service["image"] == "vllm/vllm-openai:v0.32.0"
    assert [*service["entrypoint"], *service["command"]] == argv
    assert service["deploy"]["replicas"] == manifest.replicas
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": manifest.gpus_per_replica, "capabilities": ["gpu"]}
    assert device["count"] == int(str(flag_value(argv, "--tensor-parallel-size"))) * int(
        str(flag_value(argv, "--pipeline-parallel-size")))
    assert f"localhost:{manifest.port}/health" in " ".join(service["healthcheck"]["test"])
    assert service["environment"]["HF_TOKEN"] == "${HF_TOKEN:-}"
    assert service["volumes"] == ["hf-cache:/root/.cache/huggingface"]

    values = render_helm_values(manifest)
    assert values["model"] == argv[2]
    assert values["servedModelName"] == flag_value(argv, "--served-model-name")
    assert values["tensorParallelSize"] == manifest.tensor_parallel_size
    assert values["replicas"] == manifest.replicas
    assert values["extraArgs"] == manifest.extra_args
    spec = manifest.speculative
    if spec is None:
        assert "speculative" not in values
    else:
        config = json.loads(str(flag_value(argv, "--speculative-config")))
        helm = values["speculative"]
        assert (helm["method"], helm["draftModel"], helm["numSpeculativeTokens"]) == (
            config["method"], config.get("model"), config["num_speculative_tokens"])
        assert helm["draftTensorParallelSize"] == config.get("draft_tensor_parallel_size")
        assert (helm["promptLookupMin"], helm["promptLookupMax"]) == (
            config.get("prompt_lookup_min"), config.get("prompt_lookup_max"))


@pytest.mark.parametrize("pool", ["standard", "speculative"])
def test_cpu_manifests_do_not_render_to_gpu_deployments(pool: str) -> None:
    manifest = load_manifest(pool_path(pool, cpu=True))
    for render in (render_compose_service, render_helm_values):
        with pytest.raises(RenderError, match="launch --cpu"):
            render(manifest)


def test_helm_values_have_exactly_the_agreed_keys() -> None:
    values = render_helm_values(load_manifest(pool_path("speculative")))
    assert set(values) == {"model", "servedModelName", "tensorParallelSize", "pipelineParallelSize", "replicas",
                           "gpuType", "gpuMemoryUtilization", "maxModelLen", "maxNumSeqs", "extraArgs",
                           "speculative"}
    assert set(values["speculative"]) == {"method", "draftModel", "numSpeculativeTokens",
                                          "draftTensorParallelSize", "promptLookupMin", "promptLookupMax"}


def test_compose_shm_grows_with_the_gpus_of_a_replica() -> None:
    tp4 = load_manifest(pool_path("standard").parent / "examples" / "llama70b-draft8b.yaml")
    tp1 = load_manifest(pool_path("standard"))
    assert render_compose_service(tp4)["shm_size"] == "16gb"
    assert render_compose_service(tp1)["shm_size"] == "8gb"


@pytest.mark.parametrize("path", SHIPPED, ids=IDS)
def test_shell_splits_back_into_env_and_argv(path: Path) -> None:
    manifest = load_manifest(path)
    words = shlex.split(render_shell(manifest).replace("\\\n", " "))
    env_words = [f"{key}={value}" for key, value in sorted(manifest.env.items())]
    assert words == [*env_words, *render_argv(manifest)]


def _ngram_tp2() -> PoolManifest:
    return load_manifest(pool_path("standard").parent / "examples" / "ngram-qwen14b-tp2.yaml")


def test_legacy_ngram_flags() -> None:
    args = render_engine_args(_ngram_tp2(), "0.8.4")
    assert "--speculative-config" not in args
    start = args.index("--speculative-model")
    assert args[start:start + 8] == ["--speculative-model", "[ngram]", "--num-speculative-tokens", "4",
                                     "--ngram-prompt-lookup-max", "4", "--ngram-prompt-lookup-min", "2"]


@pytest.mark.parametrize("example", ["eagle3-llama8b.yaml", "mtp-mimo7b.yaml"])
def test_methods_newer_than_the_legacy_flags_refuse_to_render(example: str) -> None:
    manifest = load_manifest(pool_path("standard").parent / "examples" / example)
    with pytest.raises(RenderError, match=r"needs vLLM >= 0\.10"):
        render_argv(manifest, "0.9.2")
    assert "--speculative-config" in render_argv(manifest, "0.10.0")


@pytest.mark.parametrize(("text", "parsed", "json_config"), [
    ("0.32.0", (0, 32, 0), True), ("v0.10.1", (0, 10, 1), True), ("0.10", (0, 10, 0), True),
    ("0.9.2", (0, 9, 2), False), ("0.6.3.post1", (0, 6, 3), False), ("0.11.0rc1", (0, 11, 0), True),
    ("1.0.0+cpu", (1, 0, 0), True),
])
def test_parse_version(text: str, parsed: tuple[int, int, int], json_config: bool) -> None:
    assert parse_version(text) == parsed
    assert uses_speculative_config(text) is json_config


@pytest.mark.parametrize("text", ["latest", "", "0", "x.y.z"])
def test_parse_version_rejects_garbage(text: str) -> None:
    with pytest.raises(RenderError, match="not a vLLM version"):
        parse_version(text)


DYNAMIC = pool_path("standard").parent / "examples" / "dynamic-eagle3-llama8b.yaml"


def test_a_per_batch_size_k_table_goes_into_the_speculative_config_json() -> None:
    manifest = load_manifest(DYNAMIC)
    config = json.loads(str(flag_value(render_argv(manifest), "--speculative-config")))
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 16, 3], [17, 48, 2], [49, 96, 1], [97, 128, 0]]
    assert config["num_speculative_tokens"] == 3
    helm = render_helm_values(manifest)["speculative"]
    assert helm["numSpeculativeTokensPerBatchSize"] == config["num_speculative_tokens_per_batch_size"]


def test_a_manifest_without_a_table_renders_no_table_key() -> None:
    manifest = load_manifest(pool_path("speculative"))
    assert "num_speculative_tokens_per_batch_size" not in json.loads(
        str(flag_value(render_argv(manifest), "--speculative-config")))  # fmt: skip
    assert "numSpeculativeTokensPerBatchSize" not in render_helm_values(manifest)["speculative"]


@pytest.mark.parametrize("version", ["0.9.2", "0.20.0"])
def test_a_k_table_is_refused_for_vllm_before_0_32(version: str) -> None:
    with pytest.raises(RenderError, match=r"needs vLLM >= 0\.32"):
        render_argv(load_manifest(DYNAMIC), version)
