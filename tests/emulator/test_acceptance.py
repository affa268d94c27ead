"""The content model of acceptance: what a request's text says about speculation on its answer."""

from __future__ import annotations

import ast
import asyncio
import statistics
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import orjson
import pytest

from backends.emulator import acceptance as model_module
from backends.emulator import reading as content
from backends.emulator.acceptance import AcceptanceModel, ScriptFit, acceptance, natural_length
from backends.emulator.core import EmulatorConfig, EmulatorCore
from backends.emulator.openai_io import CHAT
from backends.emulator.profiles import load_profile, shipped_profiles
from backends.emulator.reading import (
    COMMENT,
    COMPOSE,
    CONDENSE,
    CONTINUE,
    EXTRACT,
    READ_CHARS,
    TRANSFORM,
    TRANSLATE,
    read_request,
)
from backends.workloads.loader import load_split, load_workload

SYSTEM = "You are a helpful assistant."
QUIET = AcceptanceModel(noise=0.0)  # the structure alone, without per-request noise
PUBLISHED = {"code": 0.85, "translation": 0.80, "summarization": 0.75, "chat": 0.55}
PASSAGES = (
    "The museum reopened on Saturday after two years of repairs. Visitors queued around the block to see the "
    "restored ceiling, and the café sold out of cakes before noon. Staff said they had expected a quiet start.",
    "Our team tried three databases last quarter. The first was fast but hard to operate, the second was easy "
    "to run but slow on joins, and the third needed a licence we could not afford, so we kept the old one.",
    "Every spring the river floods the lower fields. Farmers now plant later, build small earth walls and keep "
    "their seed in the upper barns, and the village has learned to live with water for a few weeks a year.",
    "The new phone has a larger battery, a brighter screen and a slower charger than last year's model. Most "
    "reviewers liked it, but several complained that the camera struggles in low light and the case scratches.",
)
CODE = "```python\ndef total(xs):\n    t = 0\n    for x in xs:\n        t += x\n    return t\n```"


def chat(user: str, system: str | None = SYSTEM, *history: str) -> list[dict[str, str]]:
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i, text in enumerate(history)]
    head = [{"role": "system", "content": system}] if system is not None else []
    return [*head, *turns, {"role": "user", "content": user}]


def requests_about(passage: str) -> dict[str, list[dict[str, str]]]:
    return {
        "rewrite": chat(f"Rewrite the following paragraph in a more formal tone:\n\n{passage}"),
        "review": chat(f"What do you think of this paragraph? Is it well written?\n\n{passage}"),
        "new": chat("Write a short story about a museum, a database or a river, as you like."),
    }


@pytest.mark.parametrize("passage", PASSAGES, ids=range(len(PASSAGES)))
def test_acceptance_follows_copyability_under_one_system_prompt(passage: str) -> None:
    """A rewrite of a pasted passage copies most of it; a review of the same passage quotes little of it;
    new prose copies nothing: the structure orders them whatever the words, before any noise."""
    asked = requests_about(passage)
    rewrite, review, new = (acceptance(asked[kind], QUIET) for kind in ("rewrite", "review", "new"))
    assert rewrite > review + 0.2
    assert rewrite > new + 0.2
    assert read_request(asked["rewrite"]).intent == TRANSFORM
    assert read_request(asked["review"]).intent == COMMENT


def test_the_order_holds_with_noise_on_average() -> None:
    asked = [requests_about(p) for p in PASSAGES] + [requests_about(p.upper()) for p in PASSAGES]
    mean = {k: statistics.fmean(acceptance(a[k]) for a in asked) for k in ("rewrite", "review", "new")}
    assert mean["rewrite"] > mean["new"] + 0.2 and mean["rewrite"] > mean["review"] + 0.2


@pytest.mark.parametrize(
    ("user", "system", "intent"),
    [
        ("Fix the bug in this function:\n" + CODE, SYSTEM, TRANSFORM),
        ("Review this function and tell me what could go wrong:\n" + CODE, SYSTEM, COMMENT),
        ("Restore the old behaviour and keep the rest as it is:\n" + CODE, SYSTEM, TRANSFORM),  # unknown verb
        ("Why is this slow?\n" + CODE, SYSTEM, COMMENT),  # a question about pasted code
        (CODE, "You are an IDE completion model.", CONTINUE),  # bare code
        ("The meeting moved to Monday. Please update your calendars.", "Translate into French.", TRANSLATE),
        ("Actually, forget translating today. Write me a poem about rain.", "Translate into French.", COMPOSE),
        ("今天不用翻译了，你能给我讲一个关于月亮的童话吗？", "你是一名翻译，请把用户的内容翻译成英文。", COMPOSE),
        ("本周完成了数据清洗，修复了接口超时的问题。", "请把周报压缩成三条要点。", CONDENSE),  # narrated 修复了
        ("Extract every name and phone number as JSON:\n\nCall Ana on 555-0142 or Bo on 555-0178.", SYSTEM, EXTRACT),
        ("Write a Python function that extracts dates from a string.", SYSTEM, COMPOSE),
        ("Can you give me the key points of this? \"" + PASSAGES[0] + "\"", SYSTEM, CONDENSE),
    ],
    ids=["fix", "review", "restore", "question", "bare-code", "role-translate", "forget-role", "forget-role-zh",
         "narrated", "extract", "function-that-extracts", "give-me-key-points"],
)  # fmt: skip
def test_what_the_instruction_asks(user: str, system: str, intent: str) -> None:
    assert read_request(chat(user, system)).intent == intent


