"""The shipped workloads: counts, categories, languages, hard cases, and ground truth from the drawer."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

import pytest

from backends.workloads.draw import draw_values
from backends.workloads.loader import DATA_DIR, WorkloadError, load_category_file, load_workload, prompt_key

CATEGORIES = ["chat", "code", "short", "summarization", "translation"]


def test_every_category_has_at_least_25_prompts_in_both_languages() -> None:
    items = load_workload().items
    assert sorted({item.category for item in items}) == CATEGORIES
    per_language = Counter((item.category, item.language) for item in items)
    for category in CATEGORIES:
        assert per_language[(category, "en")] + per_language[(category, "zh")] >= 25
        assert per_language[(category, "en")] >= 8 and per_language[(category, "zh")] >= 8


def test_short_answers_ask_for_fewer_than_50_tokens() -> None:
    short = [item for item in load_workload().items if item.category == "short"]
    assert all(item.max_tokens < 50 for item in short)
    assert {item.task for item in short} >= {"chat", "code", "translation"}


def _mentions_translation(text: str) -> bool:
    return "translat" in text.lower() or "翻译" in text


def test_the_issue_hard_cases_are_present() -> None:
    hard = [item for item in load_workload().items if item.hard_case]
    in_user = [i for i in hard if "user message" in (i.hard_case or "") and i.task != "chat"]
    code_in_chat = [i for i in hard if i.task == "chat" and "```" in i.messages[-1]["content"]]
    creative_translator = [i for i in hard if i.task == "chat" and _mentions_translation(i.messages[0]["content"])]
    assert {i.task for i in in_user} >= {"code", "translation", "summarization"}
    assert len(code_in_chat) >= 2
    assert len(creative_translator) >= 2


@pytest.mark.parametrize("path", sorted(DATA_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_stored_ground_truth_is_what_the_category_distribution_draws(path: Path) -> None:
    spec = load_category_file(path)
    for item in spec.items:
        assert (item.acceptance, item.output_tokens) == draw_values(item, spec), item.id
    mean = statistics.fmean(item.acceptance or 0 for item in spec.items)
    assert mean == pytest.approx(spec.distribution.acceptance.mean, abs=0.04)


def test_ids_and_prompt_keys_are_unique() -> None:
    items = load_workload().items
    assert len({item.id for item in items}) == len(items)
    assert len({item.key for item in items}) == len(items)


def test_prompt_key_depends_on_role_and_text_only() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert prompt_key(messages) == prompt_key([{"content": "hi", "role": "user", "name": "x"}])
    assert prompt_key(messages) == prompt_key([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert prompt_key(messages) != prompt_key([{"role": "system", "content": "hi"}])
    assert prompt_key("hi") != prompt_key(messages)


def test_an_item_without_drawn_values_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(
        "category: chat\ndistribution: {acceptance: {mean: 0.5, concentration: 10}, "
        "output_tokens: {median: 10, sigma: 0.1, minimum: 1, maximum: 20}}\n"
        "items:\n  - {id: a, user: hi, max_tokens: 5}\n"
    )
    with pytest.raises(WorkloadError, match="no drawn"):
        load_workload([path])


def test_a_misspelt_item_key_fails_naming_its_path(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(
        "category: chat\ndistribution: {acceptance: {mean: 0.5, concentration: 10}, "
        "output_tokens: {median: 10, sigma: 0.1, minimum: 1, maximum: 20}}\n"
        "items:\n  - {id: a, user: hi, max_token: 5}\n"
    )
    with pytest.raises(WorkloadError, match=r"items\.0\.max_token"):
        load_workload([path])
