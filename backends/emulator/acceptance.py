"""Ground truth from content: how speculation goes on a request, from the request's own text.

Real speculation accepts a token when the draft guesses it. It guesses well where the answer can be copied
from the prompt (what n-gram / prompt-lookup drafting exploits, and what a draft model gets right too) and
where the answer is predictable (code, a translation pinned down by its source, repetitive material); it
guesses badly on new prose. So the per-token acceptance of a request is a mixture

    a = c * copy_fit + (1 - c) * sigmoid(g)

- ``c``, the share of the answer copied from the prompt, by what the request does with the text it carries
  (:mod:`backends.emulator.reading`): most of the material for a rewrite, an edit or a refactor, what
  survives translation (code, identifiers, numbers) for a translation, verbatim spans for an extraction,
  some phrases for a summary, little for a review or an explanation, nothing for new text; earlier turns of
  a long chat add a little (an answer repeats names and phrases from them).
- ``g``, the logit of acceptance on the generated rest: the domain (code or prose), how much the intent
  pins the answer down (``grounding``), the material's own redundancy (compression), the draft's fit to the
  answer's script (a profile parameter per script), and deterministic per-request noise seeded by a hash
  of the messages.

The natural output length follows content where it plainly does: a rewrite or a translation is about as
long as its material; an answer asked to be one word, one sentence or at most N words is that short,
whatever ``max_tokens`` says; otherwise the drawn length stands.

Nothing here reads what a gateway computes (no hashed n-grams, no task keywords of the rules file). The
parameters of :class:`AcceptanceModel` are a profile's; their defaults are calibrated on the development
split to the published per-task figures (code ~85 %, translation ~80 %, summaries ~75 %, chat ~55 %).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from backends.emulator.reading import (
    COMMENT,
    COMPOSE,
    CONDENSE,
    CONTINUE,
    EXTRACT,
    TRANSFORM,
    TRANSLATE,
    Reading,
    read_request,
)

FLOOR, CEILING = 0.05, 0.98  # per-token acceptance never leaves these
# The share of the answer copied from full material, per intent (translation: what survives it, measured).
COPY_SHARE: Mapping[str, float] = {
    TRANSFORM: 0.72, EXTRACT: 0.55, CONDENSE: 0.30, COMMENT: 0.10, CONTINUE: 0.10, COMPOSE: 0.03,
}  # fmt: skip
HISTORY_COPY = 0.15  # at most this share of the rest copied from earlier turns (a long chat)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScriptFit(_Strict):
    """The draft's fit to the answer's script: added to the logit of acceptance on generated text."""

    latin: float = 0.0
    cjk: float = Field(default=-0.15, description="Chinese, Japanese, Korean")
    other: float = Field(default=-0.4, description="any other script (Cyrillic, Arabic, ...)")


class Grounding(_Strict):
    """How much each intent pins the generated part of the answer down, in logits, with full material."""

    transform: float = 0.3
    translate: float = 1.08
    extract: float = 0.8
    condense: float = 0.4
    comment: float = -0.8
    continue_: float = Field(default=0.3, alias="continue")
    compose: float = 0.0

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def of(self, intent: str) -> float:
        return float(getattr(self, "continue_" if intent == CONTINUE else intent))


class AcceptanceModel(_Strict):
    """One drafter's acceptance on content (a profile's ``acceptance_model``; the defaults: a draft model
    of the target's family, calibrated on the development split to the published per-task figures)."""

    copy_fit: float = Field(default=0.95, gt=0, lt=1, description="acceptance on spans copied from the prompt")
    prose: float = Field(default=0.31, description="logit of acceptance on new prose")
    code: float = Field(default=1.45, description="logit of acceptance on new code")
    grounding: Grounding = Field(default_factory=Grounding)
    redundancy: float = Field(default=1.5, ge=0, description="logit per unit of the material's redundancy")
    script: ScriptFit = Field(default_factory=ScriptFit)
    noise: float = Field(default=0.3, ge=0, description="sd of the per-request logit noise")


DEFAULT_MODEL = AcceptanceModel()


# --- ground truth -------------------------------------------------------------------------------------------


def copy_share(reading: Reading, noise: float = 0.0) -> float:
    """The share of the answer copied from the prompt (and from earlier turns)."""
    share = (reading.invariant if reading.intent == TRANSLATE else COPY_SHARE[reading.intent]) * reading.presence
    share = min(0.9, share * math.exp(noise))
    history = HISTORY_COPY * min(1.0, reading.history_tokens / 400)
    return share + (1.0 - share) * history


def generation_logit(reading: Reading, model: AcceptanceModel, noise: float = 0.0) -> float:
    """The logit of acceptance on the generated (not copied) part of the answer."""
    logit = model.code if reading.code_answer else model.prose + getattr(model.script, reading.script)
    logit += model.grounding.of(reading.intent) * reading.presence
    logit += model.redundancy * min(0.5, reading.redundancy) * reading.presence
    return logit + noise


def acceptance_of(reading: Reading, model: AcceptanceModel = DEFAULT_MODEL) -> float:
    """Per-token acceptance (Leviathan's ``a``) of a request read as ``reading``, for ``model``'s drafter."""
    rng = random.Random(reading.seed)
    logit_noise, copy_noise = rng.gauss(0.0, model.noise), rng.gauss(0.0, model.noise / 3)
    copied = copy_share(reading, copy_noise)
    generated = 1.0 / (1.0 + math.exp(-generation_logit(reading, model, logit_noise)))
    return round(min(CEILING, max(FLOOR, copied * model.copy_fit + (1.0 - copied) * generated)), 3)


def acceptance(messages: Sequence[Mapping[str, Any]], model: AcceptanceModel = DEFAULT_MODEL) -> float:
    """Per-token acceptance of a chat's answer, from its content."""
    return acceptance_of(read_request(messages), model)


_LENGTH_RATIO = {("latin", "cjk"): 1.5, ("cjk", "latin"): 0.7}  # tokens of a translation per source token


def natural_length_of(reading: Reading, drawn: int) -> int:
    """The answer's natural length in tokens: asked for, the material's for a rewrite or a translation, or
    ``drawn`` (the category's or profile's draw) where the content does not say."""
    rng = random.Random(reading.seed ^ 0x5F3759DF)
    if reading.asked is not None:
        return rng.randint(*reading.asked)
    if reading.intent in (TRANSFORM, TRANSLATE) and reading.material_tokens:
        ratio = _LENGTH_RATIO.get((reading.source_script, reading.script), 1.0) if reading.intent == TRANSLATE else 1.0
        return max(1, round(reading.material_tokens * ratio * rng.uniform(0.9, 1.15)) + 2)
    return drawn


def natural_length(messages: Sequence[Mapping[str, Any]], drawn: int) -> int:
    return natural_length_of(read_request(messages), drawn)


def ground_truth(
    messages: Sequence[Mapping[str, Any]], drawn: int, model: AcceptanceModel = DEFAULT_MODEL
) -> tuple[float, int]:
    """``(acceptance, natural output length)`` of a chat, read once."""
    reading = read_request(messages)
    return acceptance_of(reading, model), natural_length_of(reading, drawn)
