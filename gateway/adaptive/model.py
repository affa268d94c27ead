"""The learned latency model: immutable data and pure predictions (no I/O, no clock, no randomness).

For each pool the model predicts a request's latency from its features and the pool's load:

    e2e  = ttft + (expected output tokens - 1) x tpot
    ttft = exp(ttft_curve(load) + ttft_offset[prompt size])          queue wait and prefill included;
           - prefill_rate x cached tokens                            the prompt tokens the pool's replica
                                                                     is expected to hold (prefix index),
                                                                     down to a short prompt's at most
    tpot = exp(tpot_curve(load) + tpot_offset[segment]               segment = task (+ "/copy" cue)
               + slope x content + template_offset)                  content: the request's own deviation

Each curve is piecewise linear in ``log2(1 + load)`` (nodes at load 0, 1, 3, 7, ... 2047) and non-decreasing:
latency never falls when load rises. Offsets are shrunk towards 0 by their sample weight, so a segment
seen a few times moves the prediction a little. The expected output length is ``E[min(L, max_tokens)]``
over the recent lengths of the segment, each scaled by the request's predicted length deviation. ``content``
is the request's predicted log acceptance length minus its segment's (:mod:`gateway.adaptive.predictor`);
``slope``, learned per pool, is what it does to the pool's time per token (about -1 on a speculative pool,
0 on a standard one). A request whose acceptance and length are known (the simulator's perfect-predictor
reference) is predicted from those instead. The learner (:mod:`gateway.adaptive.learner`) builds these
objects from finished requests; :mod:`gateway.adaptive.policy` compares the two pools' predictions.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import accumulate
from types import MappingProxyType

from gateway.adaptive.predictor import PredictorModel

NODES = 12  # load grid: 2**i - 1 for i in 0..11
PROMPT_BINS = (128, 512, 2048)  # prompt-token edges: bins 0..3
SHRINK = 4.0  # an offset with weight w counts min(1, w / SHRINK) of its value: a few samples move it a little
Z = 1.64  # interval half-width in log-sigmas (~90 %)


def load_position(load: float) -> float:
    """Where ``load`` falls on the node grid: ``log2(1 + load)`` clipped to the grid."""
    return min(max(math.log2(1.0 + max(load, 0.0)), 0.0), NODES - 1.0)


def busy(load: float) -> float:
    """How busy a pool is for the pools that share its hardware: ``log2(1 + load)`` up to 1 (one request). An
    engine with any work steps all the time and takes its share of the device; more requests make its steps
    longer, not more frequent, which the other pool feels far less than the first."""
    return math.log2(1.0 + load) if 0.0 < load < 1.0 else 1.0 if load >= 1.0 else 0.0


def prompt_bin(prompt_tokens: int) -> int:
    return bisect_right(PROMPT_BINS, prompt_tokens)


def segment_of(task: str, copy: bool) -> str:
    """The unit output length and acceptance are learned for: the task, split by the copy cue."""
    return f"{task}/copy" if copy else task


def template_key(segment: str, template: str | None) -> str | None:
    """What a system-prompt template's offset is learned under: within its segment."""
    return None if template is None else f"{segment}#{template}"


@dataclass(frozen=True, slots=True)
class Curve:
    """Log-seconds as a non-decreasing piecewise-linear function of ``log2(1 + load)``."""

    values: tuple[float, ...]  # one per node, unvisited nodes filled from their neighbours
    weights: tuple[float, ...]  # effective samples near each node

    def at(self, load: float) -> tuple[float, float]:
        """The value at ``load`` and the sample weight behind it."""
        return self.at_position(load_position(load))

    def at_position(self, u: float) -> tuple[float, float]:
        """:meth:`at` for a load already placed on the grid (one ``load_position`` for several curves)."""
        i = min(int(u), NODES - 2)
        f = u - i
        values, weights = self.values, self.weights
        return values[i] + f * (values[i + 1] - values[i]), weights[i] * (1 - f) + weights[i + 1] * f


@dataclass(frozen=True, slots=True)
class Offset:
    value: float  # log-seconds, before shrinking
    weight: float

    @property
    def shrunk(self) -> float:
        return self.value * min(1.0, self.weight / SHRINK)


