"""Reading a request's text: what it asks for, what it pastes, how long it wants the answer.

The last user message is split into an instruction and pasted **material** (fenced blocks, long quotes, the
passage after a short lead line, a colon or a question, the whole message when the system prompt holds the
instruction and the message does not address the assistant itself). The **intent** is the verb at the head
of the instruction's last instructing clause (English: among its first words after "please", "can you";
unspaced scripts: at the clause's start or after an opener such as 请, 把, 帮我), else the system prompt's
role, else what the structure says: an imperative over material changes it, a question about it comments
on it, bare code is continued, a request without material composes new text. Intents: transform the
material in place (rewrite, fix, refactor), translate it, extract from it, condense it, comment on it
(review, explain), continue it, compose something new.

The cue lists are the emulator's own description of the world (what an engine's answer does), not the
gateway's: the gateway never sees them and learns from traffic. Pure, no I/O; linear in the text and bounded
(``READ_CHARS`` per message, ``HISTORY_MESSAGES`` earlier turns).
"""

from __future__ import annotations

import hashlib
import random
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

READ_CHARS = 16_000  # characters of a message read
HISTORY_MESSAGES = 32  # earlier turns read

TRANSFORM, TRANSLATE, EXTRACT, CONDENSE, COMMENT, CONTINUE, COMPOSE = (
    "transform", "translate", "extract", "condense", "comment", "continue", "compose",
)  # fmt: skip
INTENTS = (TRANSFORM, TRANSLATE, EXTRACT, CONDENSE, COMMENT, CONTINUE, COMPOSE)  # ties: the earlier wins

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")
_TOKEN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]|\w+|[^\w\s]")
_LATIN = re.compile(r"[A-Za-z\u00c0-\u024f]")
_LETTER = re.compile(r"[^\W\d_]")


def count_tokens(text: str) -> int:
    """A cheap token estimate: one per CJK character, word or punctuation mark."""
    return len(_TOKEN.findall(text))


def split_tokens(text: str) -> list[str]:
    """The tokens :func:`count_tokens` counts, in order (the emulator's prefix cache hashes them)."""
    return _TOKEN.findall(text)



# --- what the instruction asks: a verb at the head of a clause ---------------------------------------------

_EN = re.IGNORECASE
_INTENT_CUES: Mapping[str, re.Pattern[str]] = {
    TRANSFORM: re.compile(
        r"\b(re-?write|rephrase|paraphrase|reword|edit|fix|correct|proofread|polish|refactor|convert|reformat|"
        r"restructure|rename|replace|modify|change|update|clean up|tidy|simplify|port|migrate|redact|"
        r"anonymi[sz]e|normali[sz]e|make (?:it|this|them|the)|turn (?:it|this|them)|add (?:type|types|comments|"
        r"a docstring|docstrings|error handling|logging)|remove)\b|"
        r"改写|改成|改为|改一下|重写|润色|修改|修正|修复|纠正|订正|校对|改错|转换|转成|转为|格式化|重构|替换|"
        r"删掉|删除|去掉|优化|简化|编辑|调整",
        _EN,
    ),
    TRANSLATE: re.compile(r"\btranslat\w*|翻译|译成|译为|翻成|译作", _EN),
    EXTRACT: re.compile(
        r"\b(extract|pull out|list (?:all|every|each) |find (?:all|every) |fill in|parse|as json|into json|"
        r"to json|as a table|as csv|tabulate)|提取|抽取|摘出|找出|列出[^，。]{0,10}所有|列出其中|以 ?json",
        _EN,
    ),
    CONDENSE: re.compile(
        r"\b(summar(?:y|ies|i[sz]\w*)|tl;?dr|condense|shorten|key points|main points|gist|recap|boil down|"
        r"abstract of)\b|"
        r"总结|概括|摘要|归纳|提炼|要点|缩写|精简|概述|简述",
        _EN,
    ),
    COMMENT: re.compile(
        r"\b(review|explain|critique|analy[sz]e|evaluate|assess|feedback|grade|what does|what is wrong|"
        r"what's wrong|why does|why is|why do|find (?:the )?bugs?|point out)\b|"
        r"审查|审阅|评审|点评|解释|分析|评价|评估|说明|讲解|为什么|什么意思|有什么问题|哪里有问题|有没有问题|"
        r"检查|指出",
        _EN,
    ),
    CONTINUE: re.compile(
        r"\b(complet(?:e|ion)|continue|finish|autocomplete|carry on)\b|补全|续写|接着写|继续写|补完", _EN
    ),
    COMPOSE: re.compile(
        r"\b(write|compose|create|draft|generate|tell|suggest|recommend|plan|design|implement|build|"
        r"brainstorm|describe|invent|imagine|list)\b|"
        r"(?<![改重续缩编描抄])写|编(?![辑程码号译])|讲(?!解)|创作|设计|实现|推荐|建议|规划|描述|列举|介绍",
        _EN,
    ),
}


