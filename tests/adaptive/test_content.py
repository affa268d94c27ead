"""The content features: stable across processes, bounded in what they read and keep, pure."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gateway.adaptive import content as content_module
from gateway.adaptive.content import SLOTS, TEXT_SLOTS, ContentReader, content_of, is_unit

USER = "Rewrite the following paragraph in a more formal tone:\n\nThe meeting was fine and we agreed on 3 things."


def read(reader: ContentReader, user: str | None = USER, system: str | None = "You are a helpful assistant.",
         **extra: object) -> tuple[int, ...]:  # fmt: skip
    options: dict[str, object] = {"prompt_tokens": 40, "max_tokens": 256} | extra
    return reader.read(system, user, "chat", False, **options).slots  # type: ignore[arg-type]


def test_the_slots_are_the_same_in_another_process() -> None:
    """Weights are shared between gateway replicas through Redis: a word must land in the same slot in every
    process, whatever its hash seed (Python's str hash() differs between processes)."""
    script = (
        "from gateway.adaptive.content import ContentReader\n"
        f"print(ContentReader().read('You are a helpful assistant.', {USER!r}, 'chat', False, 40, 256).slots)"
    )
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
        outputs.add(run.stdout)
    assert len(outputs) == 1
    assert outputs.pop().strip() == str(read(ContentReader()))


def test_every_slot_is_in_range_and_the_structure_is_always_there() -> None:
    reader = ContentReader()
    for user in (USER, "", None, "短", "翻译成英文：" + "今天天气很好。" * 50, "x" * 100_000, "```py\nprint(1)\n```"):
        slots = read(reader, user)
        assert all(0 <= slot < SLOTS for slot in slots)
        units = [slot for slot in slots if is_unit(slot)]
        assert len(units) >= 12  # itemgetter(*slots) returns a tuple only for two slots or more
        assert len(slots) <= 12 + 1 + content_module.USER_WORDS + content_module.USER_BIGRAMS + 2 * 32


def test_words_not_chars_decide_the_text_slots_case_digits_and_punctuation_aside() -> None:
    reader = ContentReader()
    text = [s for s in read(reader, "Fix the grammar in this text: it were 12 cats.") if s < TEXT_SLOTS]
    same = [s for s in read(reader, "fix THE grammar in this text it were 47 cats") if s < TEXT_SLOTS]
    other = [s for s in read(reader, "Write a story about 12 cats.") if s < TEXT_SLOTS]
    assert sorted(text) == sorted(same)
    assert sorted(text) != sorted(other)


def test_a_long_message_is_read_at_its_head_and_tail_only() -> None:
    """Bounded reading: what lies between the first 8,000 characters and the last TAIL_CHARS does not change
    the features (the structure reads the head, the words the head's and tail's start)."""
    reader = ContentReader()
    head, tail = "Summarize the report below.\n\n" + "a b c d. " * 1000, " Keep it short please."
    one = read(reader, head + "x" * 50_000 + tail)
    two = read(reader, head + "y" * 50_000 + tail)
    assert one == two


def test_cjk_text_gives_character_bigrams_from_both_ends_of_a_run() -> None:
    reader = ContentReader()
    ask = read(reader, "我是办公室职员，每天久坐，想在家锻炼，每周三次，每次三十分钟，帮我设计一个计划。")
    other = read(reader, "我是办公室职员，每天久坐，想在家锻炼，每周三次，每次三十分钟，帮我写一首诗吧。")
    assert set(ask) != set(other)  # the instruction at the end is read


def test_the_system_prompt_cache_is_bounded() -> None:
    reader = ContentReader()
    for index in range(content_module._CACHE_LIMIT + 10):
        read(reader, system=f"You are assistant number {index}.")
    assert len(reader._system) <= content_module._CACHE_LIMIT


def test_reading_is_pure_and_repeatable() -> None:
    reader = ContentReader()
    assert read(reader) == read(reader) == read(ContentReader())


@pytest.mark.parametrize(
    ("option", "values"),
    [("max_tokens", (16, 4096)), ("temperature", (0.0, 1.2)), ("n", (1, 3)), ("prompt_tokens", (40, 9000))],
)
def test_request_parameters_are_features(option: str, values: tuple[object, object]) -> None:
    reader = ContentReader()
    first, second = (read(reader, **{option: value}) for value in values)
    assert first != second


def test_content_of_reads_the_features_field_or_none() -> None:
    class Carrier:
        content = ContentReader().read(None, USER, "chat", False, 40, 256)

    assert content_of(Carrier()) is Carrier.content
    assert content_of(object()) is None