_NO_OFFSET = Offset(0.0, 0.0)
_NO_SHIFT = (0.0, 1.0, 0.0, SHRINK)  # a segment the pool has no offset for: PoolModel.tpot_shift's default
_TOP = NODES - 1.0
_OTHER = {"standard": "speculative", "speculative": "standard"}  # as gateway.snapshot.other_pool (no import
# cycle: the snapshot module imports this one)
_BIN1, _BIN2, _BIN3 = PROMPT_BINS  # prompt_bin, inlined in LatencyModel.predict


@dataclass(frozen=True, slots=True)
class PoolModel:
    """What was learned about one pool, with what each prediction needs precomputed once per model."""

    ttft: Curve
    tpot: Curve
    ttft_offsets: Mapping[int, Offset]  # by prompt bin
    tpot_offsets: Mapping[str, Offset]  # by segment
    ttft_var: float  # residual variance of log TTFT
    tpot_var: float  # residual variance of log TPOT
    samples: float  # effective samples (decayed)
    acceptance: Mapping[str, Offset] = field(default_factory=dict)  # mean acceptance length per segment
    last_observed_s: float | None = None  # the learner's clock at the last observation
    segment_seen: Mapping[str, float] = field(default_factory=dict)  # the clock at each segment's last one
    template_offsets: Mapping[str, Offset] = field(default_factory=dict)  # by "segment#template", over tpot_offsets
    slope: float = 0.0  # log tpot per unit of a request's predicted log acceptance length over its segment's
    acceptance_mean: float | None = None  # mean log acceptance length the curve is read around (None: unreported)
    acceptance_max: float = 0.0  # the largest acceptance length reported (k + 1 at most: the draft length's floor)
    cross: float = 0.0  # log tpot when the other pool is busy (gateway.adaptive.model.busy): shared hardware; else 0
    cross_fit: tuple[float, float, float] | None = None  # what it was read from: estimate, its standard error, spread
    prefill_rate: float = 0.0  # seconds of the first token's time a prompt token held in the prefix cache saves
    # derived in __post_init__ (a model is built every model refresh, read by every request)
    has_ttft: bool = field(init=False, default=False)  # a stream was seen: the first token's time is known
    ttft_shift: Mapping[int, float] = field(init=False, default_factory=dict)  # shrunk offsets by prompt bin
    # per segment: (shrunk offset, its exp, its weight, the weight + SHRINK)
    tpot_shift: Mapping[str, tuple[float, float, float, float]] = field(init=False, default_factory=dict)
    added_slope: tuple[float, ...] = field(init=False, default=())  # per node: see _added_slopes
    template_shift: Mapping[str, float] = field(init=False, default_factory=dict)  # shrunk template offsets

    def __post_init__(self) -> None:
        object.__setattr__(self, "has_ttft", any(self.ttft.weights))
        object.__setattr__(self, "ttft_shift", {k: o.shrunk for k, o in self.ttft_offsets.items()})
        shifts = {k: (o.shrunk, math.exp(o.shrunk), o.weight, o.weight + SHRINK) for k, o in self.tpot_offsets.items()}
        object.__setattr__(self, "tpot_shift", shifts)
        object.__setattr__(self, "added_slope", _added_slopes(self.tpot))
        object.__setattr__(self, "template_shift", {k: o.shrunk for k, o in self.template_offsets.items()})