_CLAUSE = re.compile(r"[.!?。！？；;:：\n，,—–]+")
_OPENER_EN = re.compile(
    r"^(?:(?:please|pls|kindly|now|actually|also|then|and|so|ok|okay|hey|hi|just|you|can you|could you|"
    r"would you|will you|i need you to|i want you to|i'd like you to|help me|your task is to|you will|"
    r"you should|you must)\b[\s,]*)+",
    _EN,
)
_OPENER_ZH = re.compile(
    r"^(?:请你?|帮我|帮忙|麻烦你?|你能|你可以|你|能不能|能否|可以|再|把|用|将|给|从|现在|然后|接着|另外|也)"
)


def _cues(text: str) -> list[tuple[int, int, str]]:
    """Every cue in ``text``: (position, rank, intent), rank 0 for the most specific intent."""
    return sorted((m.start(), rank, intent) for rank, intent in enumerate(INTENTS)
                  for m in _INTENT_CUES[intent].finditer(text))  # fmt: skip


_HEAD_WORDS = re.compile(r"(?:\S+\s+){0,3}")  # an English instruction's verb: among its first four words
_NARRATED = re.compile(r"[了过着]")  # 修复了: something done, not asked for


def _cue_end(clause: str, cue: tuple[int, int, str]) -> int:
    match = _INTENT_CUES[cue[2]].match(clause, cue[0])
    return match.end() if match else cue[0]


def clause_intent(clause: str) -> str | None:
    """The intent a clause asks for when it is an instruction: English with a cue among its first words
    (after "please", "can you", ...: "give me the key points"), unspaced text with a cue at its start or
    after an opener such as 请 / 把 / 帮我 (then its first cue); None for a clause that only mentions a verb
    ("a function that parses")."""
    clause = clause.strip()
    if not clause:
        return None
    if _CJK.match(clause):
        opened = _OPENER_ZH.match(clause) is not None
        cues = [cue for cue in _cues(clause) if not _NARRATED.match(clause, _cue_end(clause, cue))]
        if cues and (opened or cues[0][0] == 0):
            return cues[0][2]
        return None
    opener = _OPENER_EN.match(clause)
    head = clause[opener.end() if opener else 0 :]
    words = _HEAD_WORDS.match(head)
    cues = [cue for cue in _cues(head) if cue[0] <= (words.end() if words else 0)]
    return cues[0][2] if cues else None


_ADDRESSED = re.compile(r"\b(?:you|me)\b|[你我]", _EN)


def addresses_assistant(text: str) -> bool:
    """Whether some clause of ``text`` asks the assistant itself for something ("write me", "can you",
    "你能给我"): what tells a request apart from pasted text that happens to hold an imperative."""
    return any(clause_intent(c) and _ADDRESSED.search(c) for c in _CLAUSE.split(text))


def instruction_intent(text: str) -> str | None:
    """The intent of the last clause of ``text`` that gives an instruction, or None when none does."""
    found = None
    for clause in _CLAUSE.split(text):
        found = clause_intent(clause) or found
    return found


def role_intent(system: str) -> str | None:
    """What a system prompt sets the assistant to do: its most specific cue anywhere (a role names its task
    with a noun as often as with a verb: "You write TL;DR summaries", "你是代码审查助手")."""
    cues = _cues(system)
    return min(cues, key=lambda cue: cue[1])[2] if cues else None


# --- how long the answer is asked to be ---------------------------------------------------------------------

