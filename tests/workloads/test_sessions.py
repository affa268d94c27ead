"""The shipped session files (multi-turn chats, agent loops, RAG questions) and how their turns are built."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from backends.emulator.prefix_cache import BLOCK_SIZE
from backends.emulator.reading import count_tokens
from backends.workloads.loader import WorkloadError
from backends.workloads.make_sessions import cut, exchanges, language
from backends.workloads.sessions import SESSIONS_DIR, SessionSet, load_session_file, load_sessions, session_files


@pytest.fixture(scope="module")
def shipped() -> SessionSet:
    return load_sessions()


def test_the_three_kinds_load_and_stay_small(shipped: SessionSet) -> None:
    categories = {session.category for session in shipped.sessions}
    assert categories == {"sharegpt-chat", "agent-tools", "rag-docs"}
    assert sum(path.stat().st_size for path in session_files()) < 1_000_000
    for path in session_files():
        source = load_session_file(path).source
        assert source["command"].startswith("python -m backends.workloads.make_sessions") and source["date"]


def test_chats_have_four_turns_or_more_in_chinese_and_english(shipped: SessionSet) -> None:
    chats = [s for s in shipped.sessions if s.category == "sharegpt-chat"]
    assert len(chats) >= 24 and all(len(s.turns) >= 4 for s in chats)
    languages = {s.turns[0].item.language for s in chats}
    assert languages == {"zh", "en"}


def test_each_turn_resends_the_history_and_the_answer_length_is_the_output(shipped: SessionSet) -> None:
    for session in shipped.sessions:
        for before, after in zip(session.turns, session.turns[1:], strict=False):
            previous, following = before.item.messages, after.item.messages
            assert following[: len(previous)] == previous
            answer = following[len(previous)]
            assert answer["role"] == "assistant"
            assert before.item.output_tokens == count_tokens(answer["content"])
            assert after.block_hashes[: len(before.block_hashes)] == before.block_hashes
        for turn in session.turns:
            assert len(turn.block_hashes) == turn.item.prompt_tokens // BLOCK_SIZE
            assert 0 < turn.item.acceptance < 1


def test_sessions_share_their_common_system_prefix(shipped: SessionSet) -> None:
    agents = [s for s in shipped.sessions if s.category == "agent-tools"]
    first, second = agents[0].turns[0].block_hashes, agents[1].turns[0].block_hashes
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert common * BLOCK_SIZE >= 800  # the tool definitions
    rag = [s for s in shipped.sessions if s.category == "rag-docs"]
    spec = load_session_file(SESSIONS_DIR / "rag-docs.yaml")
    firsts = [session.context[0] for session in spec.sessions]
    one, other, *_ = (i for i, name in enumerate(firsts) if name == firsts[0])
    a, b = rag[one].turns[0].block_hashes, rag[other].turns[0].block_hashes
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert shared * BLOCK_SIZE >= 1000  # the instructions and the whole first document


def test_a_context_name_that_is_not_shared_is_refused(tmp_path: Path) -> None:
    data = {"kind": "sessions", "category": "c", "task": "chat", "source": {"command": "by hand"},
            "sessions": [{"id": "s", "context": ["missing"], "max_tokens": 8,
                          "turns": [{"content": "hi", "answer": "hello"}]}]}  # fmt: skip
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(WorkloadError, match="missing"):
        load_sessions([path])


def test_the_generator_cuts_by_the_emulators_tokens_and_keeps_alternating_exchanges() -> None:
    assert cut("one two, three four", 3) == "one two,"
    assert cut("短文本", 2) == "短文"
    assert cut("short", 10) == "short"
    conversation = {"conversations": [
        {"from": "human", "value": "first question here"}, {"from": "gpt", "value": "first answer here"},
        {"from": "human", "value": "second question"}, {"from": "gpt", "value": "second answer"},
        {"from": "human", "value": "third"}, {"from": "human", "value": "out of turn"},
    ]}  # fmt: skip
    assert exchanges(conversation) == [
        ("first question here", "first answer here"),
        ("second question", "second answer"),
    ]
    assert language("这是中文") == "zh" and language("plain English") == "en" and language("Ünïcödé ëvërÿ wörd") is None
