from __future__ import annotations

import random
import re
from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.features import (
    Classifier,
    compile_cue_pattern,
    estimate_tokens,
    extract_features,
    has_copy_cue,
    required_literals,
)
from gateway.prefix_index import PrefixReader, chat_text
from gateway.rules import default_rules, load_rules, reference_rules_path

RULES = default_rules()


def chat(user: str, system: str | None = None, **extra: Any) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return {"model": "m", "messages": messages, **extra}


CASES = [
    # (system prompt, user prompt, expected task)
    ("You are a professional translator.", "The weather is nice today.", "translation"),
    ("你是一个专业的翻译。", "今天天气很好。", "translation"),
    (None, "请把下面这段话翻译成英文：我们明天开会。", "translation"),
    (None, "Translate into French: where is the station?", "translation"),
    ("Summarize the following article in three bullet points.", "Long article text ...", "summarization"),
    (None, "请总结这篇文章的要点：人工智能正在改变医疗行业。", "summarization"),
    (None, "帮我写一段摘要", "summarization"),
    (None, "TL;DR of this thread please: ...", "summarization"),
    ("You are a coding assistant.", "Make it faster.", "code"),
    (None, "Write a function that reverses a linked list in Python.", "code"),
    (None, "用Python写一个快速排序的函数", "code"),
    (None, "请帮我重构这段代码", "code"),
    (None, "Why does this fail?\n```js\nconst x = y.map(f)\n```", "code"),
    (None, "Tell me a story about a dragon who loves tea.", "chat"),
    (None, "你好，最近怎么样？", "chat"),
    ("You are a friendly assistant.", "What should I cook tonight?", "chat"),
    # the system prompt decides before the user prompt does
    ("You are a professional translator.", "Write a poem about spring.", "translation"),
    # misfires of the keyword cues, fixed (issue 28): a compound that contains a cue, a legal term
    (None, "讲一个关于程序员的故事", "chat"),  # 程序员 is a programmer, not a program
    (None, "这个程序为什么会崩溃？", "code"),
    (None, "用英文写一首关于秋天的诗", "chat"),  # writing in English is not translating
    (None, "把这句话改成英文：我很想你", "translation"),
    (None, "The court granted summary judgment for the defendant. What happens next?", "chat"),
    (None, "Give me a summary of this quarterly report.", "summarization"),
]


@pytest.mark.parametrize(("system", "user", "task"), CASES, ids=[f"{t}:{u[:24]}" for _, u, t in CASES])
def test_classifier(system: str | None, user: str, task: str) -> None:
    assert Classifier(RULES).classify(system, user) == task


def test_system_prompt_classification_is_cached() -> None:
    classifier = Classifier(RULES)
    system = "You are a professional translator."
    assert classifier.classify(system, "x") == "translation"
    assert system in classifier._system_cache
    template = classifier._system_cache[system][1]
    classifier._system_cache[system] = ("code", template)  # a cached answer is used without re-reading the cues
    assert classifier.classify(system, "x") == "code"


def test_a_system_prompt_gives_a_stable_template_id_whatever_the_user_message() -> None:
    """The template id keys what the learner knows about one application's prompts: the same for every user
    message under one system prompt, the same in another process (a digest, not Python's salted hash), none
    without a system prompt, and only the characters classification reads count."""
    classifier = Classifier(RULES)
    system = "You are a professional translator."
    task, template = classifier.classify_with_template(system, "rename x")
    assert task == "translation" and template is not None and len(template) == 16
    assert classifier.classify_with_template(system, "something else entirely")[1] == template
    assert Classifier(RULES).classify_with_template(system, "x")[1] == template  # a fresh cache, the same id
    assert classifier.classify_with_template("You are a helpful assistant.", "x")[1] != template
    assert classifier.classify_with_template(None, "def f(): pass")[1] is None
    chars = RULES.defaults.classify_chars
    long_a, long_b = "s" * chars + "tail one", "s" * chars + "tail two"
    assert classifier.classify_with_template(long_a, "x")[1] == classifier.classify_with_template(long_b, "x")[1]
    body = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]}
    assert features(body).template == template


def features(body: dict[str, Any], kind: str = "chat") -> Any:
    return extract_features(body, kind, {}, RULES, Classifier(RULES))


@pytest.mark.parametrize(
    ("extra", "expected"),
    [({}, 256), ({"max_tokens": 40}, 40), ({"max_completion_tokens": 30, "max_tokens": 99}, 99),
     ({"max_completion_tokens": 99, "max_tokens": 30}, 99)],
)  # fmt: skip
def test_max_tokens(extra: dict[str, Any], expected: int) -> None:
    """Both names at once: the larger counts (what a key is charged and capped by; gateway/bounds.py)."""
    assert features(chat("hi", **extra)).max_tokens == expected