_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
            "nine": 9, "ten": 10, "twelve": 12, "fifteen": 15, "twenty": 20, "thirty": 30, "fifty": 50,
            "一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9,
            "十": 10, "十五": 15, "二十": 20, "三十": 30, "五十": 50}  # fmt: skip
_WORD_ANSWER = re.compile(
    r"\b(one|a single|single|1) (word|number|digit|letter|label|emoji|name)\b|\byes or no\b|\byes/no\b|"
    r"\btrue or false\b|\b(just|only) (the|a|one) (number|name|word|answer|label|letter|date|city)\b|"
    r"\b(number|name|word|label|emoji|date) only\b|\b(reply|answer|respond|output) (only )?with \w+(, \w+)+,? or \w+\b|"
    r"一个(词|字|数字|数|词语|单词|选项|字母|表情)|是或否|是还是否|对还是错|"
    r"只(回答|输出)[^，。,.]{0,12}(几|数字|日期|名字|名称)|只输出[:：]|只输出\S{0,4}[\"“「][^\"”」]{1,6}[\"”」][、,，或]",
    _EN,
)
_SENTENCE_ANSWER = re.compile(
    r"\b(one|a single|in one|1) (short )?(sentence|line|expression)\b|一句话|一条|一行", _EN
)
_BOUNDED = re.compile(
    r"\b(?:at most|no more than|under|in|within|fewer than|max(?:imum)?(?: of)?) (\d+|[a-z]+) words\b|"
    r"不超过(\d+|[一二两三四五六七八九十]+)个?(?:字|词)",
    _EN,
)


def asked_length(instruction: str) -> tuple[int, int] | None:
    """The range of tokens an instruction asks the answer to stay within, or None when it does not say."""
    if _WORD_ANSWER.search(instruction):
        return 1, 4
    bounded = _BOUNDED.search(instruction)
    if bounded:
        word = (bounded.group(1) or bounded.group(2) or "").lower()
        limit = int(word) if word.isdigit() else _NUMBERS.get(word)
        if limit:
            return max(1, round(limit * 0.6)), limit + 1
    if _SENTENCE_ANSWER.search(instruction):
        return 8, 25
    return None


# --- material: what the request pastes for the answer to work on --------------------------------------------

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_QUOTE = re.compile(r"\"[^\"\n]{40,}\"|(?<!\w)'[^\n]{40,}?'(?!\w)|“[^”]{24,}”|「[^」]{16,}」|『[^』]{16,}』")
_LEAD_COLON = re.compile(r"[:：]")
_LABEL = re.compile(r"[0-9一二三四五六七八九十]\s*$")  # "Review 1:", "评价一：" label a part, not an instruction
_CODE_LINE = re.compile(
    r"^\s*(def |class |import |from \S+ import|return\b|func |fn |let |const |var |public |private |#include|"
    r"select |insert |update |create |for .*[:{]\s*$|if .*[:{]\s*$|while .*[:{]\s*$|[{}])|[;{}]\s*$|=>|->|:=|==",
    re.IGNORECASE,
)
_CODE_REQUEST = re.compile(
    r"\b(python|javascript|typescript|java|golang|rust|kotlin|swift|ruby|php|scala|haskell|sql|bash|shell|"
    r"powershell|html|css|regex|json|yaml|dockerfile|c\+\+|c#|function|method|class|script|query|snippet|"
    r"program|algorithm|api|endpoint|unit tests?|pytest|struct|workflow)\b|\w\(\)|\w+_\w+\(|::|"
    r"代码|函数|脚本|程序(?!员)|算法|接口|正则|结构体|类型注解|单元测试|\bSQL\b",
    _EN,
)


@dataclass(frozen=True, slots=True)
class Split:
    """The last user message as the instruction it gives and the material it pastes."""

    instruction: str
    material: str
    fenced: int  # characters of the material inside code fences


def split_message(system: str, user: str) -> Split:
    """Cut ``user`` into instruction and material (see the module's docstring)."""
    fences = [m.group(0) for m in _FENCE.finditer(user)]
    if fences:
        fenced, rest = "".join(fences), _FENCE.sub(" ", user)
        return Split(rest, fenced + "".join(_QUOTE.findall(rest)), len(fenced))
    lead = _lead(user)
    if lead is not None:
        return Split(user[:lead], user[lead:], 0)
    if role_intent(system) not in (None, COMPOSE) and not addresses_assistant(user):
        return Split("", user, 0)  # the system prompt says what to do with whatever the user sends
    return Split(user, "".join(_QUOTE.findall(user)), 0)


