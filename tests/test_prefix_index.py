from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from typing import Any

import pytest

from gateway.prefix_index import BLOCK_BYTES, PrefixIndex, PrefixReader, cached_tokens, chain

SYSTEM = "You are a careful assistant for a bookshop. " * 30  # ~1.3 KiB: two full blocks
READER = PrefixReader()


def chat(*texts: str, system: str | None = SYSTEM) -> list[dict[str, Any]]:
    """A conversation: the system prompt, then user and assistant messages by turns."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    roles = ("user", "assistant")
    return messages + [{"role": roles[i % 2], "content": text} for i, text in enumerate(texts)]


def blocks(messages: list[dict[str, Any]], user: Any = None, headers: dict[str, str] | None = None) -> tuple[int, ...]:
    return READER.chat(messages, user, headers or {})[0]


def session(messages: list[dict[str, Any]], user: Any = None, headers: dict[str, str] | None = None) -> str | None:
    return READER.chat(messages, user, headers or {})[1]


_CHILD = """
import json, sys
from gateway.prefix_index import PrefixReader
r = PrefixReader()
print(json.dumps([r.chat(json.loads(sys.argv[1]), "ann", {}), r.completion("z" * 3000, None, {})]))
"""


def test_values_and_session_keys_are_the_same_in_another_process() -> None:
    """Python's hash() of str is salted per process: a value built on it would differ here."""
    messages = chat("Which novels by Tolstoy do you stock? " * 20, "War and Peace.", "In paperback?")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(messages)], capture_output=True, text=True, check=True, env=env
    ).stdout
    child_chat, child_completion = json.loads(out)
    here = READER.chat(messages, "ann", {})
    assert (tuple(child_chat[0]), *child_chat[1:]) == here and len(here[0]) >= 3
    assert (tuple(child_completion[0]), *child_completion[1:]) == READER.completion("z" * 3000, None, {})


def test_a_later_turn_starts_with_the_earlier_turns_values() -> None:
    first = blocks(chat("Do you have Anna Karenina? " * 10))
    second = blocks(chat("Do you have Anna Karenina? " * 10, "Yes, two copies.", "Reserve one."))
    assert second[: len(first)] == first
    index = PrefixIndex()
    index.record("a", first)
    assert index.expected_hit("a", second) == len(first)


def test_the_expected_cached_tokens_are_the_share_of_the_text_read_up_to_the_last_value_held() -> None:
    first = chat("Do you have Anna Karenina? " * 10)
    later = chat("Do you have Anna Karenina? " * 10, "Yes, two copies. " * 20, "Reserve one.")
    values, _, read = READER.chat(later, None, {})
    index = PrefixIndex()
    index.record("a", READER.chat(first, None, {})[0])
    hit = index.expected_hit("a", values)
    end = (values[hit - 1] & ((1 << 62) - 1)) >> 32  # the last value held ends here
    assert end == first_turn_end(first) == len(chat_bytes(first))  # the previous turn's mark, its last value
    assert cached_tokens(values, hit, read, 1000) == 1000 * end // read
    assert cached_tokens(values, 0, read, 1000) == 0 and cached_tokens((), 0, 0, 1000) == 0


@pytest.mark.parametrize(
    ("hit", "read", "prompt", "expected"),
    [
        (0, 2048, 500, 0),  # nothing held
        (1, 2048, 500, 125),  # a 512-byte block of 2 KiB read: a quarter of the prompt
        (4, 2048, 500, 500),  # all of it
        (4, 2048, 10, 10),  # never more than the prompt
        (2, 0, 500, 0),  # nothing read
    ],
    ids=["none", "quarter", "all", "capped", "unread"],
)
def test_cached_tokens(hit: int, read: int, prompt: int, expected: int) -> None:
    values = chain(b"x" * 2048)
    assert cached_tokens(values, hit, read, prompt) == expected


def test_a_first_turns_mark_counts_up_to_the_first_turns_end() -> None:
    """A first turn shorter than a block: its mark is all a later turn holds, and it counts its bytes."""
    values, _, read = READER.chat(chat("hi", "Hello! " * 200, "And?", system=None), None, {})
    assert values[0] >> 62 == 1  # the mark comes first (no full block before the first turn's end)
    assert cached_tokens(values, 1, read, read) == len(b"user\x1fhi\x1e")


def chat_bytes(messages: list[dict[str, Any]]) -> bytes:
    return "".join(f"{m['role']}\x1f{m['content']}\x1e" for m in messages).encode()


def first_turn_end(messages: list[dict[str, Any]]) -> int:
    upto = next(i for i, m in enumerate(messages) if m["role"] == "user")
    return len(chat_bytes(messages[: upto + 1]))


def test_the_first_turn_is_matched_even_when_it_is_shorter_than_a_block() -> None:
    first = blocks(chat("hi", system=None))
    later = blocks(chat("hi", "Hello! How can I help?", "Recommend a novel.", system=None))
    assert len(first) == 1  # no full block: only the first turn's mark
    index = PrefixIndex()
    index.record("a", first)
    assert index.expected_hit("a", later) == 1
    other = blocks(chat("hello", "Hi!", "Recommend a novel.", system=None))
    assert index.expected_hit("a", other) == 0