def test_code_review_and_code_edit_sit_far_apart_on_one_system_prompt() -> None:
    """The family where acceptance does not follow the task name: both are `code`."""
    for split in ("one-prompt-dev", "one-prompt-eval"):
        items = load_split(split).items
        assert len({item.messages[0]["content"] for item in items}) == 1, "one system prompt everywhere"
        by = {c: [i.acceptance for i in items if i.category == c] for c in ("review", "edit", "rewrite", "compose")}
        assert {i.task for i in items if i.category in ("review", "edit")} == {"code"}
        assert statistics.fmean(by["edit"]) > statistics.fmean(by["review"]) + 0.3, split
        assert statistics.fmean(by["rewrite"]) > statistics.fmean(by["compose"]) + 0.15, split


def test_script_fit_is_the_drafters() -> None:
    zh = chat("写一个关于秋天的小故事。", "你是一个乐于助人的助手。")
    en = chat("Write a short story about autumn.")
    weak = AcceptanceModel(noise=0.0, script=ScriptFit(cjk=-1.0))
    assert acceptance(zh, weak) < acceptance(zh, QUIET) - 0.1
    assert acceptance(en, weak) == acceptance(en, QUIET)
    assert read_request(zh).script == "cjk" and read_request(en).script == "latin"
    translate = chat("The train leaves at noon.", "Translate the user's text into Chinese.")
    assert read_request(translate).script == "cjk"  # a translation's answer is in the target's script


def test_repetitive_material_is_more_predictable() -> None:
    varied = " ".join(PASSAGES)
    repetitive = "ERROR disk full on node-1. " * 24
    assert content.redundancy(repetitive) > content.redundancy(varied) + 0.3
    asked = [chat(f"Summarise this log:\n\n{text}") for text in (varied, repetitive)]
    assert acceptance(asked[1], QUIET) > acceptance(asked[0], QUIET)


def test_acceptance_is_deterministic_and_seeded_by_the_text() -> None:
    asked = requests_about(PASSAGES[0])["new"]
    assert acceptance(asked) == acceptance([dict(m) for m in asked])
    assert read_request(asked).seed != read_request(chat("Write a short story about a river.")).seed
    code = (
        "import orjson, sys; from backends.emulator.acceptance import acceptance; "
        "print(acceptance(orjson.loads(sys.argv[1])))"
    )
    other = subprocess.run([sys.executable, "-c", code, orjson.dumps(asked).decode()], capture_output=True,
                           text=True, check=True, cwd=Path(__file__).parents[2])  # fmt: skip
    assert float(other.stdout) == acceptance(asked)  # no per-process hash seed


