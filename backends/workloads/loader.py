"""The shipped workloads: hand-written prompts with their ground truth, in splits.

Each ``<split>/<category>.yaml`` holds a category's prompts. A **synthetic** file (the default
``provenance``) holds its output-length distribution and per item the base length drawn from it once (by
``python -m backends.workloads.draw``); the item's acceptance and, where its content plainly sets it, its
natural length come from the content model (:mod:`backends.emulator.acceptance`, which reads the text
with :mod:`backends.emulator.reading`), so they follow what the request asks, not its category. A
**recorded** file (``provenance: recorded``) holds per item what a real engine measured; its ``acceptance``
and ``output_tokens`` are kept as they are. An item of a synthetic file that gives its own ``acceptance`` is
kept as given too (a workload written elsewhere, e.g. one a reviewer judges the policy on, says what its
truth is); the shipped synthetic files give none, so the content model decides theirs.

Splits (:data:`SPLITS`): ``dev`` (``data/``, what the gateway's cues and knobs and the emulator's
calibration are developed on), ``eval`` (``eval/``, other items of the same categories, never tuned on), and
the family where acceptance does not follow the task name (one system prompt everywhere), as
``one-prompt-dev`` and ``one-prompt-eval`` under ``families/one-prompt/``.

The emulator and the simulator both look items up by :func:`prompt_key`, a hash of the messages (or the
completion prompt), so that a request's acceptance comes from the workload and never from anything the
gateway adds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from backends.emulator.acceptance import DEFAULT_MODEL, AcceptanceModel, acceptance_of
from backends.emulator.acceptance import natural_length_of as _natural_length
from backends.emulator.reading import count_tokens as count_tokens  # the prompt counter, re-exported
from backends.emulator.reading import read_request

_Model = TypeVar("_Model", bound=BaseModel)
HERE = Path(__file__).parent
DATA_DIR = HERE / "data"  # the development split (the workload shipped first)
EVAL_DIR = HERE / "eval"
FAMILY_DIR = HERE / "families" / "one-prompt"
RECORDED_DIR = HERE / "recorded"  # measured on a real engine (backends/workloads/record.py)
SPLITS: Mapping[str, Path] = {
    "dev": DATA_DIR,
    "eval": EVAL_DIR,
    "one-prompt-dev": FAMILY_DIR / "dev",
    "one-prompt-eval": FAMILY_DIR / "eval",
}
# Recordings: what the real CPU engine measured (`specgate workloads record`); ``recorded-shipped`` holds the dev
# split's prompts, so these are kept apart from SPLITS (hand-written, drawn, prompts never shared between them).
RECORDED_SPLITS: Mapping[str, Path] = {
    "recorded-shipped": RECORDED_DIR / "shipped",
    "recorded-sharegpt": RECORDED_DIR / "sharegpt",
    "recorded-humaneval": RECORDED_DIR / "humaneval",
}

# The task each category's items have unless an item says otherwise.
CATEGORY_TASKS: Mapping[str, str] = {
    "code": "code",
    "translation": "translation",
    "summarization": "summarization",
    "chat": "chat",
    "short": "chat",
}

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")


class WorkloadError(ValueError):
    """A workload file does not validate."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Beta(_Strict):
    """Accepted in older files, never used: acceptance comes from content (or a recording)."""

    mean: float = Field(gt=0, lt=1)
    concentration: float = Field(gt=0)


class LogNormal(_Strict):
    median: int = Field(gt=0)
    sigma: float = Field(ge=0)
    minimum: int = Field(gt=0)
    maximum: int = Field(gt=0)


class Distribution(_Strict):
    output_tokens: LogNormal
    acceptance: Beta | None = None


class Message(_Strict):
    role: str
    content: str


class SpecMetrics(_Strict):
    """vLLM's per-request ``metrics.speculative_decoding`` (``--per-request-spec-decode-metrics summary``)."""

    mean_acceptance_length: float = Field(ge=1)
    draft_acceptance_rate: float = Field(ge=0, le=1)
    steps: int = Field(ge=0, description="verify steps that carried drafts")
    drafted: int = Field(ge=0)
    accepted: int = Field(ge=0)