def _added_slopes(curve: Curve) -> tuple[float, ...]:
    """Per node load ``L``: how much one more request slows each token of the others on the pool, in seconds
    per token per request (before the segment's factor): the per-token time's secant over half to twice the
    load, ``(t(2L + 1) - t(L / 2)) / (1.5 L + 1)``.

    A wide secant, not the slope at ``L``: two curve points learned close together give a slope that is
    mostly their noise, and this term is multiplied by the load and the output length (the delay the request
    adds to the others, which is what splits traffic between the pools)."""
    values = curve.values
    out = []
    for i in range(NODES):  # Curve.at inlined (twice per node, every model refresh)
        load = 2.0**i - 1.0
        low, high = load / 2.0, 2.0 * load + 1.0
        ends = []
        for at in (high, low):
            u = min(math.log2(1.0 + at), _TOP)
            j = min(int(u), NODES - 2)
            ends.append(values[j] + (u - j) * (values[j + 1] - values[j]))
        rise = math.exp(ends[0]) - math.exp(ends[1])
        out.append(max(rise, 0.0) / (high - low))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Lengths:
    """Recent output lengths of one segment, sorted, with prefix sums for ``E[min(L, cap)]`` in O(log n)."""

    sorted_tokens: tuple[int, ...]
    prefix: tuple[int, ...]  # prefix[i] = sum of the first i lengths

    @classmethod
    def of(cls, tokens: list[int]) -> Lengths:
        ordered = tuple(sorted(tokens))
        return cls(ordered, tuple(accumulate(ordered, initial=0)))

    @property
    def count(self) -> int:
        return len(self.sorted_tokens)

    def expected(self, cap: float) -> float:
        """``E[min(L, cap)]`` over the sample."""
        n = len(self.sorted_tokens)
        below = bisect_right(self.sorted_tokens, cap)
        return (self.prefix[below] + cap * (n - below)) / n


@dataclass(slots=True)  # not frozen: made per request, and a frozen __init__ costs ~2x; never mutated
class Prediction:
    pool: str
    ttft_s: float
    e2e_s: float
    tpot_s: float
    output_tokens: float
    load: float
    objective_s: float  # the objective's value (ttft_s or e2e_s)
    sigma: float  # log-space half-width of the interval, before Z
    samples: float  # weight behind the least-known part of the prediction
    cost_s: float  # the objective plus the delay this request adds to the others on the pool
    # what one more request on the pool adds to this one's time (its tokens x the load curve's secant), in
    # seconds: with the prefill rate, the exchange between a replica's load and its cache (gateway.pools)
    per_request_s: float = 0.0

    def __init__(
        self, pool: str, ttft_s: float, e2e_s: float, tpot_s: float, output_tokens: float, load: float,
        objective_s: float, sigma: float, samples: float, cost_s: float, per_request_s: float = 0.0,
    ) -> None:  # fmt: skip
        # written out: see gateway.features.RequestFeatures.__init__
        self.pool, self.ttft_s, self.e2e_s, self.tpot_s, self.output_tokens = pool, ttft_s, e2e_s, tpot_s, output_tokens
        self.load, self.objective_s, self.sigma, self.samples = load, objective_s, sigma, samples
        self.cost_s, self.per_request_s = cost_s, per_request_s

    @property
    def low_s(self) -> float:  # the ~90 % interval of the objective's value
        return self.objective_s * math.exp(-Z * self.sigma)

    @property
    def high_s(self) -> float:
        return self.objective_s * math.exp(Z * self.sigma)

    def value(self, objective: str) -> float:
        return self.ttft_s if objective == "ttft" else self.e2e_s


def prediction_for(predictions: tuple[Prediction, ...], pool: str) -> Prediction | None:
    """``pool``'s prediction among ``predictions`` (None when it has none): a loop, not next(genexpr), as it
    runs a few times per request."""
    for prediction in predictions:
        if prediction.pool == pool:
            return prediction
    return None


