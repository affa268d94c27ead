"""Pool manifests: how one vLLM pool is launched, as a typed, validated document.

One YAML file describes one pool (``backends/pools/standard.yaml``, ``backends/pools/speculative.yaml``; more
examples under ``backends/pools/examples/`` and the CPU pair under ``backends/pools/cpu/``)::

    pool: speculative                  # standard | speculative (must match the speculative block)
    device: gpu                        # gpu | cpu
    model: meta-llama/Llama-3.1-70B-Instruct
    served_model_name: llama-3.1-70b-instruct
    tensor_parallel_size: 4            # 1, 2, 4 or 8
    pipeline_parallel_size: 1
    gpus_per_replica: 4                # must equal tensor_parallel_size x pipeline_parallel_size (0 on cpu)
    replicas: 2
    gpu_type: H100-80GB                # required on gpu, absent on cpu
    gpu_memory_utilization: 0.9
    max_model_len: 8192
    max_num_seqs: 128
    port: 8000
    env: {}                            # extra environment for the engine process
    extra_args: ["--enable-prefix-caching"]
    speculative:                       # only (and always) for pool: speculative
      method: draft_model              # draft_model | eagle | eagle3 | medusa | mtp | ngram | suffix
      draft_model: meta-llama/Llama-3.1-8B-Instruct
      num_speculative_tokens: 5        # 1..10
      draft_tensor_parallel_size: 1    # 1 or the target's tensor_parallel_size
      prompt_lookup_min: 2             # ngram only
      prompt_lookup_max: 4             # ngram only
      num_speculative_tokens_per_batch_size:   # optional: vLLM's dynamic speculation, k by batch size
        - [1, 16, 5]                   # [batch from, batch to, k], inclusive; the first starts at 1
        - [17, 64, 2]                  # k <= num_speculative_tokens (the maximum)
        - [65, 128, 0]                 # k = 0: no draft at these batch sizes

Loading errors are raised as :class:`ManifestError`, whose message names the file and each bad key's dotted
path. Checks that need files on disk (vocabulary match between target and draft) live in
:mod:`backends.vocab`, not in the schema, so validation stays pure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from backends.spec_schedule import validate_schedule

PoolName = Literal["standard", "speculative"]
SpecMethod = Literal["draft_model", "eagle", "eagle3", "medusa", "mtp", "ngram", "suffix"]

POOLS_DIR = Path(__file__).parent / "pools"
CPU_POOLS_DIR = POOLS_DIR / "cpu"
EXAMPLES_DIR = POOLS_DIR / "examples"

# Methods whose proposer is a separate set of weights named by ``draft_model``.
METHODS_WITH_DRAFT_WEIGHTS: frozenset[str] = frozenset({"draft_model", "eagle", "eagle3", "medusa"})
# Flags the schema owns; giving them again through extra_args would silently fight the manifest.
OWNED_FLAGS: frozenset[str] = frozenset(
    {
        "--model",
        "--served-model-name",
        "--tensor-parallel-size",
        "-tp",
        "--pipeline-parallel-size",
        "-pp",
        "--gpu-memory-utilization",
        "--max-model-len",
        "--max-num-seqs",
        "--port",
        "--speculative-config",
        "--speculative-model",
        "--num-speculative-tokens",
        "--speculative-draft-tensor-parallel-size",
        "--ngram-prompt-lookup-max",
        "--ngram-prompt-lookup-min",
    }
)


class ManifestError(ValueError):
    """A manifest file that cannot be read or does not validate; the message names each bad key."""


class SpeculativeSpec(BaseModel):
    """How the speculative pool proposes tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: SpecMethod
    draft_model: str | None = None
    num_speculative_tokens: int = Field(ge=1, le=10)
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = None

    @model_validator(mode="after")
    def _method_fields_agree(self) -> SpeculativeSpec:
        needs_weights = self.method in METHODS_WITH_DRAFT_WEIGHTS
        if needs_weights and not self.draft_model:
            raise ValueError(f"draft_model is required for method {self.method!r}")
        if not needs_weights and self.draft_model is not None:
            raise ValueError(f"draft_model is not used by method {self.method!r}; remove it")
        if not needs_weights and self.draft_tensor_parallel_size is not None:
            raise ValueError(f"draft_tensor_parallel_size is not used by method {self.method!r}; remove it")
        self._check_prompt_lookup()
        if self.num_speculative_tokens_per_batch_size is not None:
            validate_schedule(self.num_speculative_tokens_per_batch_size, self.num_speculative_tokens)
        return self

    def _check_prompt_lookup(self) -> None:
        has_lookup = self.prompt_lookup_min is not None or self.prompt_lookup_max is not None
        if self.method != "ngram":
            if has_lookup:
                raise ValueError(f"prompt_lookup_min/max are for method 'ngram' only, not {self.method!r}")
            return
        if self.prompt_lookup_max is None:
            raise ValueError("prompt_lookup_max is required for method 'ngram'")
        low = self.prompt_lookup_min if self.prompt_lookup_min is not None else 1
        if low > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({low}) must not exceed prompt_lookup_max ({self.prompt_lookup_max})"
            )


