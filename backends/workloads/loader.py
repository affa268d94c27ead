"""The shipped workloads: hand-written prompts with their ground truth.

Each ``data/<category>.yaml`` holds a category's prompts, its acceptance and output-length distributions,
and per item the values drawn from them once (by ``python -m backends.workloads.draw``). The emulator and
the simulator both look items up by :func:`prompt_key`, a hash of the messages (or the completion prompt),
so that a request's acceptance comes from the workload and never from anything the gateway adds.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DATA_DIR = Path(__file__).parent / "data"

# The task each category's items have unless an item says otherwise.
CATEGORY_TASKS: Mapping[str, str] = {
    "code": "code",
    "translation": "translation",
    "summarization": "summarization",
    "chat": "chat",
    "short": "chat",
}

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")
_TOKEN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]|\w+|[^\w\s]")


class WorkloadError(ValueError):
    """A workload file does not validate."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Beta(_Strict):
    mean: float = Field(gt=0, lt=1)
    concentration: float = Field(gt=0)


class LogNormal(_Strict):
    median: int = Field(gt=0)
    sigma: float = Field(ge=0)
    minimum: int = Field(gt=0)
    maximum: int = Field(gt=0)


class Distribution(_Strict):
    acceptance: Beta
    output_tokens: LogNormal


class Message(_Strict):
    role: str
    content: str


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

    @model_validator(mode="after")
    def _one_form(self) -> ItemSpec:
        if (self.messages is None) == (self.user is None):
            raise ValueError("give either 'user' (with an optional 'system') or 'messages'")
        if self.messages is not None and self.system is not None:
            raise ValueError("'system' goes inside 'messages' when 'messages' is used")
        return self


class CategoryFile(_Strict):
    category: str
    distribution: Distribution
    items: list[ItemSpec]


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

    def categories(self) -> list[str]:
        return sorted({item.category for item in self.items})


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


def count_tokens(text: str) -> int:
    """A cheap token estimate: one per CJK character, word or punctuation mark."""
    return len(_TOKEN.findall(text))


def count_prompt_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Prompt tokens of a chat: the text plus a few template tokens per message (as chat templates add)."""
    return sum(count_tokens(content_text(m.get("content"))) + 4 for m in messages) + 2


def load_workload(paths: Iterable[Path] | None = None) -> Workload:
    """Load the shipped categories (or the given files). Items without drawn values are rejected."""
    files = sorted(DATA_DIR.glob("*.yaml")) if paths is None else list(paths)
    items: list[WorkloadItem] = []
    for path in files:
        items.extend(_items(load_category_file(path), path))
    return Workload(tuple(items))


def load_category_file(path: Path) -> CategoryFile:
    try:
        return CategoryFile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise WorkloadError(f"{path}: {details}") from exc


def _items(spec: CategoryFile, path: Path) -> list[WorkloadItem]:
    items = []
    for item in spec.items:
        if item.acceptance is None or item.output_tokens is None:
            raise WorkloadError(f"{path}: item {item.id} has no drawn acceptance/output_tokens; run the drawer")
        items.append(
            WorkloadItem(
                id=item.id,
                category=spec.category,
                task=item.task or CATEGORY_TASKS.get(spec.category, spec.category),
                messages=_messages(item),
                max_tokens=item.max_tokens,
                acceptance=item.acceptance,
                output_tokens=item.output_tokens,
                hard_case=item.hard_case,
            )
        )
    return items


def _messages(item: ItemSpec) -> tuple[Mapping[str, str], ...]:
    if item.messages is not None:
        return tuple({"role": m.role, "content": m.content} for m in item.messages)
    system = [{"role": "system", "content": item.system}] if item.system is not None else []
    return (*system, {"role": "user", "content": item.user or ""})
