"""Per-request acceptance and output length from content: an online Bayesian linear regression, bounded.

Two targets, learned from every finished request whose :class:`~gateway.adaptive.content.Content` is known:
**log acceptance length** (vLLM's per-request mean acceptance length, from a speculative pool run with
``--per-request-spec-decode-metrics``) and **log output tokens** per sequence. A reply that stopped at
``max_tokens`` is censored: it says only that the length was at least that, so it teaches only a prediction
below it (and then as if the length were ``max_tokens``).

Each target is ``y = sum of w[slot] over the request's active slots (its segment's and its content's) +
noise``, with a Gaussian prior per weight and a diagonal posterior (mean ``w``, variance ``s`` per slot),
updated per observation as a diagonal Kalman filter (assumed-density filtering): the error is shared out
over the active slots by their variances, and each slot's variance falls by the evidence it got. A slot's
variance never falls below ``FLOOR`` of its prior, which is the forgetting: what a word means keeps
following the traffic. Memory is fixed: ``SLOTS`` weights and variances per target, whatever the traffic.

What the latency model reads is a request's **deviation** from its segment: the sum over its content slots
of each weight times that slot's **certainty** ``1 - s / s0`` (the share of its prior variance that evidence
has removed), times a **calibration** per target. A request whose words and structure were never seen is
predicted exactly as its segment is today; a request like many seen before gets its own estimate. The
calibration is learned from the predictor's own honest record: before it learns from a request, what its
content deviation said is regressed on what the request's value was over its segment's part (through 0,
towards 1, fading), for requests whose content it has not seen among its last ``RECENT`` (a repeat is a
test it has the answer to: replayed items would make it trust memory). Where content predicts nothing
(each item's acceptance drawn at random around its task's), the calibration falls towards 0 and the
segment's estimate stands; where it predicts well, it stays near 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.adaptive.content import BIAS, SEGMENT_END, SLOTS, TEXT_SLOTS, Content

ACCEPTANCE, LENGTH = 0, 1
TARGETS = ("acc", "len")
# Prior variances per target (log units): the bias (the overall mean), a segment slot (task, copy cue),
# one structure slot and one text n-gram. A request has ~12 structure slots and ~30-60 n-grams, so its
# content's prior spread is about sqrt(12 u + 45 t): 0.3 in log acceptance length, 1.2 in log tokens.
_PRIOR = {
    ACCEPTANCE: (1.0, 0.25, 0.004, 0.001),
    LENGTH: (16.0, 1.0, 0.06, 0.016),
}
# Residual variance per target: initial, least, most. The least is what one request's report varies by even
# when its content is known exactly: a mean acceptance length over a few dozen drafts (each 1 to k + 1 tokens)
# moves by ~7 % (0.005 in log), and a sampled answer's length by ~20 % (0.05). Below it the filter would
# take every report at its word and learn each item by heart.
_NOISE = {ACCEPTANCE: (0.05, 0.005, 1.0), LENGTH: (0.5, 0.05, 9.0)}
NOISE_RATE = 0.02  # how fast the residual variance follows
# A reported acceptance length is the mean over the request's engine steps of (accepted drafts + 1), a number
# from 1 to k + 1 per step whose log varies by about this much (one step, k = 5: a variance of 0.32 at a per-token
# acceptance of 0.5, 0.45 at 0.8, plus the square of its bias): a report over few steps (a short answer) says
# little, and its log is biased low (at 0.8 one step's log is 0.19 below the log of the mean). Set lower, the
# residual variance absorbs the rest and short answers weigh as much as long ones again.
# Each report's own variance is STEP_VAR / steps on top of the residual variance: a three-token answer's report
# moves the weights a little, a 300-token one's a lot. Steps = output tokens / the acceptance length predicted
# before the report (not the reported one: a low report would count as more steps, and weigh more, than a high
# one from the same answer).
STEP_VAR = 0.5
# Both targets' shrunk weights packed in one integer per slot, so that one ``sum`` over a request's slots
# reads both (fixed point, 1/_Q: acceptance in the low _SHIFT bits, length above; exact while the sums stay
# within 2^31 / _Q = 32,768 in log units, far past any weight)
_Q = 1 << 16
_SHIFT = 32
_HALF, _LOW = 1 << (_SHIFT - 1), (1 << _SHIFT) - 1
CALIBRATION_PRIOR = 2.0  # the calibration's prior (1) counts as this much squared deviation
CALIBRATION_DECAY = 0.005  # its sums fade by this per observation
RECENT = 4096  # requests remembered (by a hash of their slots) so that a repeat does not count as honest
FLOOR = 0.02  # a slot's variance never falls below this share of its prior (the forgetting)
SEGMENT_FLOOR = 0.005  # ... the bias's and the segment slots'


def _priors(target: int) -> list[float]:
    bias, segment, unit, text = _PRIOR[target]
    out = [text] * TEXT_SLOTS + [unit] * (SLOTS - TEXT_SLOTS)
    out[BIAS:SEGMENT_END] = [segment] * (SEGMENT_END - BIAS)
    out[BIAS] = bias
    return out


def _floors(target: int) -> list[float]:
    priors = _priors(target)
    return [s0 * (SEGMENT_FLOOR if BIAS <= slot < SEGMENT_END else FLOOR) for slot, s0 in enumerate(priors)]


def _content_prior(target: int, content: Content) -> float:
    """The prior variance of ``content``'s slots together: what its certainty is measured against."""
    _, _, unit, text = _PRIOR[target]
    return content.units * unit + (len(content.slots) - content.units) * text


