"""Multi-turn sessions: conversations, agent loops and RAG questions whose every turn resends the history.

A session file (``backends/workloads/sessions/*.yaml``, made by ``python -m backends.workloads.make_sessions``)
holds sessions of turns. Each turn adds one message (a user's, or a tool's output in an agent loop) and states
the assistant's ``answer``; the next turn's prompt is the whole history (the system prompt, every earlier
message and answer) plus its own message, as a chat client resends it. A file's ``shared`` texts (a long
system prompt with tool definitions, the documents a RAG service retrieves) are named by a session's
``context`` and appended to its system prompt in that order, so sessions that name the same texts first share
that prefix in the engines' prefix caches.

The truth of each turn: its output length is the stated answer's (the emulator's token count, capped at
``max_tokens``), so that what the next turn resends is what the engine generated; its acceptance is read from
its messages by the content model (:mod:`backends.emulator.acceptance`), as for every synthetic workload item.
Each turn's KV block hashes (:mod:`backends.emulator.prompt_blocks`) are computed once, here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from backends.emulator.acceptance import DEFAULT_MODEL, AcceptanceModel, acceptance_of
from backends.emulator.prompt_blocks import chat_blocks
from backends.emulator.reading import count_tokens, read_request
from backends.workloads.loader import Workload, WorkloadError, WorkloadItem, load_yaml_model

SESSIONS_DIR = Path(__file__).parent / "sessions"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TurnSpec(_Strict):
    role: Literal["user", "tool"] = "user"  # what the turn adds: a user's message, or a tool's output
    content: str = Field(min_length=1)
    answer: str = Field(min_length=1, description="the assistant's reply, resent in the next turns' history")


class SessionSpec(_Strict):
    id: str
    origin: str | None = Field(default=None, description="the conversation's id in its public source")
    system: str | None = None
    context: list[str] = Field(default_factory=list, description="names of the file's shared texts, in order")
    max_tokens: int = Field(gt=0)
    turns: list[TurnSpec] = Field(min_length=1)


class SessionFile(_Strict):
    kind: Literal["sessions"]
    category: str
    task: str
    source: dict[str, Any] = Field(description="provenance: the command, the date, where the text comes from")
    shared: dict[str, str] = Field(default_factory=dict)
    sessions: list[SessionSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _context_is_shared(self) -> SessionFile:
        for session in self.sessions:
            missing = [name for name in session.context if name not in self.shared]
            if missing:
                raise ValueError(f"session {session.id}: context {missing} not in 'shared'")
        return self


@dataclass(frozen=True, slots=True)
class SessionTurn:
    item: WorkloadItem  # the whole request: history plus the turn's message, its truth
    block_hashes: tuple[int, ...]  # its prompt's KV blocks (prompt_blocks.chat_blocks)
    answer: str = ""  # the assistant's reply (what the engine generates; the next turn resends it)


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    category: str
    turns: tuple[SessionTurn, ...]


@dataclass(frozen=True, slots=True)
class SessionSet:
    sessions: tuple[Session, ...]

    @property
    def workload(self) -> Workload:
        """Every turn as a workload item (capacity and load levels are computed over them)."""
        return Workload(tuple(turn.item for session in self.sessions for turn in session.turns))

    @property
    def mean_turns(self) -> float:
        return sum(len(s.turns) for s in self.sessions) / len(self.sessions)

    def with_model(self, model: AcceptanceModel) -> SessionSet:
        """The same sessions with each turn's acceptance read by ``model`` (a profile's drafter)."""
        if model == DEFAULT_MODEL:
            return self

        def reread(turn: SessionTurn) -> SessionTurn:
            acceptance = acceptance_of(read_request(turn.item.messages), model)
            return dataclasses.replace(turn, item=dataclasses.replace(turn.item, acceptance=acceptance))

        return SessionSet(tuple(dataclasses.replace(s, turns=tuple(map(reread, s.turns))) for s in self.sessions))


def session_files(paths: Iterable[Path] | None = None) -> list[Path]:
    """The shipped session files, or the given files and directories' YAML files."""
    if paths is None:
        return sorted(SESSIONS_DIR.glob("*.yaml"))
    return [f for p in paths for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p])]


def load_sessions(paths: Iterable[Path] | None = None, model: AcceptanceModel = DEFAULT_MODEL) -> SessionSet:
    """The sessions of the shipped files (or of ``paths``), each turn's acceptance read by ``model``."""
    sessions: list[Session] = []
    for path in session_files(paths):
        spec = load_session_file(path)
        sessions.extend(_session(spec, session, model) for session in spec.sessions)
    if not sessions:
        raise WorkloadError(f"no sessions in {', '.join(map(str, paths or [SESSIONS_DIR]))}")
    return SessionSet(tuple(sessions))


def load_session_file(path: Path) -> SessionFile:
    return load_yaml_model(path, SessionFile)


def system_text(spec: SessionFile, session: SessionSpec) -> str | None:
    """The session's system prompt: its own text, then the shared texts its context names."""
    parts = ([session.system] if session.system else []) + [spec.shared[name] for name in session.context]
    return "\n\n".join(parts) if parts else None


def _session(spec: SessionFile, session: SessionSpec, model: AcceptanceModel) -> Session:
    system = system_text(spec, session)
    history: list[Mapping[str, str]] = [{"role": "system", "content": system}] if system is not None else []
    turns: list[SessionTurn] = []
    for number, turn in enumerate(session.turns, start=1):
        history.append({"role": turn.role, "content": turn.content})
        messages = tuple(history)
        item = WorkloadItem(
            id=f"{session.id}-t{number}",
            category=spec.category,
            task=spec.task,
            messages=messages,
            max_tokens=session.max_tokens,
            acceptance=acceptance_of(read_request(messages), model),
            output_tokens=max(1, count_tokens(turn.answer)),
            hard_case=None,
        )
        turns.append(SessionTurn(item, chat_blocks(messages), turn.answer))
        history.append({"role": "assistant", "content": turn.answer})
    return Session(session.id, spec.category, tuple(turns))