def test_features_from_a_full_body() -> None:
    f = features(chat("Translate: hello", stream=True, n=2, temperature=0.7, model="x"))
    assert (f.model, f.stream, f.n, f.temperature, f.task) == ("x", True, 2, 0.7, "translation")
    assert f.prompt_tokens > 0


def test_completions_prompt_forms() -> None:
    assert features({"model": "m", "prompt": "Summarize: abc"}, "completions").task == "summarization"
    assert features({"model": "m", "prompt": [1, 2, 3]}, "completions").prompt_tokens == 3
    assert features({"model": "m", "prompt": [[1, 2], [3]]}, "completions").prompt_tokens == 3


def test_content_parts_are_read() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "翻译成英文：你好"}]}]}
    assert features(body).task == "translation"


BAD = [
    ({"model": 3, "messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": "m"}, "messages"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": ["hi"]}, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages"),
    (chat("x", max_tokens="10"), "max_tokens"),
    (chat("x", max_tokens=0), "max_tokens"),
    (chat("x", max_tokens=True), "max_tokens"),
    (chat("x", max_completion_tokens=-1), "max_completion_tokens"),
    (chat("x", stream="yes"), "stream"),
    (chat("x", n=0), "n"),
    (chat("x", temperature="hot"), "temperature"),
]


@pytest.mark.parametrize(("body", "param"), BAD, ids=[p for _, p in BAD])
def test_bad_fields_name_the_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        features(body)
    assert info.value.param == param
    assert info.value.status_code == 400


def test_bad_prompt() -> None:
    with pytest.raises(InvalidRequest) as info:
        features({"model": "m", "prompt": {"x": 1}}, "completions")
    assert info.value.param == "prompt"


def test_token_estimate_scales_with_script() -> None:
    assert estimate_tokens("a" * 400) == 100
    assert estimate_tokens("汉" * 300) == 200


def test_a_mixed_text_is_estimated_part_by_part() -> None:
    """An English text with one curly quote read as English (it read as CJK: 2.7x), CJK in English counted at
    the CJK rate, 2-byte scripts (accented Latin, Cyrillic) in between; a lone surrogate does not raise."""
    english = "word " * 400  # 2,000 ASCII characters: 500 tokens
    assert estimate_tokens(english + "\u201c") == 501
    assert estimate_tokens(english + "汉" * 300) == 500 + 200
    assert 500 < estimate_tokens("я" * 2000) < 1334  # between the ASCII rate and the CJK rate
    assert estimate_tokens("ab\ud800cd") >= 1


@pytest.mark.parametrize(
    "text",
    [
        "Write it in PYTHON please",
        "I love Rust and C++",
        "c# or Java?",
        "rusty pythons are not languages",
        "用Python写一个函数",
        "Plain chat about the SEA",
        "İstanbul KELVIN \u212a sign, Bash",
    ],
)
def test_lowercase_patterns_match_as_with_ignorecase(text: str) -> None:
    for cues in RULES.tasks.values():
        for source in cues.patterns:
            fast, on_lowered = compile_cue_pattern(source)
            assert on_lowered
            assert bool(fast.search(text.lower())) == bool(re.compile(source, re.I).search(text)), (source, text)


def test_patterns_with_capitals_keep_the_flag() -> None:
    pattern, on_lowered = compile_cue_pattern(r"\bSELECT\S+")
    assert not on_lowered and pattern.flags & re.I


@pytest.mark.parametrize("value", [10**400, 2**1024])
def test_temperature_past_a_double_is_an_invalid_request(value: int) -> None:
    """Found by tests/fuzz: float() of such an integer raised OverflowError (a 500), not a 400."""
    with pytest.raises(InvalidRequest, match="temperature"):
        features(chat("hi", temperature=value))


COPY_CUES = [
    # (text, whether it carries a copy cue)
    ("Fix this:\n```py\nx = 1\n```", True),
    ('Rewrite "' + "a" * 120 + '" politely', True),
    ('Rewrite "' + "a" * 119 + '" politely', False),
    ('"' + "a" * 60 + "\n" + "a" * 60 + '"', False),  # a straight-quoted passage stays on one line
    ("“" + "a" * 120 + "”", True),
    ("“" + "a" * 119 + "”", False),
    ("“" + "a" * 60 + "\n“" + "a" * 60 + "”", True),  # curly quotes span lines, and openers inside count
    ("“a” “" + "a" * 118 + "” “", False),
    ("「" + "字" * 60 + "」", True),
    ("「" + "字" * 59 + "」", False),
    ("「」" * 40 + "「" + "字" * 30 + "「" + "字" * 30 + "」", True),
    ("Reply to:\n>" + "a" * 60, True),
    ("Reply to:\n>" + "a" * 59 + "\n> b", False),
    ("x" * 7990 + "“" + "a" * 200 + "”", False),  # only the first 8,000 characters are read
    ("“" * 7000 + "”", True),
    ("“" * 8000, False),
]


