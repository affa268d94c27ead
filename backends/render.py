"""Render a :class:`~backends.manifest.PoolManifest` for a pinned vLLM version. Pure functions, no I/O.

One source, several outputs (tests check that they agree):

``render_engine_args(manifest, vllm_version) -> list[str]``
    The engine flags alone, without the program or the model: ``["--served-model-name", NAME,
    "--tensor-parallel-size", "4", ..., "--speculative-config", JSON, *extra_args]``.
    vLLM >= 0.10 gets ``--speculative-config '<json>'`` with keys ``method``, ``model`` (the draft),
    ``num_speculative_tokens``, ``draft_tensor_parallel_size``, ``prompt_lookup_min``, ``prompt_lookup_max``
    and ``num_speculative_tokens_per_batch_size`` (a list of ``[from, to, k]``, vLLM >= 0.32 only: versions
    before it raise :class:`RenderError`) (unset keys omitted). Older versions get the legacy flags
    ``--speculative-model`` (``[ngram]`` for n-gram),
    ``--num-speculative-tokens``, ``--speculative-draft-tensor-parallel-size``, ``--ngram-prompt-lookup-max``
    and ``--ngram-prompt-lookup-min``; methods those versions cannot express (eagle3, mtp, suffix) raise
    :class:`RenderError`.

``render_argv(manifest, vllm_version) -> list[str]``
    ``["vllm", "serve", MODEL, *render_engine_args(...)]``.

``render_shell(manifest, vllm_version) -> str``
    The same command for a POSIX shell, one flag per line, the manifest's ``env`` as ``VAR=value`` prefixes.

``render_compose_service(manifest, vllm_version=..., model_cache_volume="hf-cache") -> dict``
    A docker-compose service for the ``vllm/vllm-openai:v<version>`` image::

        image: vllm/vllm-openai:v0.32.0
        entrypoint: ["vllm", "serve"]
        command: [MODEL, *engine args]
        environment: {HF_TOKEN: "${HF_TOKEN:-}", **manifest.env}
        volumes: ["hf-cache:/root/.cache/huggingface"]
        shm_size: "16gb"                      # 4 GiB per GPU of a replica, at least 8 GiB
        healthcheck: {test: [CMD, python3, -c, <GET /health>], interval: 15s, timeout: 5s,
                      retries: 5, start_period: 600s}
        deploy:
          replicas: N
          resources: {reservations: {devices: [{driver: nvidia, count: GPUS PER REPLICA,
                                                capabilities: [gpu]}]}}

    The port is ``manifest.port`` inside the container; publishing it is left to the compose file.
    ``device: cpu`` manifests raise :class:`RenderError` here and in ``render_helm_values``.

``render_helm_values(manifest) -> dict``
    Values for one pool in the Helm chart (camelCase)::

        model, servedModelName, tensorParallelSize, pipelineParallelSize, replicas, gpuType,
        gpuMemoryUtilization, maxModelLen, maxNumSeqs, extraArgs,
        speculative: {method, draftModel, numSpeculativeTokens, draftTensorParallelSize,
                      promptLookupMin, promptLookupMax,     # speculative pool only
                      numSpeculativeTokensPerBatchSize}     # only when the manifest sets it

    Unset optional fields are ``None`` (YAML ``null``) so a chart can tell "not set" from a value.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from backends.manifest import PoolManifest, SpeculativeSpec

DEFAULT_VLLM_VERSION = "0.32.0"
SPECULATIVE_CONFIG_SINCE = (0, 10)
# num_speculative_tokens_per_batch_size: checked in vLLM 0.32.0's source (vllm/config/speculative.py); the
# release that introduced it is not pinned here, so earlier versions are refused rather than guessed.
DYNAMIC_SPECULATION_SINCE = (0, 32)
LEGACY_METHODS: frozenset[str] = frozenset({"draft_model", "eagle", "medusa", "ngram"})
IMAGE = "vllm/vllm-openai"
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"


class RenderError(ValueError):
    """The manifest cannot be expressed for the requested vLLM version."""


def parse_version(version: str) -> tuple[int, int, int]:
    """``"0.32.0"`` -> ``(0, 32, 0)``; ``"0.9"`` -> ``(0, 9, 0)``; suffixes (``rc1``, ``+cpu``) ignored."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+\-]?[0-9A-Za-z.+\-]*)?", version.strip())
    if match is None:
        raise RenderError(f"not a vLLM version: {version!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def uses_speculative_config(vllm_version: str) -> bool:
    return parse_version(vllm_version)[:2] >= SPECULATIVE_CONFIG_SINCE


def speculative_config(spec: SpeculativeSpec) -> dict[str, Any]:
    """The ``--speculative-config`` JSON object for vLLM >= 0.10."""
    config: dict[str, Any] = {"method": spec.method}
    if spec.draft_model is not None:
        config["model"] = spec.draft_model
    config["num_speculative_tokens"] = spec.num_speculative_tokens
    optional = {
        "draft_tensor_parallel_size": spec.draft_tensor_parallel_size,
        "prompt_lookup_max": spec.prompt_lookup_max,
        "prompt_lookup_min": spec.prompt_lookup_min,
    }
    config.update({key: value for key, value in optional.items() if value is not None})
    if spec.num_speculative_tokens_per_batch_size is not None:
        config["num_speculative_tokens_per_batch_size"] = [
            list(entry) for entry in spec.num_speculative_tokens_per_batch_size
        ]
    return config


def _legacy_speculative_flags(spec: SpeculativeSpec, vllm_version: str) -> list[str]:
    if spec.method not in LEGACY_METHODS:
        raise RenderError(
            f"method {spec.method!r} needs vLLM >= 0.10 (--speculative-config);"
            f" cannot render it for {vllm_version}"
        )
    draft = "[ngram]" if spec.method == "ngram" else str(spec.draft_model)
    flags = ["--speculative-model", draft, "--num-speculative-tokens", str(spec.num_speculative_tokens)]
    if spec.draft_tensor_parallel_size is not None:
        flags += ["--speculative-draft-tensor-parallel-size", str(spec.draft_tensor_parallel_size)]
    if spec.prompt_lookup_max is not None:
        flags += ["--ngram-prompt-lookup-max", str(spec.prompt_lookup_max)]
    if spec.prompt_lookup_min is not None:
        flags += ["--ngram-prompt-lookup-min", str(spec.prompt_lookup_min)]
    return flags


def _speculative_flags(spec: SpeculativeSpec, vllm_version: str) -> list[str]:
    if spec.num_speculative_tokens_per_batch_size is not None and (
        parse_version(vllm_version)[:2] < DYNAMIC_SPECULATION_SINCE
    ):
        raise RenderError(
            f"num_speculative_tokens_per_batch_size needs vLLM >= 0.32 (checked there); cannot render it"
            f" for {vllm_version}"
        )
    if uses_speculative_config(vllm_version):
        return ["--speculative-config", json.dumps(speculative_config(spec), separators=(",", ":"))]
    return _legacy_speculative_flags(spec, vllm_version)


def render_engine_args(manifest: PoolManifest, vllm_version: str = DEFAULT_VLLM_VERSION) -> list[str]:
    """The engine flags for ``vllm serve MODEL`` (without the program and the model)."""
    args = ["--served-model-name", manifest.served_model_name]
    if manifest.device == "gpu":
        args += ["--tensor-parallel-size", str(manifest.tensor_parallel_size)]
        args += ["--pipeline-parallel-size", str(manifest.pipeline_parallel_size)]
    optional = [
        ("--gpu-memory-utilization", manifest.gpu_memory_utilization),
        ("--max-model-len", manifest.max_model_len),
        ("--max-num-seqs", manifest.max_num_seqs),
    ]
    for flag, value in optional:
        if value is not None:
            args += [flag, str(value)]
    args += ["--port", str(manifest.port)]
    if manifest.speculative is not None:
        args += _speculative_flags(manifest.speculative, vllm_version)
    return args + list(manifest.extra_args)


def render_argv(manifest: PoolManifest, vllm_version: str = DEFAULT_VLLM_VERSION) -> list[str]:
    """The full ``vllm serve`` command line as an argv list."""
    return ["vllm", "serve", manifest.model, *render_engine_args(manifest, vllm_version)]


def render_shell(manifest: PoolManifest, vllm_version: str = DEFAULT_VLLM_VERSION) -> str:
    """The command for a POSIX shell, quoted, one flag per continuation line."""
    prefix = [f"{key}={shlex.quote(value)}" for key, value in sorted(manifest.env.items())]
    head = " ".join([*prefix, "vllm", "serve", shlex.quote(manifest.model)])
    lines = [head]
    args = render_engine_args(manifest, vllm_version)
    index = 0
    while index < len(args):
        token = args[index]
        has_value = index + 1 < len(args) and not args[index + 1].startswith("--")
        if has_value:
            lines.append(f"{shlex.quote(token)} {shlex.quote(args[index + 1])}")
            index += 2
        else:
            lines.append(shlex.quote(token))
            index += 1
    return " \\\n    ".join(lines) + "\n"


def _require_gpu(manifest: PoolManifest, target: str) -> None:
    if manifest.device != "gpu":
        raise RenderError(f"{target} output is for GPU pools on the vllm/vllm-openai image; a 'cpu' manifest runs "
                          "on the local CPU engine (specgate backends launch --cpu)")


def shm_size_gib(manifest: PoolManifest) -> int:
    """Shared memory for one replica: 4 GiB per GPU (NCCL buffers across TP/PP ranks), at least 8 GiB."""
    return max(8, 4 * manifest.gpus_per_replica)


def render_compose_service(
    manifest: PoolManifest,
    vllm_version: str = DEFAULT_VLLM_VERSION,
    model_cache_volume: str = "hf-cache",
) -> dict[str, Any]:
    """A docker-compose service running this pool on the official ``vllm/vllm-openai`` (GPU) image."""
    _require_gpu(manifest, "docker-compose")
    health_probe = f"import urllib.request; urllib.request.urlopen('http://localhost:{manifest.port}/health')"
    service: dict[str, Any] = {
        "image": f"{IMAGE}:v{'.'.join(str(part) for part in parse_version(vllm_version))}",
        "entrypoint": ["vllm", "serve"],
        "command": [manifest.model, *render_engine_args(manifest, vllm_version)],
        "environment": {"HF_TOKEN": "${HF_TOKEN:-}", **manifest.env},
        "volumes": [f"{model_cache_volume}:{HF_CACHE_IN_CONTAINER}"],
        "shm_size": f"{shm_size_gib(manifest)}gb",
        "healthcheck": {
            "test": ["CMD", "python3", "-c", health_probe],
            "interval": "15s",
            "timeout": "5s",
            "retries": 5,
            "start_period": "600s",
        },
        "deploy": {"replicas": manifest.replicas},
    }
    device = {"driver": "nvidia", "count": manifest.gpus_per_replica, "capabilities": ["gpu"]}
    service["deploy"]["resources"] = {"reservations": {"devices": [device]}}
    return service


def render_helm_values(manifest: PoolManifest) -> dict[str, Any]:
    """Values for one pool of the Helm chart (camelCase keys, see the module docstring)."""
    _require_gpu(manifest, "Helm")
    values: dict[str, Any] = {
        "model": manifest.model,
        "servedModelName": manifest.served_model_name,
        "tensorParallelSize": manifest.tensor_parallel_size,
        "pipelineParallelSize": manifest.pipeline_parallel_size,
        "replicas": manifest.replicas,
        "gpuType": manifest.gpu_type,
        "gpuMemoryUtilization": manifest.gpu_memory_utilization,
        "maxModelLen": manifest.max_model_len,
        "maxNumSeqs": manifest.max_num_seqs,
        "extraArgs": list(manifest.extra_args),
    }
    spec = manifest.speculative
    if spec is not None:
        values["speculative"] = {
            "method": spec.method,
            "draftModel": spec.draft_model,
            "numSpeculativeTokens": spec.num_speculative_tokens,
            "draftTensorParallelSize": spec.draft_tensor_parallel_size,
            "promptLookupMin": spec.prompt_lookup_min,
            "promptLookupMax": spec.prompt_lookup_max,
        }
        if spec.num_speculative_tokens_per_batch_size is not None:
            values["speculative"]["numSpeculativeTokensPerBatchSize"] = [
                list(entry) for entry in spec.num_speculative_tokens_per_batch_size
            ]
    return values