@dataclass(frozen=True, slots=True)
class PredictorModel:
    """The predictor as of a model refresh: per slot and target, the weight times its certainty (what
    decisions read), and the posterior variance (for views)."""

    shrunk: tuple[tuple[float, ...], tuple[float, ...]]  # per target: w x (1 - s / s0), per slot
    variances: tuple[tuple[float, ...], tuple[float, ...]]  # per target: s, per slot
    noise: tuple[float, float]  # residual variance per target
    seen: tuple[float, float]  # observations per target
    packed: tuple[int, ...]  # per slot: both targets' shrunk weights in fixed point (_pack)
    calibration: tuple[float, float] = (1.0, 1.0)  # per target: what the content deviation is multiplied by

    def estimate(self, content: Content) -> tuple[float, float]:
        """The request's deviation from its segment in log acceptance length and in log output tokens: the
        sum of its content slots' weights, each times its certainty (0 for a slot never seen, so content
        never seen is predicted as its segment is). One sum over the packed weights (per request: ~0.7 us
        for 50 slots, against ~1.3 us for a sum per target)."""
        total = sum(content.pick(self.packed))
        acceptance = ((total + _HALF) & _LOW) - _HALF
        calibration = self.calibration
        return acceptance * calibration[0] / _Q, ((total - acceptance) >> _SHIFT) * calibration[1] / _Q

    def absolute(self, content: Content) -> dict[str, float]:
        """What the predictor says of a request on its own: log acceptance length and log tokens (its
        segment's part included), their standard deviations (posterior and residual) and the certainty of its
        content (the share of its slots' prior variance that evidence removed). For views and reports."""
        out: dict[str, float] = {}
        deviation = self.estimate(content)
        for target, name in enumerate(TARGETS):
            shrunk, variances = self.shrunk[target], self.variances[target]
            var = sum(variances[slot] for slot in content.slots)
            segment = sum(shrunk[slot] for slot in content.segment)
            segment_var = sum(variances[slot] for slot in content.segment)
            out[name] = segment + deviation[target]
            out[f"{name}_sd"] = math.sqrt(var + segment_var + self.noise[target])
            out[f"{name}_certainty"] = max(1.0 - var / _content_prior(target, content), 0.0)
        return out