class Recording(_Strict):
    """How a recorded file was made: the command, the engine, when, from what."""

    command: str
    date: str
    engine: dict[str, Any]
    source: dict[str, Any] | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    summary: dict[str, Any] = Field(default_factory=dict)


class ItemSpec(_Strict):
    id: str
    max_tokens: int = Field(gt=0)
    system: str | None = None
    user: str | None = None
    messages: list[Message] | None = None
    task: str | None = None
    hard_case: str | None = None
    acceptance: float | None = Field(default=None, gt=0, lt=1)
    output_tokens: int | None = Field(default=None, gt=0)
    # What a recording measured besides (backends/workloads/record.py); documentation for the reader, not read.
    origin: str | None = Field(default=None, description="the item's id in its public source")
    finish_reason: str | None = None
    prompt_tokens: int | None = Field(default=None, ge=0)
    ttft_ms: float | None = Field(default=None, ge=0)
    e2e_ms: float | None = Field(default=None, ge=0)
    spec: SpecMetrics | None = None
    unmeasured: str | None = Field(default=None, description="why a recorded item has no acceptance: not loaded")

    @model_validator(mode="after")
    def _one_form(self) -> ItemSpec:
        if (self.messages is None) == (self.user is None):
            raise ValueError("give either 'user' (with an optional 'system') or 'messages'")
        if self.messages is not None and self.system is not None:
            raise ValueError("'system' goes inside 'messages' when 'messages' is used")
        return self


class CategoryFile(_Strict):
    category: str
    provenance: Literal["synthetic", "recorded"] = "synthetic"
    source: str | None = Field(default=None, description="how the file was made: the command, engine, date")
    task: str | None = Field(default=None, description="the items' task unless an item says otherwise")
    distribution: Distribution | None = None
    recording: Recording | None = None
    items: list[ItemSpec]

    @model_validator(mode="after")
    def _drawn_from_something(self) -> CategoryFile:
        if self.provenance == "synthetic" and self.distribution is None:
            raise ValueError("a synthetic file needs 'distribution' (its output lengths are drawn from it)")
        return self


@dataclass(frozen=True, slots=True)
class WorkloadItem:
    """One prompt with its ground truth."""

    id: str
    category: str
    task: str
    messages: tuple[Mapping[str, str], ...]
    max_tokens: int
    acceptance: float
    output_tokens: int
    hard_case: str | None
    recorded: bool = False  # measured on an engine or given by its file: kept as it is; else read from the content

    @property
    def key(self) -> str:
        return prompt_key(self.messages)

    @property
    def language(self) -> str:
        return "zh" if _CJK.search(self.messages[-1]["content"]) else "en"

    @property
    def prompt_tokens(self) -> int:
        return count_prompt_tokens(self.messages)

    def request_body(self, model: str, *, stream: bool = False) -> dict[str, Any]:
        """The OpenAI chat-completions body a client would send for this item."""
        return {
            "model": model,
            "messages": [dict(m) for m in self.messages],
            "max_tokens": self.max_tokens,
            "stream": stream,
        }


@dataclass(frozen=True, slots=True)
class Workload:
    items: tuple[WorkloadItem, ...]

    def by_key(self) -> dict[str, WorkloadItem]:
        return {item.key: item for item in self.items}

    def with_model(self, model: AcceptanceModel) -> Workload:
        """The same items with the synthetic ones' acceptance read by ``model`` (a profile's drafter)."""
        if model == DEFAULT_MODEL:
            return self
        return Workload(tuple(item if item.recorded else dataclasses.replace(
            item, acceptance=acceptance_of(read_request(item.messages), model)) for item in self.items))  # fmt: skip

    def categories(self) -> list[str]:
        return sorted({item.category for item in self.items})

    @property
    def mean_acceptance(self) -> float:
        """The items' mean per-token acceptance: what an operator reads off a speculative pool's counters."""
        return statistics.fmean(item.acceptance for item in self.items)


