"""Emulator profiles: the numbers that make an emulated engine behave like one real deployment.

A profile is a YAML file under ``backends/emulator/profiles/`` (or any path). Every field is typed and
validated; a misspelt key fails with its path. Each shipped profile documents where its numbers come from.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from backends.emulator.acceptance import AcceptanceModel
from backends.spec_schedule import Schedule, k_for_batch, validate_schedule

PROFILE_DIR = Path(__file__).parent / "profiles"


class ProfileError(ValueError):
    """A profile could not be found or does not validate."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepCost(_Strict):
    """One forward pass: ``overhead_s + max(t_mem_s, compute_s_per_token * n)`` for ``n`` tokens."""

    t_mem_s: float = Field(gt=0, description="memory-bound floor: reading the weights once")
    compute_s_per_token: float = Field(gt=0, description="compute-bound slope past the knee")
    overhead_s: float = Field(default=0.0, ge=0, description="fixed per-step cost (scheduler, sampling)")
    prefill_s_per_token: float = Field(ge=0, description="added per prompt token of a joining request")


class SpeculativeConfig(_Strict):
    method: str = Field(description="draft_model, eagle, ngram, ... (documentation only)")
    num_speculative_tokens: int = Field(ge=1, le=10, description="k")
    draft_cost_ratio: float = Field(ge=0, le=1, description="c: one draft step costs c * t_step(batch)")
    verify_cost_ratio: float = Field(
        default=1.0, ge=0, le=1.5, description="v: a drafted token costs the verification v decode tokens (1: "
        "priced as decode; `specgate bench step-cost` fits it on a real engine)",
    )
    acceptance_scale: float = Field(
        default=1.0, gt=0, le=1.5, description="multiplies the workload's acceptance for this drafter"
    )
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = Field(
        default=None,
        description="vLLM's dynamic speculation: [batch from, batch to, k] entries (k = 0 drafts nothing; "
        "k at most num_speculative_tokens); the engine drafts the k of its running batch size at each step",
    )

    @field_validator("num_speculative_tokens_per_batch_size")
    @classmethod
    def _sorted(cls, table: Schedule | None) -> Schedule | None:
        return None if table is None else tuple(sorted(table))

    @model_validator(mode="after")
    def _schedule_is_vllms(self) -> SpeculativeConfig:
        table = self.num_speculative_tokens_per_batch_size
        if table is not None:
            validate_schedule(table, self.num_speculative_tokens)
        return self

    def k_at(self, batch: int) -> int:
        """Draft tokens per step at ``batch`` running requests: the table's k, else ``num_speculative_tokens``."""
        table = self.num_speculative_tokens_per_batch_size
        if table is None:
            return self.num_speculative_tokens
        return k_for_batch(table, batch, self.num_speculative_tokens)


class OutputLength(_Strict):
    """Log-normal base output length for prompts the workload does not know (the content model shortens
    or sets it where the request plainly asks for a length: a rewrite, a translation, one word)."""

    median: int = Field(gt=0)
    sigma: float = Field(ge=0)
    minimum: int = Field(default=1, gt=0)
    maximum: int = Field(default=2048, gt=0)


class Profile(_Strict):
    name: str
    description: str
    source: str
    model_name: str
    max_model_len: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)
    kv_capacity_tokens: int = Field(gt=0)
    step: StepCost
    speculative: SpeculativeConfig
    acceptance_model: AcceptanceModel = Field(
        default_factory=AcceptanceModel, description="how this drafter's acceptance follows content"
    )
    output_length: OutputLength
    shared_hardware: float = Field(
        default=0.0, ge=0, le=4,
        description="both pools on one device: while the other pool's engines have work, each step of an engine "
        "takes (1 + this x their busy share) as long (the simulator; 0: separate GPUs)",
    )  # fmt: skip
    targets: dict[str, str] = Field(default_factory=dict, description="the calibration targets, as prose")

    @model_validator(mode="after")
    def _one_request_fits(self) -> Profile:
        if self.kv_capacity_tokens < self.max_model_len:
            raise ValueError("kv_capacity_tokens must hold at least one request of max_model_len tokens")
        return self


def dynamic_table(k: int) -> tuple[tuple[int, int, int], ...]:
    """The dynamic-speculation table this project measures with (``num_speculative_tokens_per_batch_size``):
    the profile's k up to 8 running requests, 2 from 9 to 32, 0 from 33 on (the last range's k holds for every
    larger batch, as in vLLM)."""
    return ((1, 8, k), (9, 32, min(2, k)), (33, 33, 0))


def dynamic_profile(profile: Profile, table: Schedule | None = None) -> Profile:
    """The profile with a dynamic-speculation table on its speculative engines (validated as a profile file is):
    :func:`dynamic_table` unless ``table`` is given. What the one-pool baselines run (the default table), and
    specgate's speculative pool under ``specgate simulate --speculative-k``. The name says so: ``+dynamic-k``
    for the default table, ``+k=FROM-TO:K,...`` for another; ``ProfileError`` when the table does not fit the
    profile (a ``k`` above its ``num_speculative_tokens``)."""
    speculative = profile.speculative.model_dump()
    base = profile.name.split("+", 1)[0]
    if table is None:
        table, name = dynamic_table(profile.speculative.num_speculative_tokens), base + DYNAMIC_SUFFIX
    else:
        name = f"{base}+k={','.join(f'{a}-{b}:{k}' for a, b, k in table)}"
    speculative["num_speculative_tokens_per_batch_size"] = table
    try:
        return Profile.model_validate({**profile.model_dump(), "name": name, "speculative": speculative})
    except ValidationError as exc:
        raise ProfileError(f"{name}: {_describe(exc)}") from exc


DYNAMIC_SUFFIX = "+dynamic-k"


def with_dynamic_k(profile: Profile) -> Profile:
    """What the one-pool baselines run: ``profile`` as it is when its speculative engines already follow a table
    (``--speculative-k``: both setups then run the same one), else with :func:`dynamic_table`."""
    own = profile.speculative.num_speculative_tokens_per_batch_size
    return profile if own is not None else dynamic_profile(profile)


def shipped_profiles() -> list[str]:
    return sorted(path.stem for path in PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped profile by name (``a100-70b-draft``) or any YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ProfileError(f"no emulator profile {str(name_or_path)!r}; shipped: {', '.join(shipped_profiles())}")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{path}: {_describe(exc)}") from exc


def _describe(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(part) for part in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors())
