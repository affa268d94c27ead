"""The shipped workloads: counts, categories, languages, hard cases, drawn lengths, provenance and splits."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from backends.workloads.draw import draw_tokens
from backends.workloads.loader import (
    SPLITS,
    WorkloadError,
    load_category_file,
    load_split,
    load_workload,
    prompt_key,
)

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


SHIPPED = [path for directory in SPLITS.values() for path in sorted(directory.glob("*.yaml"))]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_stored_base_lengths_are_what_the_category_distribution_draws(path: Path) -> None:
    spec = load_category_file(path)
    assert spec.provenance == "synthetic"
    for item in spec.items:
        assert item.acceptance is None, f"{item.id}: a synthetic item's acceptance comes from its content"
        assert item.output_tokens == draw_tokens(item, spec), item.id


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


def test_the_eval_split_has_other_items_of_the_same_categories_in_both_languages() -> None:
    dev, held_out = load_split("dev").items, load_split("eval").items
    assert len(held_out) >= 60
    assert sorted({item.category for item in held_out}) == CATEGORIES
    per_language = Counter((item.category, item.language) for item in held_out)
    assert all(per_language[(c, "en")] >= 4 and per_language[(c, "zh")] >= 4 for c in CATEGORIES)
    assert {item.key for item in dev}.isdisjoint(item.key for item in held_out)
    assert all(item.max_tokens < 50 for item in held_out if item.category == "short")


def test_the_one_prompt_family_has_a_dev_and_an_eval_half() -> None:
    halves = [load_split(name).items for name in ("one-prompt-dev", "one-prompt-eval")]
    for items in halves:
        assert {item.category for item in items} == {"review", "edit", "rewrite", "compose", "extract", "terse",
                                                     "longchat"}  # fmt: skip
        assert {item.messages[0]["content"] for item in items} == {"你是一个乐于助人的助手。"}
        assert {item.language for item in items} == {"en", "zh"}
        assert all(item.max_tokens >= 512 for item in items if item.category == "terse")
        assert all(item.output_tokens <= 4 for item in items if item.category == "terse")
        assert all(len(item.messages) >= 6 for item in items if item.category == "longchat")
    assert {i.key for i in halves[0]}.isdisjoint(i.key for i in halves[1])


def test_every_split_has_unique_ids_and_prompts() -> None:
    items = [item for name in SPLITS for item in load_split(name).items]
    assert len({item.id for item in items}) == len(items)
    assert len({item.key for item in items}) == len(items)


def test_an_unknown_split_is_named() -> None:
    with pytest.raises(WorkloadError, match="no workload split 'test'"):
        load_split("test")


def test_a_synthetic_file_needs_a_distribution_to_draw_from(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("category: chat\nitems:\n  - {id: a, user: hi, max_tokens: 5, output_tokens: 3}\n")
    with pytest.raises(WorkloadError, match="distribution"):
        load_workload([path])


def test_a_recorded_item_needs_its_recorded_acceptance(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    item = "  - {id: a, user: hi, max_tokens: 5, output_tokens: 3}\n"
    path.write_text(f"category: chat\nprovenance: recorded\nitems:\n{item}")
    with pytest.raises(WorkloadError, match="no recorded acceptance"):
        load_workload([path])


@pytest.mark.parametrize("split", ["eval", "one-prompt-eval"])
def test_simulate_reads_a_split_directory(split: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    out = tmp_path / "sim.json"
    argv = ["simulate", "--profile", "h100-8b", "--loads", "0.5", "--duration", "8", "--warmup", "2",
            "--scenarios", "", "--seeds", "1", "--jobs", "1", "--workload", str(SPLITS[split]), "--json", str(out)]
    assert main(argv) == 0
    assert "EMULATED" in capsys.readouterr().out
    report = json.loads(out.read_text())["h100-8b"]
    assert report["capacity_qps"] > 0 and report["levels"][0][0]["summaries"]