def test_conversations_sharing_only_the_system_prompt_share_its_blocks_and_no_more() -> None:
    a = blocks(chat("Find me a cookbook about Persian food."))
    b = blocks(chat("Is the shop open on Sunday?"))
    index = PrefixIndex()
    index.record("r", a)
    assert index.expected_hit("r", b) == len(SYSTEM) // BLOCK_BYTES == 2


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (chat("same words"), chat("same words", system="Another system prompt. " * 30)),
        (chat("same words"), [{"role": "developer", "content": SYSTEM}, {"role": "user", "content": "same words"}]),
        (chat("a" * 600, system=None), chat("b" + "a" * 599, system=None)),
    ],
    ids=["system-prompt", "role", "first-byte"],
)
def test_a_different_prefix_gives_different_values(one: list[dict[str, Any]], other: list[dict[str, Any]]) -> None:
    assert blocks(one)[0] != blocks(other)[0]


def test_cjk_text_is_cut_in_bytes_and_list_content_reads_its_text_parts() -> None:
    text = "请把下面这段话翻译成英文，并保留原来的语气。" * 40  # 880 characters, 2,640 bytes
    values = blocks(chat(text, system=None))
    assert len(values) == len(("user\x1f" + text + "\x1e").encode()) // BLOCK_BYTES + 1  # + the first turn's mark
    parts = [{"type": "text", "text": text[:400]}, {"type": "image_url", "image_url": {"url": "x"}},
             {"type": "text", "text": text[400:]}]  # fmt: skip
    as_parts = blocks([{"role": "user", "content": parts}])
    as_string = blocks([{"role": "user", "content": text[:400] + "\n" + text[400:]}])
    assert as_parts == as_string


def test_the_text_read_is_bounded_and_its_cost_too() -> None:
    reader = PrefixReader(read_bytes=4096)
    huge = [{"role": "user", "content": "x" * 4_000_000}]
    cut = [{"role": "user", "content": "x" * 5000}]
    values = reader.chat(huge, None, {})[0]
    assert values == reader.chat(cut, None, {})[0] and len(values) == 4096 // BLOCK_BYTES + 1
    cjk = [{"role": "user", "content": "书" * 4_000_000}]
    assert len(reader.chat(cjk, None, {})[0]) == 4096 // BLOCK_BYTES + 1
    started = time.perf_counter()
    for _ in range(100):
        reader.chat(huge, None, {})
    assert (time.perf_counter() - started) / 100 < 0.001  # reading 4 MB each time would take ~1 ms or more


def test_completion_prompts_strings_and_token_ids() -> None:
    text = "def f(x):\n    return x\n" * 100
    assert READER.completion(text, None, {})[0] == chain(text.encode())
    assert READER.completion([text, "other"], None, {})[0] == chain(text.encode())
    ids = list(range(300))
    assert len(READER.completion(ids, None, {})[0]) == 300 * 4 // BLOCK_BYTES
    assert READER.completion([ids], None, {}) == READER.completion(ids, None, {})
    assert READER.completion([-1, 5], None, {}) == ((), None, 0)  # not token ids the index can read


def test_the_session_key_holds_across_turns_and_tells_users_and_openings_apart() -> None:
    opening = chat("Recommend a thriller.")
    later = chat("Recommend a thriller.", "Try Gone Girl.", "Something older?")
    assert session(opening) == session(later) is not None
    assert session(opening, user="ann") == session(later, user="ann") != session(later, user="bob")
    assert session(chat("Recommend a romance.")) != session(opening)
    headers = {"x-session-id": "conv-42"}
    assert session(opening, headers=headers) == session(chat("unrelated"), user="ann", headers=headers)
    assert session(opening, headers=headers).startswith("h:")  # type: ignore[union-attr]


def test_the_lru_evicts_the_oldest_and_a_prompts_tail_before_its_head() -> None:
    index = PrefixIndex(blocks_per_replica=4)
    index.record("a", (1, 2, 3))
    index.record("a", (10,))
    assert index.held("a") == 4
    index.record("a", (20,))  # one too many: the oldest goes, which is 3 (the tail was refreshed first)
    assert index.expected_hit("a", (1, 2, 3)) == 2 and index.held("a") == 4
    index.record("a", (1, 2))  # refreshed: now 10 and 20 are the oldest
    index.record("a", (30, 31))
    assert index.expected_hit("a", (1, 2)) == 2 and index.expected_hit("a", (10,)) == 0
    assert index.expected_hit("b", (1,)) == 0
    assert index.record("a", (1, 2, 99)) == 2  # record returns the hit it found


def test_a_lookup_does_not_refresh() -> None:
    index = PrefixIndex(blocks_per_replica=2)
    index.record("a", (1,))
    index.record("a", (2,))
    assert index.expected_hit("a", (1,)) == 1
    index.record("a", (3,))
    assert index.expected_hit("a", (1,)) == 0  # still the oldest, looked up or not


def test_keep_forgets_removed_replicas() -> None:
    index = PrefixIndex()
    index.record("a", (1,))
    index.record("b", (1,))
    index.keep(["b"])
    assert index.held("a") == 0 and index.held("b") == 1


def test_memory_measurement_counts_what_the_index_holds() -> None:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = PrefixIndex(1000)
        for i in range(1000):
            index.record("a", (i << 40 | i,))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert index.held("a") == 1000 and 40_000 < held < 400_000
