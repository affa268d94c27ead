"""What a request's text says about speculation on it: cheap content features for the per-request predictor.

Pure (no I/O, no clock), bounded in how much text it reads and linear in it, and stable across processes
(the learned weights are shared between gateway replicas through Redis): words are hashed with CRC-32 of
their UTF-8 bytes, never with Python's per-process ``hash()``.

A request becomes a set of active **slots**, each a binary feature, in two regions:

- **text** (``TEXT_SLOTS``): hashed word unigrams and bigrams of the system prompt (its first
  ``SYSTEM_CHARS`` characters, cached per prompt, bounded) and of the last user message (its first
  ``HEAD_CHARS`` and last ``TAIL_CHARS`` characters, where instructions sit: "rewrite the following", "fix
  this", "write a story"; word bigrams over its first ``USER_BIGRAMS`` words); runs of CJK (or other
  unspaced) text give character bigrams. Digits read as 0, so
  numbers generalise. Nothing here is a hand-written cue list: which words matter is learned.
- **units** (``UNIT_SLOTS``): one slot per bucket of generic structure: prompt size, ``max_tokens``, the
  user message's length, its length against ``max_tokens``, the share of it inside code fences, the share
  after its first line (a short instruction over a pasted passage), the share of non-ASCII script, the
  prompt before it (system prompt and earlier turns), ``n``, temperature, and three crossings (passage and
  code share by length, ``max_tokens`` by greedy decoding).

The **segment** slots (a bias, the keyword task, the copy cue) are kept apart: the predictor learns them
too, but what it adds to the latency model is the rest, the request's deviation from its segment.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import and_, itemgetter, rshift, xor
from typing import Protocol, TypeVar

_T = TypeVar("_T")

TEXT_SLOTS = 4096  # hashed n-grams (a power of two: a slot is a hash's low bits)
_TEXT_MASK = TEXT_SLOTS - 1
SYSTEM_CHARS = 256  # characters of the system prompt read (its n-grams are cached per prompt)
SYSTEM_WORDS = 32  # words of it hashed (bigrams over the first half)
HEAD_CHARS = 128  # characters read at the start of the last user message ...
TAIL_CHARS = 64  # ... and at its end, when it is longer than both
USER_WORDS = 32  # words of those hashed at most (~21 + ~10 in English)
USER_BIGRAMS = 0  # word bigrams over its first words: none (~1 us a request, and no gain measured on the
# synthetic checks); CJK runs give character bigrams whatever this says
STRUCTURE_CHARS = 8000  # characters the structural shares read
SCRIPT_CHARS = 256  # characters the script share reads
CJK_LEAD, CJK_END = 10, 5  # character bigrams taken from the start and the end of one unspaced run
_CACHE_LIMIT = 1024  # system prompts cached (emptied when full), as the Classifier's cache
_SYSTEM_SALT = 0x5BD1E995  # system-prompt n-grams in other slots than the user message's
_BIGRAM_SHIFT = 7

# The units region: each family a run of slots, one per bucket, after the text region.
_FAMILIES = (
    ("bias", 1), ("task", 32), ("copy", 1), ("prompt", 16), ("max_tokens", 16), ("user", 16), ("ratio", 16),
    ("fence", 5), ("passage", 5), ("script", 4), ("n", 1), ("temperature", 5), ("history", 16),
    ("passage_x_user", 5 * 8), ("fence_x_user", 5 * 8), ("max_tokens_x_greedy", 24),
)  # fmt: skip
_BASE: dict[str, int] = {}
_next = TEXT_SLOTS
for _name, _size in _FAMILIES:
    _BASE[_name] = _next
    _next += _size
UNIT_SLOTS = _next - TEXT_SLOTS
SLOTS = _next  # every slot: the predictor's weight arrays are this long
BIAS = _BASE["bias"]
SEGMENT_END = _BASE["copy"] + 1  # the bias, the task's and the copy cue's slots lie in [BIAS, SEGMENT_END)
_TASK, _COPY, _PROMPT, _MAX, _USER = _BASE["task"], _BASE["copy"], _BASE["prompt"], _BASE["max_tokens"], _BASE["user"]
_RATIO, _FENCE, _PASSAGE, _SCRIPT = _BASE["ratio"], _BASE["fence"], _BASE["passage"], _BASE["script"]
_N, _TEMP, _HISTORY = _BASE["n"], _BASE["temperature"], _BASE["history"]
_PASSAGE_X, _FENCE_X, _OUTPUT = _BASE["passage_x_user"], _BASE["fence_x_user"], _BASE["max_tokens_x_greedy"]

# ASCII letters to lower case, digits to 0, ASCII punctuation to spaces; bytes >= 0x80 (other scripts) kept
_PUNCT = b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
_FOLD = bytes.maketrans(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" + _PUNCT, b"abcdefghijklmnopqrstuvwxyz" + b"0" * 10 + b" " * len(_PUNCT)
)


def is_unit(slot: int) -> bool:
    return slot >= TEXT_SLOTS


class Picker(Protocol):
    """A request's slots' values out of a per-slot table (an ``itemgetter`` of its slots)."""

    def __call__(self, table: Sequence[_T], /) -> tuple[_T, ...]: ...


@dataclass(slots=True)  # not frozen: made per request, and a frozen __init__ costs ~4x; never mutated
class Content:
    """One request's content features: its active slots, its segment's slots apart."""

    slots: tuple[int, ...]  # structure and text: what tells this request from others of its segment; a slot
    # twice (a word said twice, two n-grams hashed alike) is a feature of value 2
    segment: tuple[int, ...]  # the bias, the task's slot and, with the copy cue, its slot
    units: int  # how many of ``slots`` are units (the rest are text n-grams): the prior's size
    max_tokens: int  # per sequence: an output this long was cut (censored)
    sequences: int  # sequences generated (n x prompts): output tokens are counted over all of them
    # ``slots``' values out of a per-slot table, as a tuple (``itemgetter``: the predictor's sums read a tuple
    # of floats, ~3x faster than summing a map over the table)
    pick: Picker

    def __init__(
        self, slots: tuple[int, ...], segment: tuple[int, ...], units: int, max_tokens: int, sequences: int,
        pick: Picker,
    ) -> None:  # fmt: skip
        # written out: see gateway.features.RequestFeatures.__init__
        self.slots, self.segment, self.units, self.max_tokens = slots, segment, units, max_tokens
        self.sequences, self.pick = sequences, pick


class ContentReader:
    """Reads :class:`Content` from a request's texts. Holds a bounded cache of system prompts' n-gram slots
    (and the tasks' slots), so one reader belongs to one owner (the classifier of a rules set)."""

    def __init__(self) -> None:
        self._system: dict[str, tuple[int, ...]] = {}
        self._tasks: dict[str, int] = {}

    def read(
        self, system: str | None, user: str | None, task: str, copy: bool, prompt_tokens: int, max_tokens: int,
        n: int = 1, temperature: float | None = None, sequences: int | None = None,
    ) -> Content:  # fmt: skip
        """The request's content features. One function, not one per part: this runs on every request
        (~5-7 us), and each Python call costs ~0.1 us."""
        user = user or ""
        slots = self._structure(user, prompt_tokens, max_tokens, n, temperature)
        units = len(slots)
        if user:
            if len(user) > HEAD_CHARS + TAIL_CHARS:  # its head and its tail, each cut at a space
                head, tail = user[:HEAD_CHARS], user[-TAIL_CHARS:]
                cut = head.rfind(" ")
                user = f"{head[:cut] if cut > 0 else head}\n{tail[tail.find(' ') + 1 :]}"
            hashes = list(map(zlib.crc32, _words(user)[:USER_WORDS]))
            first = hashes[: USER_BIGRAMS + 1]
            if len(first) > 1:  # bigrams: one hash's high bits with the next one's low bits
                hashes += map(xor, map(rshift, first, repeat(_BIGRAM_SHIFT)), first[1:])
            # not deduplicated (a set costs ~2 us here): a word twice counts twice, in predictions and learning
            slots += map(and_, hashes, repeat(_TEXT_MASK))
        if system:
            slots += self._system_slots(system)
        task_slot = self._tasks.get(task)
        if task_slot is None:
            task_slot = self._tasks[task] = _TASK + zlib.crc32(task.encode("utf-8", "replace")) % 32
        segment = (BIAS, task_slot, _COPY) if copy else (BIAS, task_slot)
        found = tuple(slots)
        count = sequences if sequences is not None else n
        return Content(found, segment, units, max_tokens, count, itemgetter(*found))

    def _system_slots(self, system: str) -> tuple[int, ...]:
        key = system[:SYSTEM_CHARS]
        found = self._system.get(key)
        if found is None:
            hashes = list(map(zlib.crc32, _words(key)[:SYSTEM_WORDS]))
            half = hashes[: SYSTEM_WORDS // 2 + 1]
            hashes += map(xor, map(rshift, half, repeat(_BIGRAM_SHIFT)), half[1:])
            found = tuple({(h ^ _SYSTEM_SALT) & _TEXT_MASK for h in hashes})
            if len(self._system) >= _CACHE_LIMIT:
                self._system.clear()
            self._system[key] = found
        return found

    @staticmethod
    def _structure(user: str, prompt_tokens: int, max_tokens: int, n: int, temperature: float | None) -> list[int]:
        """The structure slots (always 12, 13 with ``n > 1``: never fewer than two, which ``itemgetter``
        needs to return a tuple)."""
        head = user[:STRUCTURE_CHARS]
        size = len(head) or 1
        fence = 0
        if "`" in head:
            parts = head.split("```")
            fence = 4 * sum(map(len, parts[1::2])) // size  # 0..4
        first_line = head.find("\n")
        passage = 0 if first_line < 0 else 4 * (size - first_line) // size  # 0..4
        if head.isascii():
            script, user_tokens = 0, (len(user) + 3) // 4
        else:
            script, user_tokens = _script(head[:SCRIPT_CHARS]), (len(user) * 2 + 2) // 3
        length = user_tokens.bit_length()  # conditionals, not min() and max(): this runs per request
        if length > 15:
            length = 15
        octave = length >> 1  # 0..7
        max_bits = max_tokens.bit_length()
        prompt_bits = prompt_tokens.bit_length()
        history = prompt_tokens - user_tokens  # the system prompt, earlier turns
        history_bits = history.bit_length() if history > 0 else 0
        ratio = max_bits - length + 8
        units = [
            _PROMPT + (prompt_bits if prompt_bits < 15 else 15),
            _MAX + (max_bits if max_bits < 15 else 15),
            _USER + length,
            _RATIO + (0 if ratio < 0 else ratio if ratio < 15 else 15),
            _FENCE + fence,
            _PASSAGE + passage,
            _SCRIPT + script,
            _TEMP + (0 if temperature is None else 1 if temperature == 0 else 2 if temperature <= 0.5 else 3
                     if temperature <= 1.0 else 4),
            _HISTORY + (history_bits if history_bits < 15 else 15),
            _PASSAGE_X + passage * 8 + octave,
            _FENCE_X + fence * 8 + octave,
            _OUTPUT + (0 if max_bits < 4 else max_bits - 4 if max_bits < 15 else 11) * 2 + (temperature == 0),
        ]  # fmt: skip
        if n > 1:
            units.append(_N)
        return units


def _words(text: str) -> list[bytes]:
    """``text``'s words as lower-cased UTF-8 bytes, digits as 0, punctuation dropped; an unspaced run of
    another script (CJK) as the overlapping character bigrams of its start and its end (3 bytes a character;
    others are cut the same way, consistently, which is all a hash needs)."""
    words = text.encode("utf-8", "replace").translate(_FOLD).split()
    if text.isascii():
        return words
    out: list[bytes] = []
    for word in words:
        if len(word) > 6 and word[0] >= 0x80:
            size = len(word)
            lead = min(size - 3, 3 * CJK_LEAD)
            out += [word[i : i + 6] for i in range(0, lead, 3)]
            out += [word[i : i + 6] for i in range(max(lead, size - 3 - 3 * CJK_END), size - 5, 3)]
        else:
            out.append(word)
    return out


def _script(text: str) -> int:
    """0: ASCII; 1: a little other script; 2: a fair share; 3: mostly a 3-byte script (CJK), by the UTF-8
    bytes beyond one per character (two per CJK character)."""
    extra = len(text.encode("utf-8", "replace")) - len(text)
    share = extra / (2 * len(text))
    return 1 if share < 0.1 else 2 if share < 0.5 else 3


def content_of(features: object) -> Content | None:
    """A request's :class:`Content`, as ``RequestFeatures.content`` carries it (None when it does not)."""
    found = getattr(features, "content", None)
    return found if isinstance(found, Content) else None