_EMPTY_POOLS: Mapping[str, PoolModel] = MappingProxyType({})
_EMPTY_LENGTHS: Mapping[str, Lengths] = MappingProxyType({})
_EMPTY_CENTRES: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """Both pools' models and the output lengths, swapped into the snapshot as one object."""

    pools: Mapping[str, PoolModel] = field(default_factory=lambda: _EMPTY_POOLS)
    lengths: Mapping[str, Lengths] = field(default_factory=lambda: _EMPTY_LENGTHS)
    all_lengths: Lengths | None = None  # every segment together: the prior for a segment not seen yet
    version: int = 0  # how many observations built it
    built_s: float = 0.0  # the learner's clock when it was built
    predictor: PredictorModel | None = None  # per-request acceptance and length from content (None: unlearned)
    # per segment (and for all together, ""), the mean length deviation the predictor gave its recent requests
    # (gateway.adaptive.learner): where the segment's own lengths sit in the predictor's content terms
    length_centres: Mapping[str, float] = field(default_factory=lambda: _EMPTY_CENTRES)
    # both pools' predictions by what they depend on (gateway.adaptive.policy.predictions): a model is read by
    # every request until the next refresh, and requests of one application at one load ask the same question
    memo: dict[tuple[object, ...], tuple[Prediction, ...]] = field(
        init=False, default_factory=dict, compare=False, repr=False
    )  # fmt: skip
    # gateway.adaptive.policy._one_device's answers by the predictions tuple they were asked for (shared hardware)
    device_memo: dict[int, tuple[tuple[Prediction, ...], str | None]] = field(
        init=False, default_factory=dict, compare=False, repr=False
    )  # fmt: skip
    # each pool's other's cross term, where any pool has one (shared hardware; else empty: nothing to charge)
    other_cross: Mapping[str, float] = field(init=False, default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if any(pool.cross for pool in self.pools.values()):
            crosses = {name: self.pools[other].cross for name, other in _OTHER.items() if other in self.pools}
            object.__setattr__(self, "other_cross", crosses)

    def samples(self, pool: str) -> float:
        found = self.pools.get(pool)
        return found.samples if found is not None else 0.0

    def acceptance_length(self, pool: str, segment: str) -> float | None:
        """The mean acceptance length learned for a segment on a pool (from vLLM's per-request metrics), once
        three or more requests taught it."""
        found = self.pools.get(pool)
        offset = found.acceptance.get(segment) if found is not None else None
        return offset.value if offset is not None and offset.weight >= 3 else None

    def length_deviation(self, segment: str, deviation: float) -> float:
        """The predictor's length ``deviation`` for a request, over the lengths :meth:`expected_tokens` reads:
        less the mean deviation of that sample's requests (its segment's, else all). The predictor's content
        terms also carry part of every request's mean (structure slots that all requests have share the
        intercept with the segment's slots), which the sample of lengths holds already; uncentred, the
        sample was scaled by it twice (a segment of short translations was predicted 2-5x too long)."""
        key = segment if self._own_lengths(segment) is not None else ""
        return deviation - self.length_centres.get(key, 0.0)

    def _own_lengths(self, segment: str) -> Lengths | None:
        """The segment's own lengths once three or more are known; before that, all segments' are read."""
        lengths = self.lengths.get(segment)
        return lengths if lengths is not None and lengths.count >= 3 else None

    def expected_tokens(self, segment: str, max_tokens: float, deviation: float = 0.0) -> tuple[float, float]:
        """Expected output tokens and the sample count behind it (max_tokens / 2 when nothing is known).
        ``deviation``: the request's predicted log length over its segment's; the segment's lengths are read
        scaled by its exp, ``E[min(L e^d, max_tokens)] = e^d E[min(L, max_tokens e^-d)]``."""
        if deviation:
            scale = math.exp(deviation)
            expected, samples = self.expected_tokens(segment, max_tokens / scale)
            expected *= scale
            return (expected if expected < max_tokens else max_tokens), samples
        lengths = self._own_lengths(segment)
        if lengths is not None:
            return lengths.expected(max_tokens), lengths.count
        if self.all_lengths is not None and self.all_lengths.count:
            return self.all_lengths.expected(max_tokens), 0.0
        return max_tokens / 2, 0.0

    def predict(
        self, pool: str, segment: str, prompt_tokens: int, max_tokens: int, load: float, objective: str = "e2e",
        externality: float = 1.0, tokens: tuple[float, float] | None = None, template: str | None = None,
        content: float = 0.0, log_acceptance: float | None = None, other_load: float = 0.0, cached: int = 0,
    ) -> Prediction | None:  # fmt: skip
        """The pool's predicted latency for one request at ``load``, or None for a pool never observed.
        ``tokens``: :meth:`expected_tokens` for the request, when the caller has it already (both pools').
        ``template``: :func:`template_key` of the request's system-prompt template, whose learned offset (shrunk
        by its samples) adds to the segment's. ``content``: the request's predicted log acceptance length over
        its segment's (times the pool's slope). ``log_acceptance``: the request's true log acceptance length,
        when known: on a pool that reports acceptance it replaces the segment's, template's and content's.
        ``other_load``: the other pool's load, read through this pool's cross term (0 on separate hardware) and
        the other pool's (what this request adds to the delay of the requests there). ``cached``: the prompt
        tokens the pool's replica is expected to hold (the prefix index): each saves the pool's learned prefill
        rate of the whole prompt's first-token time, down to a short prompt's at most."""
        found = self.pools.get(pool)
        if found is None:
            return None
        expected, token_samples = tokens if tokens is not None else self.expected_tokens(segment, max_tokens)
        # load_position and Curve.at_position inlined for the curves read at one position, the segment's
        # shift precomputed per model, conditionals for min(): this runs twice per request (~4-6 us each)
        if load > 0:
            u = math.log2(1.0 + load)
            if u > _TOP:
                u = _TOP
        else:
            u = 0.0
        i = int(u)
        if i > NODES - 2:
            i = NODES - 2
        f = u - i
        g = 1.0 - f
        shift, exp_shift, seg_weight, seg_cap = found.tpot_shift.get(segment, _NO_SHIFT)
        if log_acceptance is not None and found.acceptance_mean is not None:
            shift = found.acceptance_mean - log_acceptance  # the curve is time per step, less the mean
            exp_shift = math.exp(shift)
        else:
            extra = found.slope * content
            if template is not None:
                extra += found.template_shift.get(template, 0.0)
            if extra:
                shift += extra
                exp_shift = math.exp(shift)
        cross = found.cross
        if cross:  # the pool slows while the other, on the same hardware, is busy
            shift += cross * busy(other_load)
            exp_shift = math.exp(shift)
        tpot_values, tpot_weights = found.tpot.values, found.tpot.weights
        tpot = math.exp(tpot_values[i] * g + tpot_values[i + 1] * f + shift)
        tpot_w = tpot_weights[i] * g + tpot_weights[i + 1] * f
        if found.has_ttft:
            ttft_curve = found.ttft
            ttft_w = ttft_curve.weights[i] * g + ttft_curve.weights[i + 1] * f
            ttft_log = ttft_curve.values[i] * g + ttft_curve.values[i + 1] * f
            prompt = 0 if prompt_tokens < _BIN1 else 1 if prompt_tokens < _BIN2 else 2 if prompt_tokens < _BIN3 else 3
            ttft = math.exp(ttft_log + found.ttft_shift.get(prompt, 0.0))
            if cached > 0 and found.prefill_rate > 0:  # the cached part is not prefilled again
                least = math.exp(ttft_log + found.ttft_shift.get(0, 0.0))  # a short prompt's first token
                if least < ttft:
                    saved = ttft - found.prefill_rate * cached
                    ttft = saved if saved > least else least
        else:  # no stream seen: the whole time is in the per-token part
            ttft, ttft_w = 0.0, 0.0
        e2e = ttft + (expected - 1.0 if expected > 2.0 else 1.0) * tpot
        per_request = 0.0
        if objective == "ttft":
            value, var, weight = ttft, found.ttft_var, ttft_w
            cost, samples = ttft, ttft_w
        else:
            value, var = e2e, found.tpot_var + found.ttft_var / 4
            weight = tpot_w if tpot_w < seg_cap else seg_cap
            # the others on the pool each run about `expected` steps slower by what one more request adds
            slopes = found.added_slope
            slope = slopes[i] * g + slopes[i + 1] * f
            per_request = slope * exp_shift * expected
            cost = e2e + per_request * load * externality
            if self.other_cross and load < 1.0 and other_load > 0:
                # each request on the other pool runs slower, by its cross term times what this request adds to
                # this pool's busyness (from idle: all of it), for as long as this one runs
                other_cross = self.other_cross.get(pool, 0.0)
                cost += other_cross * (busy(load + 1.0) - busy(load)) * other_load * e2e * externality
            samples = min(tpot_w, seg_weight, token_samples)
        sigma = math.sqrt(var * (1.0 / (weight + 1.0) + 1.0 / (found.samples + 1.0)))
        return Prediction(pool, ttft, e2e, tpot, expected, load, value, sigma, samples, cost, per_request)