class PoolManifest(BaseModel):
    """One vLLM pool: the model, its parallelism and placement, and (speculative pool) the proposer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: PoolName
    device: Literal["gpu", "cpu"] = "gpu"
    model: str = Field(min_length=1)
    served_model_name: str = Field(min_length=1)
    tensor_parallel_size: Literal[1, 2, 4, 8] = 1
    pipeline_parallel_size: int = Field(default=1, ge=1, le=16)
    gpus_per_replica: int = Field(ge=0)
    replicas: int = Field(default=1, ge=1)
    gpu_type: str | None = None
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    max_model_len: int | None = Field(default=None, ge=16)
    max_num_seqs: int | None = Field(default=None, ge=1)
    port: int = Field(default=8000, ge=1, le=65535)
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list)
    speculative: SpeculativeSpec | None = None

    @model_validator(mode="after")
    def _consistent(self) -> PoolManifest:
        self._check_placement()
        self._check_pool_kind()
        self._check_extra_args()
        return self

    def _check_placement(self) -> None:
        parallel = self.tensor_parallel_size * self.pipeline_parallel_size
        if self.device == "cpu":
            if self.gpus_per_replica != 0 or self.gpu_type is not None or parallel != 1:
                raise ValueError(
                    "device 'cpu' needs gpus_per_replica: 0, no gpu_type and tensor/pipeline parallel size 1"
                )
            return
        if self.gpus_per_replica != parallel:
            raise ValueError(
                f"gpus_per_replica ({self.gpus_per_replica}) must equal tensor_parallel_size x "
                f"pipeline_parallel_size ({self.tensor_parallel_size} x {self.pipeline_parallel_size}"
                f" = {parallel})"
            )
        if not self.gpu_type:
            raise ValueError("gpu_type is required for device 'gpu'")

    def _check_pool_kind(self) -> None:
        if self.pool == "speculative" and self.speculative is None:
            raise ValueError("speculative: the speculative pool needs a speculative block")
        if self.pool == "standard" and self.speculative is not None:
            raise ValueError("speculative: the standard pool must not speculate; remove the block")
        draft_tp = self.speculative.draft_tensor_parallel_size if self.speculative else None
        if draft_tp is not None and draft_tp not in (1, self.tensor_parallel_size):
            raise ValueError(
                f"speculative.draft_tensor_parallel_size must be 1 or equal to tensor_parallel_size "
                f"({self.tensor_parallel_size}); got {draft_tp} (vLLM rejects anything else)"
            )

    def _check_extra_args(self) -> None:
        for arg in self.extra_args:
            flag = arg.split("=", 1)[0]
            if flag in OWNED_FLAGS:
                raise ValueError(f"extra_args: {flag} is set by the manifest's own fields; use those instead")

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas


def load_manifest(path: str | Path) -> PoolManifest:
    """Read and validate one manifest file; raises :class:`ManifestError` naming the file and bad keys."""
    path = Path(path)
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ManifestError(f"{path}: cannot read manifest: {exc}") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: a manifest must be a YAML mapping")
    try:
        return PoolManifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(f"{path}: invalid manifest\n{format_errors(exc)}") from exc


def format_errors(exc: ValidationError) -> str:
    """One line per error: ``  dotted.key.path: message``."""
    lines = []
    for error in exc.errors():
        location = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"  {location}: {message}")
    return "\n".join(lines)


def pool_path(pool: str, cpu: bool = False) -> Path:
    """Where the shipped manifest for ``pool`` lives (the CPU pair when ``cpu``)."""
    return (CPU_POOLS_DIR if cpu else POOLS_DIR) / f"{pool}.yaml"


def resolve_manifest(pool_or_path: str, cpu: bool = False) -> Path:
    """A pool name (``standard``/``speculative``) maps to the shipped file; anything else is a path."""
    if pool_or_path in ("standard", "speculative"):
        return pool_path(pool_or_path, cpu=cpu)
    return Path(pool_or_path)


def shipped_manifests() -> list[Path]:
    """Every manifest the repository ships (main pair, CPU pair, examples), sorted."""
    return sorted(POOLS_DIR.rglob("*.yaml"))