def prompt_key(messages_or_prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """A stable hash of what the user sent: the role and text of every message, or the prompt string."""
    if isinstance(messages_or_prompt, str):
        canonical: Any = messages_or_prompt
    else:
        canonical = [[str(m.get("role", "")), content_text(m.get("content"))] for m in messages_or_prompt]
    return hashlib.sha256(orjson.dumps(canonical)).hexdigest()[:24]


def content_text(content: Any) -> str:
    """Message content as text: a string, or OpenAI's list of parts (text parts joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def count_prompt_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Prompt tokens of a chat: the text plus a few template tokens per message (as chat templates add)."""
    return sum(count_tokens(content_text(m.get("content"))) + 4 for m in messages) + 2


def load_workload(paths: Iterable[Path] | None = None, model: AcceptanceModel = DEFAULT_MODEL) -> Workload:
    """Load the development split (or the given files); synthetic items' acceptance read by ``model``.
    Items without a drawn (or recorded) length are rejected."""
    files = sorted(DATA_DIR.glob("*.yaml")) if paths is None else list(paths)
    items: list[WorkloadItem] = []
    for path in files:
        items.extend(_items(load_category_file(path), path, model))
    return Workload(tuple(items))


def load_split(name: str, model: AcceptanceModel = DEFAULT_MODEL) -> Workload:
    """One of :data:`SPLITS` or :data:`RECORDED_SPLITS` by name."""
    splits = {**SPLITS, **RECORDED_SPLITS}
    if name not in splits:
        raise WorkloadError(f"no workload split {name!r}; shipped: {', '.join(splits)}")
    return load_workload(sorted(splits[name].glob("*.yaml")), model)


def load_category_file(path: Path) -> CategoryFile:
    return load_yaml_model(path, CategoryFile)


def load_yaml_model(path: Path, model: type[_Model]) -> _Model:
    """A YAML file read into ``model``; a file that does not fit raises WorkloadError naming each bad key."""
    try:
        return model.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise WorkloadError(f"{path}: {details}") from exc


def _items(spec: CategoryFile, path: Path, model: AcceptanceModel) -> list[WorkloadItem]:
    """The file's items; a recorded item the engine gave no acceptance for (``unmeasured``) is left out."""
    measured = [item for item in spec.items if not (item.unmeasured and item.acceptance is None)]
    return [_item(spec, item, path, model) for item in measured]


def _item(spec: CategoryFile, item: ItemSpec, path: Path, model: AcceptanceModel) -> WorkloadItem:
    recorded = spec.provenance == "recorded"
    given = recorded or item.acceptance is not None  # the file states the truth: kept as it is
    if item.output_tokens is None or (recorded and item.acceptance is None):
        wanted = "recorded acceptance/output_tokens" if recorded else "drawn output_tokens; run the drawer"
        raise WorkloadError(f"{path}: item {item.id} has no {wanted}")
    messages = _messages(item)
    if given:
        acceptance, output_tokens = item.acceptance or 0.0, item.output_tokens
    else:
        reading = read_request(messages)
        acceptance, output_tokens = acceptance_of(reading, model), _natural_length(reading, item.output_tokens)
    return WorkloadItem(
        id=item.id,
        category=spec.category,
        task=item.task or spec.task or CATEGORY_TASKS.get(spec.category, spec.category),
        messages=messages,
        max_tokens=item.max_tokens,
        acceptance=acceptance,
        output_tokens=output_tokens,
        hard_case=item.hard_case,
        recorded=given,
    )


def _messages(item: ItemSpec) -> tuple[Mapping[str, str], ...]:
    if item.messages is not None:
        return tuple({"role": m.role, "content": m.content} for m in item.messages)
    system = [{"role": "system", "content": item.system}] if item.system is not None else []
    return (*system, {"role": "user", "content": item.user or ""})