def _lead(user: str) -> int | None:
    """Where the material starts after a lead that gives the instruction: a first line ending in a colon,
    or an instruction or a question followed by a blank line, or an instruction before a colon on the
    first line."""
    newline = user.find("\n")
    if newline > 0 and count_tokens(user[:newline]) <= 60 and user[newline:].strip():
        lead = user[:newline].rstrip()
        asks = instruction_intent(lead) is not None or _QUESTION.search(lead) is not None
        if lead.endswith((":", "：")) or (user[newline:].startswith("\n\n") and asks):
            return newline
    colon = _LEAD_COLON.search(user, 0, newline if newline > 0 else 160)
    if colon is None or not user[colon.end() :].strip() or _LABEL.search(user, 0, colon.start()):
        return None
    return colon.end() if instruction_intent(user[: colon.start()]) else None


# --- reading a request --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reading:
    """What a request's text says about speculation on its answer."""

    intent: str
    material_tokens: int
    code_material: float  # share of the material that is code
    code_answer: bool
    script: str  # the answer's: latin, cjk or other
    source_script: str  # the material's
    redundancy: float  # the material's repetitiveness (see :func:`redundancy`); 0 without material
    invariant: float  # share of the material's tokens that survive translation (code, numbers, identifiers)
    history_tokens: int
    asked: tuple[int, int] | None  # tokens the instruction asks the answer to stay within
    seed: int  # from a hash of the messages: the request's own noise

    @property
    def presence(self) -> float:
        """How much the answer rests on the material, 0 (none) to 1: a rewrite or a translation is its
        material whatever its size; a summary or a review of a few words is mostly new text."""
        if self.intent in (TRANSFORM, TRANSLATE):
            return 1.0 if self.material_tokens else 0.0
        return min(1.0, self.material_tokens / 24)


def read_request(messages: Sequence[Mapping[str, Any]]) -> Reading:
    """Read a chat (system prompt, earlier turns, last user message) into a :class:`Reading`."""
    system, history, user = _parts(messages)
    split = split_message(system, user)
    material = split.material
    named = instruction_intent(split.instruction) or role_intent(system)
    intent = named or _bare(split, material)
    if not material and history and intent not in (COMPOSE, CONTINUE):
        material = history[-1]  # "translate that", "shorten your answer": the text is the last turn's
    code_material = _code_share(material, split.fenced)
    instruction = f"{system}\n{split.instruction}"
    return Reading(
        intent=intent,
        material_tokens=count_tokens(material),
        code_material=code_material,
        code_answer=_code_answer(intent, named is not None, material, code_material, instruction),
        script=_answer_script(intent, split.instruction or user, system, material),
        source_script=script_of(material),
        redundancy=redundancy(material),
        invariant=_invariant(material, code_material),
        history_tokens=sum(count_tokens(text) for text in history),
        asked=asked_length(instruction),
        seed=_seed(messages),
    )


_QUESTION = re.compile(
    r"[?？]|吗|什么|为什么|怎么|如何|哪|^\s*(?:what|why|how|is|are|does|do|can|could|should|which|who|when|where)\b",
    re.IGNORECASE | re.MULTILINE,
)


def _bare(split: Split, material: str) -> str:
    """The intent when no verb names one. Without material: new text. With material: bare code is
    continued, bare text commented on; a question about the material is answered about it, and any other
    request over it (an imperative whose verb no list holds: "restore", "add a flag") changes it."""
    if not material:
        return COMPOSE
    if not split.instruction.strip():
        return CONTINUE if _code_share(material, split.fenced) >= 0.5 else COMMENT
    return COMMENT if _QUESTION.search(split.instruction) else TRANSFORM