def test_text_past_the_read_limit_changes_nothing() -> None:
    head = "Rewrite this text more formally:\n\n" + PASSAGES[1] * (READ_CHARS // len(PASSAGES[1]) + 1)
    long, cut = chat(head + "tail " * 50_000), chat(head[:READ_CHARS])
    assert read_request(long).material_tokens == read_request(cut).material_tokens
    assert acceptance(long) != 0 and read_request(long).intent == TRANSFORM


@pytest.mark.parametrize("profile", shipped_profiles())
def test_per_task_means_on_the_dev_split_match_the_published_figures(profile: str) -> None:
    """Calibrated on the development split: code ~85 %, translation ~80 %, summaries ~75 %, chat ~55 %
    (the workload's acceptance; a profile's acceptance_scale applies on top, in the engine)."""
    items = load_workload(model=load_profile(profile).acceptance_model).items
    for task, figure in PUBLISHED.items():
        mean = statistics.fmean(item.acceptance for item in items if item.task == task)
        assert mean == pytest.approx(figure, abs=0.03), task


def test_the_eval_split_lands_near_the_figures_without_being_tuned_on() -> None:
    items = load_split("eval").items
    for task, figure in PUBLISHED.items():
        assert statistics.fmean(i.acceptance for i in items if i.task == task) == pytest.approx(figure, abs=0.06)


def test_natural_length_follows_content_where_it_plainly_does() -> None:
    passage = PASSAGES[2]
    rewrite = natural_length(chat(f"Rewrite the following paragraph in a more formal tone:\n\n{passage}"), 500)
    assert 0.85 < rewrite / content.count_tokens(passage) < 1.3  # about as long as its input
    one_word = chat("What is the chemical symbol for gold? Answer with one word.")
    assert natural_length(one_word, 400) <= 4  # short whatever max_tokens allows
    assert natural_length(chat("一周有几天？只回答一个数字。"), 400) <= 4
    assert 5 <= natural_length(chat("Describe Paris in at most eight words."), 400) <= 9
    assert natural_length(chat("Write a short story about a river."), 321) == 321  # the draw stands
    zh = natural_length(chat("The train leaves at noon and arrives at six.", "Translate into Chinese."), 500)
    assert zh > content.count_tokens("The train leaves at noon and arrives at six.")  # more tokens in Chinese


def test_given_acceptance_is_kept_and_items_without_one_follow_the_model(tmp_path: Path) -> None:
    """Recorded items, and items of any file that state their acceptance (a workload written elsewhere says
    what its truth is), keep it; items that give none get the content model's."""
    body = "items:\n  - {id: a, user: 'Write a poem about rain.', max_tokens: 50, acceptance: 0.9, output_tokens: 7}\n"
    (tmp_path / "rec.yaml").write_text(f"category: chat\nprovenance: recorded\n{body}", encoding="utf-8")
    distribution = "category: chat\ndistribution: {output_tokens: {median: 9, sigma: 0.1, minimum: 1, maximum: 20}}\n"
    (tmp_path / "given.yaml").write_text(distribution + body.replace("id: a", "id: b"), encoding="utf-8")
    (tmp_path / "syn.yaml").write_text(
        distribution + body.replace("id: a", "id: c").replace("acceptance: 0.9, ", ""), encoding="utf-8"
    )
    recorded, given, synthetic = (load_workload([tmp_path / f"{n}.yaml"]).items[0] for n in ("rec", "given", "syn"))
    assert (recorded.acceptance, recorded.output_tokens, recorded.recorded) == (0.9, 7, True)
    assert (given.acceptance, given.output_tokens, given.recorded) == (0.9, 7, True)
    assert synthetic.acceptance == acceptance(synthetic.messages) != 0.9 and not synthetic.recorded
    weak = AcceptanceModel(prose=-2.0)
    both = load_workload([tmp_path / "rec.yaml", tmp_path / "syn.yaml"]).with_model(weak).items
    assert both[0].acceptance == 0.9 and both[1].acceptance < synthetic.acceptance


def _engine_request(core: EmulatorCore, messages: list[Mapping[str, str]]) -> tuple[float, int]:
    async def run() -> tuple[float, int]:
        job = core.start(core.parse(CHAT, orjson.dumps({"messages": messages, "max_tokens": 2000})))
        core.finish(job)
        await core.aclose()
        return job.ticket.request.acceptance, job.ticket.request.output_tokens

    return asyncio.run(run())


def test_the_emulator_reads_unknown_prompts_with_its_profiles_model() -> None:
    profile = load_profile("h100-8b")
    zh = chat("写一个关于秋天的小故事。", "你是一个乐于助人的助手。")
    rewrite = chat(f"Rewrite the following paragraph in a more formal tone:\n\n{PASSAGES[3]}")
    own = EmulatorCore(EmulatorConfig(profile, speculative=True))
    assert _engine_request(own, zh)[0] == acceptance(zh, profile.acceptance_model)
    assert _engine_request(own, rewrite)[1] == natural_length(rewrite, 1)  # the rewrite's length, not a draw
    weak = profile.model_copy(update={"acceptance_model": AcceptanceModel(script=ScriptFit(cjk=-1.5))})
    assert _engine_request(EmulatorCore(EmulatorConfig(weak, speculative=True)), zh)[0] < acceptance(zh) - 0.1


def test_the_workload_truth_the_emulator_serves_is_its_profiles() -> None:
    weak = load_profile("h100-8b").model_copy(update={"acceptance_model": AcceptanceModel(prose=-2.0)})
    item = next(i for i in load_workload().items if i.id == "chat-01")
    core = EmulatorCore(EmulatorConfig(weak, speculative=True), load_workload())
    served, length = _engine_request(core, list(item.messages))
    assert served < item.acceptance - 0.2 and length == item.output_tokens


@pytest.mark.parametrize("module", [content, model_module], ids=["reading", "acceptance"])
def test_the_model_reads_text_only_never_the_gateways_features(module: object) -> None:
    tree = ast.parse(Path(str(getattr(module, "__file__", ""))).read_text(encoding="utf-8"))
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not [name for name in imported if name.startswith("gateway")]
    assert {name for name in imported if name.startswith("backends")} <= {"backends.emulator.reading"}