@pytest.mark.parametrize(("text", "copy"), COPY_CUES, ids=[repr(t[:16]) for t, _ in COPY_CUES])
def test_copy_cue(text: str, copy: bool) -> None:
    assert has_copy_cue(text) is copy


def test_copy_cue_means_what_the_backtracking_pattern_meant() -> None:
    """The linear scan finds a long quoted passage exactly where the former (quadratic) pattern did."""
    former = re.compile(r'"[^"\n]{120,}"|“[^”]{120,}”|「[^」]{60,}」|\n>[^\n]{60,}')
    pieces = ['"', "“", "”", "「", "」", "\n", ">", "`", "a", "b" * 10, "c" * 30, "d" * 59, "e" * 119]
    rng = random.Random(27)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 30)))
        assert has_copy_cue(text) is ("```" in text or former.search(text) is not None), repr(text)


def test_the_prefix_blocks_and_session_key_are_read_only_with_a_prefix_reader() -> None:
    body = {**chat("Where is my order? " * 60, "You are the shop's assistant."), "user": "ann"}
    plain = extract_features(body, "chat", {}, RULES, Classifier(RULES))
    assert (plain.blocks, plain.session, plain.prefix_bytes, plain.cached_tokens) == ((), None, 0, None)
    reader = PrefixReader()
    features = extract_features(body, "chat", {}, RULES, Classifier(RULES, prefixes=reader))
    read = reader.chat(body["messages"], "ann", {})
    assert (features.blocks, features.session, features.prefix_bytes) == read and features.blocks
    assert read[2] == len(chat_text(body["messages"], 10**6)[0].encode())  # the whole chat was read
    completion = extract_features({"model": "m", "prompt": "x" * 2000}, "completions", {"x-session-id": "s1"}, RULES,
                                  Classifier(RULES, prefixes=reader))  # fmt: skip
    assert len(completion.blocks) == 3 and completion.session is not None and completion.session.startswith("h:")
    with pytest.raises(InvalidRequest):  # validation comes first: nothing malformed reaches the reader
        extract_features({"model": "m", "messages": [{"content": "x"}]}, "chat", {}, RULES,
                         Classifier(RULES, prefixes=reader))  # fmt: skip


@pytest.mark.parametrize(
    ("pattern", "literals"),
    [
        (r"\b(python|java)\b", ("java", "python")),
        (r"\bc(\+\+|#)", ("c#", "c++")),
        ("程序(?!员|猿)", ("程序",)),
        ("(成|为)英文", ("为英文", "成英文")),
        (r"\bsummary\b(?!\s+judge?ment)", ("summary",)),
        ("(a|b)c*d", ("a", "b")),  # up to the repeat
        ("ab?c", ("a",)),
        ("a(?i:b)c", ("a",)),  # a case-insensitive group ends them
        (r"x{2}y", None),  # a repeat first
        (r"\d+x", None),
        ("a|b+", None),  # one alternative may start with anything
        (r"\bSELECT", None),  # not run on the lower-cased text
        ("(?i)abc", None),
        ("(" + "|".join(f"{chr(97 + i % 26)}{i}" for i in range(80)) + ")", None),  # past the cap
        ("", None),
    ],
)
def test_required_literals(pattern: str, literals: tuple[str, ...] | None) -> None:
    assert required_literals(pattern) == literals


def test_a_text_without_the_required_literals_never_matches_the_pattern() -> None:
    """The prefilter is sound: over the shipped cue patterns and texts made of their own pieces, whenever a
    pattern matches, one of its literals is in the text (so skipping the search changes no classification)."""
    rng = random.Random(7)
    for rules in (RULES, load_rules(reference_rules_path())):
        for cues in rules.tasks.values():
            for source in cues.patterns:
                literals = required_literals(source)
                pattern, _ = compile_cue_pattern(source)
                words = re.findall(r"\w+", source.replace("\\b", " "))
                pieces = [*words, *source, *(literals or ()), " ", "judgment", "c++", "员"]
                matched = 0
                for _ in range(2000):
                    text = "".join(rng.choice(pieces) + rng.choice(" \n") * rng.randint(0, 1)
                                   for _ in range(rng.randint(1, 12))).lower()  # fmt: skip
                    if pattern.search(text):
                        matched += 1
                        assert literals is None or any(literal in text for literal in literals), (source, text)
                assert matched > 0, source