def _parts(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[str], str]:
    """The system prompt, the earlier turns and the last user message (each read up to ``READ_CHARS``)."""
    texts = [(str(m.get("role", "")), _text(m.get("content"))[:READ_CHARS]) for m in messages]
    system = "\n".join(text for role, text in texts if role in ("system", "developer"))
    last = max((i for i, (role, _) in enumerate(texts) if role == "user"), default=len(texts) - 1)
    user = texts[last][1] if texts else ""
    history = [text for i, (role, text) in enumerate(texts) if i != last and role not in ("system", "developer")]
    return system, history[-HISTORY_MESSAGES:], user


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def _code_share(material: str, fenced: int) -> float:
    if not material:
        return 0.0
    if fenced:
        return min(1.0, fenced / len(material))
    lines = [line for line in material.splitlines() if line.strip()]
    code = sum(len(line) for line in lines if _CODE_LINE.search(line))
    return code / max(1, sum(len(line) for line in lines))


def _code_answer(intent: str, named: bool, material: str, code_material: float, instruction: str) -> bool:
    """Whether the answer is code: code material transformed or continued, or code asked for (not when the
    request pastes code and names nothing to do with it: then it talks about the code)."""
    if intent in (TRANSFORM, CONTINUE, TRANSLATE, EXTRACT) and material:
        return code_material >= 0.5
    asked = intent in (COMPOSE, CONTINUE, TRANSFORM) and bool(_CODE_REQUEST.search(instruction))
    return asked and (named or not material)


def script_of(text: str) -> str:
    """latin, cjk or other: the script of most of a text's letters (latin when it has none)."""
    sample = text[:2000]
    letters = len(_LETTER.findall(sample))
    if not letters:
        return "latin"
    cjk = len(_CJK.findall(sample))
    if cjk >= 0.3 * letters:
        return "cjk"
    return "latin" if len(_LATIN.findall(sample)) >= 0.5 * letters else "other"


_TO_CJK = re.compile(r"\b(?:into|to|in) (?:simplified |traditional )?(?:chinese|mandarin|japanese|korean)\b|"
                     r"成(?:中文|汉语|日文|日语|韩文|韩语|简体|繁体)", _EN)  # fmt: skip
_TO_LATIN = re.compile(r"\b(?:into|to|in) (?:english|french|german|spanish|italian|portuguese|dutch)\b|"
                       r"成(?:英文|英语|法语|法文|德语|德文|西班牙语|意大利语)", _EN)  # fmt: skip


def _answer_script(intent: str, instruction: str, system: str, material: str) -> str:
    if intent != TRANSLATE:
        return script_of(instruction)
    asked = f"{system}\n{instruction}"
    if _TO_CJK.search(asked):
        return "cjk"
    if _TO_LATIN.search(asked):
        return "latin"
    return "latin" if script_of(material) == "cjk" else "cjk"


def redundancy(text: str) -> float:
    """How repetitive a text is: 1 - its zlib-compressed size over that of its tokens shuffled (the same
    symbols, no repeats beyond chance), so short texts are not penalised for zlib's fixed cost; 0 for text
    too short to tell."""
    tokens = _TOKEN.findall(text[:READ_CHARS])
    if len(tokens) < 12:
        return 0.0
    shuffled = tokens[:]
    random.Random(len(tokens)).shuffle(shuffled)
    own = len(zlib.compress(" ".join(tokens).encode("utf-8"), 6))
    baseline = len(zlib.compress(" ".join(shuffled).encode("utf-8"), 6))
    return max(0.0, 1.0 - own / baseline)


_INVARIANT = re.compile(r"\d|[_.()/`]|^[A-Z]{2,}$")


def _invariant(material: str, code_material: float) -> float:
    """The share of the material a translation keeps as it is: code, numbers, identifiers, URLs."""
    tokens = _TOKEN.findall(material)
    if not tokens:
        return 0.0
    if script_of(material) == "cjk":  # Latin words inside Chinese text survive too
        kept = sum(1 for t in tokens if _INVARIANT.search(t) or (t.isascii() and t.isalpha()))
    else:
        kept = sum(1 for t in tokens if _INVARIANT.search(t))
    return min(0.9, max(code_material, kept / len(tokens)))


def _seed(messages: Sequence[Mapping[str, Any]]) -> int:
    digest = hashlib.blake2b(digest_size=8)
    for message in messages:
        digest.update(str(message.get("role", "")).encode())
        digest.update(b"\x00")
        digest.update(_text(message.get("content")).encode("utf-8", "replace"))
        digest.update(b"\x01")
    return int.from_bytes(digest.digest(), "big")
