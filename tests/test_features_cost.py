"""Feature extraction takes time linear in the body, whatever its text (issue #27, item 3).

Features are read before a request is routed, for every tenant alike, so a text that makes one regex backtrack
(``“[^”]{120,}”`` over 8,000 ``“`` cost 16-38 ms a message) stalls the gateway for all. Every regex that reads
request text gets adversarial input: the copy cue's delimiters, and for every cue pattern of each shipped rules
file the characters, words and literal pieces of its own text (and each keyword's characters, for the substring
scans), each repeated, and seeded pairs of them. Each text fills a chat body's system prompt and user message
(24 KB each); extraction is timed against plain text of the same size, with a fresh classifier (a flood of
distinct system prompts misses its cache).
"""

from __future__ import annotations

import random
import re
import time
from typing import Any

import pytest

from gateway.features import Classifier, extract_features
from gateway.rules import RoutingRules, default_rules_path, load_rules, reference_rules_path

SIZE = 24_000  # UTF-8 bytes of each message
BUDGET_US_PER_KB = 50.0  # adversarial text may cost this per KB, or RATIO x plain text, whichever is more
RATIO = 5.0
REPEAT = 5  # best of this many timings, each of adversarial and plain text, interleaved
ATTEMPTS = 3  # an input over budget is measured again (a noisy machine), and fails only if over every time
PLAIN = "the quick brown fox jumps over the lazy dog. "
COPY_TOKENS = [  # has_copy_cue's delimiters, alone and with content just short of a long passage
    '"', "“", "”", "「", "」", "\n", ">", "\n>", "`", "``", "“”", "「」", "”“", "」「", '"\n',
    '"' + "a" * 119 + "\n", "“" + "a" * 119, "「" + "a" * 59, "\n>" + "a" * 59, '"' + "a" * 200,
]  # fmt: skip
RULES_FILES = {"rules.yaml": default_rules_path(), "rules-reference.yaml": reference_rules_path()}


def fill(unit: str) -> str:
    return unit * max(1, SIZE // len(unit.encode()))


def pattern_tokens(pattern: str) -> set[str]:
    """Each character of a pattern's text (metacharacters too), its words, and its literal pieces."""
    pieces = re.split(r"[|()\[\]{}?*+^$\\]", pattern)
    return (set(pattern) | set(re.findall(r"\w+", pattern)) | set(pieces)) - {""}


def adversarial_texts(rules: RoutingRules, pairs: int = 40) -> dict[str, str]:
    tokens = set(COPY_TOKENS)
    for cues in rules.tasks.values():
        for pattern in cues.patterns:
            tokens |= pattern_tokens(pattern)
        for keyword in cues.keywords:  # substring scans, not regexes: each character, and all but the last
            tokens |= set(keyword.lower()) | {keyword.lower()[:-1]} - {""}
    ordered = sorted(tokens)
    rng = random.Random(27)
    units = ordered + [rng.choice(ordered) + rng.choice(ordered) for _ in range(pairs)]
    return {repr(unit)[:40]: fill(unit) for unit in units}


def chat(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": text}, {"role": "user", "content": text}]}


def seconds(body: dict[str, Any], rules: RoutingRules) -> float:
    start = time.perf_counter()
    extract_features(body, "chat", {}, rules, Classifier(rules))
    return time.perf_counter() - start


def over_budget(body: dict[str, Any], plain: dict[str, Any], kb: float, rules: RoutingRules) -> str | None:
    """None when ``body`` costs at most the budget per KB against ``plain`` (best of REPEAT interleaved timings)
    on one of ATTEMPTS measurements; else the last measurement, in words."""
    cost = base = 0.0
    for _ in range(ATTEMPTS):
        times = [(seconds(body, rules), seconds(plain, rules)) for _ in range(REPEAT)]
        cost, base = (min(t[i] for t in times) * 1e6 / kb for i in (0, 1))
        if cost <= max(BUDGET_US_PER_KB, RATIO * base):
            return None
    return f"{cost:.0f} us/KB against {base:.0f} for plain text"


@pytest.mark.parametrize("name", sorted(RULES_FILES))
def test_feature_extraction_is_linear_on_adversarial_text(name: str) -> None:
    rules = load_rules(RULES_FILES[name])
    slow = {}
    for label, text in adversarial_texts(rules).items():
        size = len(text.encode())
        measured = over_budget(chat(text), chat(fill(PLAIN)[:size]), size / 1000, rules)
        if measured is not None:
            slow[label] = measured
    assert not slow, f"over {BUDGET_US_PER_KB:.0f} us/KB and {RATIO:.0f}x plain text: {slow}"


@pytest.mark.parametrize("unit", ["“", "「"], ids=["curly", "corner"])
def test_content_parts_of_openers_cost_no_more(unit: str) -> None:
    """The openers as one content part each: the user message is their join, with a newline between each."""
    rules = load_rules(default_rules_path())
    parts = [{"type": "text", "text": unit}] * (SIZE // len(unit.encode()))
    body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    size = len("\n".join(unit for _ in parts).encode())
    plain = {"model": "m", "messages": [{"role": "user", "content": fill(PLAIN)[:size]}]}
    measured = over_budget(body, plain, size / 1000, rules)
    assert measured is None, measured