@dataclass
class Predictor:
    """The mutable state: one owner (the learner) feeds it; :meth:`freeze` gives the immutable model."""

    weights: list[list[float]] = field(default_factory=lambda: [[0.0] * SLOTS, [0.0] * SLOTS])
    variances: list[list[float]] = field(default_factory=lambda: [_priors(ACCEPTANCE), _priors(LENGTH)])
    shrunk: list[list[float]] = field(default_factory=lambda: [[0.0] * SLOTS, [0.0] * SLOTS])
    packed: list[int] = field(default_factory=lambda: [0] * SLOTS)  # as of the last freeze()
    noise: list[float] = field(default_factory=lambda: [_NOISE[ACCEPTANCE][0], _NOISE[LENGTH][0]])
    seen: list[float] = field(default_factory=lambda: [0.0, 0.0])
    # per target: the calibration's decayed sums of deviation x residual and deviation squared
    said: list[list[float]] = field(default_factory=lambda: [[0.0, 0.0], [0.0, 0.0]])
    _recent: dict[int, None] = field(default_factory=dict, repr=False)  # hashes of recent requests' slots, in order
    _dirty: set[int] = field(default_factory=set, repr=False)  # slots whose shrunk weights moved since freeze()
    _priors: tuple[list[float], list[float]] = field(
        default_factory=lambda: (_priors(ACCEPTANCE), _priors(LENGTH)), repr=False
    )  # fmt: skip
    _floors: tuple[list[float], list[float]] = field(
        default_factory=lambda: (_floors(ACCEPTANCE), _floors(LENGTH)), repr=False
    )  # fmt: skip

    def deviation(self, content: Content, target: int = ACCEPTANCE) -> float:
        """:meth:`PredictorModel.estimate` for one target, from the state as it is now."""
        return sum(content.pick(self.shrunk[target])) * self.calibration(target)

    def calibration(self, target: int) -> float:
        dr, dd = self.said[target]
        value = (dr + CALIBRATION_PRIOR) / (dd + CALIBRATION_PRIOR)
        return 0.0 if value < 0.0 else 1.5 if value > 1.5 else value

    def observe(self, content: Content, acceptance_length: float | None, tokens: int) -> None:
        """Learn from one finished request: its acceptance length (None: not reported) and its output tokens
        over all its sequences (0: unknown)."""
        slots = (*content.segment, *content.slots)
        key = hash(slots)  # a tuple of ints: the same in every process, though only this one reads it
        novel = key not in self._recent
        if novel:
            if len(self._recent) >= RECENT:
                del self._recent[next(iter(self._recent))]
            self._recent[key] = None
        if acceptance_length is not None and acceptance_length >= 1.0:
            self._step(ACCEPTANCE, content, slots, math.log(acceptance_length), False, novel, tokens)
        if tokens > 0:
            per_sequence = tokens / max(content.sequences, 1)
            censored = per_sequence >= content.max_tokens
            self._step(LENGTH, content, slots, math.log(per_sequence), censored, novel)

    def _step(
        self, target: int, content: Content, slots: tuple[int, ...], y: float, censored: bool, novel: bool,
        tokens: int = 0,
    ) -> None:  # fmt: skip
        """One Kalman step towards ``y``; for acceptance, ``tokens`` (the answer's) sets the report's own
        variance (STEP_VAR over its steps)."""
        weights, variances, shrunk = self.weights[target], self.variances[target], self.shrunk[target]
        priors, floors = self._priors[target], self._floors[target]
        mean = sum(map(weights.__getitem__, slots))
        if censored and mean >= y:
            return  # a cut reply says only that the length was at least y: nothing to correct
        if novel and not censored:  # the honest record: the content's deviation before it learns from it
            said = sum(content.pick(shrunk))
            residual = y - sum(shrunk[slot] for slot in content.segment)
            sums, keep = self.said[target], 1.0 - CALIBRATION_DECAY
            sums[0] = sums[0] * keep + said * residual
            sums[1] = sums[1] * keep + said * said
        var = sum(map(variances.__getitem__, slots))
        noise = self.noise[target]
        extra = 0.0
        if target == ACCEPTANCE:
            steps = tokens / math.exp(mean if mean > 0.0 else 0.0)
            extra = STEP_VAR / steps if steps > 1.0 else STEP_VAR
        total = var + noise + extra
        error = y - mean
        for slot in slots:
            s = variances[slot]
            gain = s / total
            w = weights[slot] = weights[slot] + gain * error
            s -= gain * s
            least = floors[slot]
            s = variances[slot] = s if s > least else least
            shrunk[slot] = w * (1.0 - s / priors[slot])
        self._dirty.update(slots)  # packed at the next freeze(): _pack per slot here was ~15 % of learning
        _, low, high = _NOISE[target]
        noise += NOISE_RATE * (error * error - var - extra - noise)
        self.noise[target] = min(max(noise, low), high)
        self.seen[target] += 1.0

    def freeze(self) -> PredictorModel:
        packed, acceptance, length = self.packed, self.shrunk[0], self.shrunk[1]
        for slot in self._dirty:
            packed[slot] = _pack(acceptance[slot], length[slot])
        self._dirty.clear()
        return PredictorModel(
            (tuple(self.shrunk[0]), tuple(self.shrunk[1])),
            (tuple(self.variances[0]), tuple(self.variances[1])),
            (self.noise[0], self.noise[1]),
            (self.seen[0], self.seen[1]),
            tuple(self.packed),
            (self.calibration(ACCEPTANCE), self.calibration(LENGTH)),
        )

    # -- sharing ------------------------------------------------------------------------------------------
    def export(self) -> dict[str, tuple[float, float]]:
        """Each slot with evidence as ``-|prd|<target>|<slot> -> (weight, precision gained)``, and each target's
        residual variance and calibration: at most 2 x SLOTS + 4 numbers, whatever the traffic."""
        out: dict[str, tuple[float, float]] = {}
        for target, name in enumerate(TARGETS):
            weights, variances, priors = self.weights[target], self.variances[target], self._priors[target]
            for slot, (w, s, s0) in enumerate(zip(weights, variances, priors, strict=True)):
                if s < s0 * 0.999:
                    out[f"-|prd|{name}|{slot}"] = (w, 1.0 / s - 1.0 / s0)
            if self.seen[target]:
                out[f"-|prd|{name}|noise"] = (self.noise[target], self.seen[target])
            if self.said[target][1] > 0:
                out[f"-|prd|{name}|cal"] = (self.calibration(target), self.said[target][1])
        return out

    def absorb(self, name: str, key: str, value: float, weight: float) -> None:
        """One shared number (see :meth:`export`), blended with this state's by evidence."""
        if name not in TARGETS or weight <= 0:
            return
        target = TARGETS.index(name)
        if key == "noise":
            seen = self.seen[target]
            self.noise[target] = (self.noise[target] * seen + value * weight) / (seen + weight)
            self.seen[target] = max(seen, weight)
            return
        if key == "cal":
            sums = self.said[target]
            total = sums[1] + weight
            blended = (self.calibration(target) * sums[1] + value * weight) / total
            sums[1] = max(sums[1], weight)
            sums[0] = blended * (sums[1] + CALIBRATION_PRIOR) - CALIBRATION_PRIOR
            return
        slot = int(key)
        if not 0 <= slot < SLOTS:
            return
        s0 = self._priors[target][slot]
        local = 1.0 / self.variances[target][slot] - 1.0 / s0
        w = self.weights[target][slot]
        w = self.weights[target][slot] = (w * local + value * weight) / (local + weight)
        s = self.variances[target][slot] = 1.0 / (1.0 / s0 + max(local, weight))
        self.shrunk[target][slot] = w * (1.0 - s / s0)
        self._dirty.add(slot)


def _pack(acceptance: float, length: float) -> int:
    return (round(length * _Q) << _SHIFT) + round(acceptance * _Q)


def predictor_view(model: PredictorModel | None) -> Mapping[str, object]:
    """How much the predictor has learned (``GET /v1/route/model``): no text, no slot contents."""
    if model is None:
        return {"observations": {"acceptance": 0, "output_tokens": 0}}
    learned = [sum(1 for value in shrunk if value) for shrunk in model.shrunk]
    return {
        "observations": {"acceptance": round(model.seen[0]), "output_tokens": round(model.seen[1])},
        "slots_learned": {"acceptance": learned[0], "output_tokens": learned[1], "of": SLOTS},
        "residual_sigma": {"log_acceptance_length": round(math.sqrt(model.noise[0]), 3),
                           "log_output_tokens": round(math.sqrt(model.noise[1]), 3)},
        "calibration": {"acceptance": round(model.calibration[0], 3), "output_tokens": round(model.calibration[1], 3)},
    }  # fmt: skip
