"""Cheap, plausible-looking output text: one string per emulated token, from small fixed lists."""

from __future__ import annotations

import re

_EN = (
    " the",
    " model",
    " answer",
    " is",
    " a",
    " simple",
    " way",
    " to",
    " think",
    " about",
    " it",
    ".",
    " When",
    " you",
    " look",
    " at",
    " this",
    " question",
    ",",
    " there",
    " are",
    " two",
    " main",
    " points",
    " first",
    " of",
    " all",
    " we",
    " can",
    " see",
    " that",
    " and",
    " then",
    " more",
    " details",
    " follow",
)
_ZH = tuple("这是一个简单的回答我们可以从两个方面来看首先其次需要注意的是，总之问题方法结果。")
# Each piece is one token as the emulator's tokenizer cuts text (backends.emulator.extras): a word, a CJK
# character or a punctuation mark with the whitespace before it. So the tokenizer, the prompt counter
# (backends.workloads.loader.count_tokens) and the streams agree on how many tokens a text is.
_CODE = (
    "def",
    " result",
    "(",
    "items",
    ")",
    ":",
    "\n    for",
    " item",
    " in",
    " items",
    ":",
    "\n        if",
    " item",
    " is",
    " not",
    " None",
    ":",
    "\n            result",
    ".",
    "append",
    "(",
    "item",
    ")",
    "\n    return",
    " result",
)
_CJK = re.compile(r"[\u3400-\u9fff]")
_CODE_HINT = re.compile(r"```|\bdef |\bfunction\b|\bclass |#include|\bSELECT\b|=>|代码|函数", re.IGNORECASE)

STYLES = {"en": _EN, "zh": _ZH, "code": _CODE}
# The piece that starts a style's list again after a full turn, where its first piece would run into the
# last one (`` result`` + ``def`` would read as one word).
_AGAIN = {"code": "\n\ndef"}
# Every piece an answer is made of, each style's in order, once.
PIECES = tuple(dict.fromkeys([*_EN, *_ZH, *_CODE, *_AGAIN.values()]))


def style_for(task: str | None, prompt_text: str) -> str:
    """Pick a text style: code for code tasks or code-looking prompts, zh for Chinese prompts, else en."""
    if task == "code" or (task is None and _CODE_HINT.search(prompt_text)):
        return "code"
    return "zh" if _CJK.search(prompt_text) else "en"


def token_text(style: str, start: int, count: int) -> str:
    """The text of tokens ``start .. start + count - 1`` of an output in ``style``."""
    words = STYLES[style]
    size, again = len(words), _AGAIN.get(style, words[0])
    return "".join(
        words[index % size] if index % size or index < size else again for index in range(start, start + count)
    )
