"""Online learning of the latency model from finished requests: observations in, an immutable model out.

Every finished request (streaming or not) gives an :class:`Observation`: the pool that answered, the
load the decision saw there, time to first byte, total time, completion tokens and, when vLLM runs with
``--per-request-spec-decode-metrics``, the request's mean acceptance length. :meth:`Learner.observe` folds
it in at once (a few microseconds): stochastic gradient steps in log-seconds on the load curve and on the
segment / prompt-size offsets, with a learning rate of ``1 / (weight + 1)`` that floors at
``learning_rate``. The floor is the forgetting: old data fades geometrically, so a drift is followed within
a few dozen observations of the cell it touches. :meth:`Learner.model` freezes the state into a
:class:`~gateway.adaptive.model.LatencyModel` for the snapshot.

With an acceptance length ``a`` the error is split by what acceptance explains: the segment's offset learns
``-log(a / mean a)`` and the load curve learns the rest (the time of one engine step at that load).

With the request's :class:`~gateway.adaptive.content.Content`, the per-request predictor
(:mod:`gateway.adaptive.predictor`) learns its acceptance and output length, and each pool learns a
**slope**: how its time per token moves with the request's predicted log acceptance length over its
segment's (regressed on the same residual the segment's offset learns from; prior -1 on a pool that reports
acceptance, where a step's tokens are the acceptance length, 0 elsewhere). The predictor's deviation is
computed before it learns from the request (so the slope learns from honest predictions), and the
template's offset learns what the segment, the slope and the content leave over.

Pools that share hardware (both on one GPU, or on one CPU) slow each other down: each pool also learns a
**cross term** (:mod:`gateway.adaptive.cross`): its log time per token while the other pool is busy (the
share of the request's life the other pool had work), from a regression of its residuals on its own load
position and the other pool's busyness. It is used only where the data show it clearly (its lower confidence
bound), so pools on separate hardware keep 0 and their model is what it was without it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gateway.adaptive.cells import (
    SLOPE_PRIOR_WEIGHT,
    Cell,
    CurveState,
    PoolState,
    cell_of,
    template_cell,
)
from gateway.adaptive.content import Content
from gateway.adaptive.model import (
    SHRINK,
    Curve,
    LatencyModel,
    Lengths,
    Offset,
    PoolModel,
    load_position,
    prompt_bin,
    template_key,
)
from gateway.adaptive.predictor import LENGTH, Predictor

PREFILL_UNIT = 1000.0  # the prefill rate is learned in seconds per this many tokens (its prior weight's unit)
LENGTH_WINDOW = 256  # recent output lengths kept per segment
CENTRE_RATE = 1 / 32  # how fast a segment's mean length deviation follows (the first requests: their mean)
REFILL_EVERY = 16  # observations between refreshes of a curve's fill (also refreshed by every freeze)
# What ``export`` means: bump it whenever a number's unit or meaning changes, so that replicas of two versions
# (a rolling upgrade) share only with their own kind. 4: each segment's mean length deviation ("-|lcen|...",
# Dec 7 2026), which the lengths are now read against; 3: the per-request predictor's weights ("-|prd|..."), the
# pools' slopes, and template offsets over the content's part (Dec 2026); 2: a speculative pool's tpot curve is
# time per engine step and its offsets -log(acceptance); 1 (never written out) was time per token.
EXPORT_FORMAT = 4


@dataclass(slots=True)  # not frozen: one per finished request, and a frozen __init__ costs ~2x; never mutated
class Observation:
    pool: str
    segment: str
    prompt_tokens: int
    load: float  # the pool's load as the decision saw it
    ttft_s: float | None  # time to the first token; None when unknown (a non-streamed reply comes whole)
    total_s: float
    output_tokens: int
    acceptance_length: float | None = None  # vLLM's per-request mean acceptance length (speculative pool)
    at_s: float = 0.0  # the learner's clock (monotonic seconds in the gateway, virtual in the simulator)
    run_load: float | None = None  # the pool's mean load while the request ran (None: ``load``)
    template: str | None = None  # the request's system-prompt template id (gateway.features)
    content: Content | None = None  # the request's content features (gateway.adaptive.content)
    other_busy: float | None = None  # how busy the other pool was while it ran, 0..1 (other_busy_share; None: unknown)
    # of the prompt, what the decision expected the pool's replica to hold (the prefix index; None: not read)
    cached_tokens: int | None = None

    def __init__(
        self, pool: str, segment: str, prompt_tokens: int, load: float, ttft_s: float | None, total_s: float,
        output_tokens: int, acceptance_length: float | None = None, at_s: float = 0.0, run_load: float | None = None,
        template: str | None = None, content: Content | None = None, other_busy: float | None = None,
        cached_tokens: int | None = None,
    ) -> None:  # fmt: skip
        # written out: see gateway.features.RequestFeatures.__init__
        self.pool, self.segment, self.prompt_tokens, self.load = pool, segment, prompt_tokens, load
        self.ttft_s, self.total_s, self.output_tokens = ttft_s, total_s, output_tokens
        self.acceptance_length, self.at_s, self.run_load, self.template = acceptance_length, at_s, run_load, template
        self.content, self.other_busy, self.cached_tokens = content, other_busy, cached_tokens


class Learner:
    """Mutable learning state of one gateway (or one simulation). Not thread-safe: one owner feeds it."""

    def __init__(self, learning_rate: float = 0.05, forget_s: float | None = None, shared_device: bool = False) -> None:
        self.shared_device = shared_device  # declared by the operator (rules adaptive.shared_device): cross.py's prior
        self.set_learning_rate(learning_rate)
        self.forget_s = forget_s  # past this long unseen on a pool, a segment's samples there fade (None: never)
        self._pools: dict[str, PoolState] = {}
        self._lengths: dict[str, deque[int]] = {}
        self._all_lengths: deque[int] = deque(maxlen=LENGTH_WINDOW * 2)
        # per segment ("" for all): the mean of the predictor's length deviations, and how many fed it
        self._centres: dict[str, list[float]] = {}
        self.predictor = Predictor()
        self.observations = 0
        self._frozen: LatencyModel | None = None

    def set_learning_rate(self, learning_rate: float) -> None:
        self.floor = learning_rate
        self.cap = 1.0 / learning_rate  # a weight never exceeds what the forgetting keeps

    def observe(self, obs: Observation) -> None:
        if obs.total_s <= 0 or (obs.ttft_s is not None and obs.ttft_s <= 0):
            return
        # get-then-create, not setdefault: a setdefault builds its default (a whole PoolState) every call
        state = self._pools.get(obs.pool)
        if state is None:
            state = self._pools[obs.pool] = PoolState()
        floor, cap = self.floor, self.cap
        ttft_offset = cell_of(state.ttft_offsets, prompt_bin(obs.prompt_tokens))
        u = load_position(obs.load)
        ttft = obs.ttft_s
        held = obs.cached_tokens / PREFILL_UNIT if obs.cached_tokens else 0.0
        if ttft is not None:
            # the prompt-size offsets learn the whole prompt's time: what a cached part saved is added back
            whole = ttft
            if obs.cached_tokens is not None:
                whole += _prefill_saving(state, u, obs.prompt_tokens / PREFILL_UNIT, held, ttft)
            error = _fit(state.ttft, ttft_offset, u, math.log(whole), floor, cap)
            state.ttft_var += floor * (error * error - state.ttft_var)
        else:  # a whole reply: take the first token's share from what the streams taught (none: nothing)
            ttft = _known_ttft(state, ttft_offset, u, obs.total_s, held)
        deviation = None
        if obs.content is not None:
            deviation = self.predictor.deviation(obs.content)  # before it learns from this request
            if obs.output_tokens > 0:  # what the length deviation said, where the sample of lengths will be
                length = self.predictor.deviation(obs.content, LENGTH)
                for key in (obs.segment, ""):
                    _centre(self._centres, key, length)
            acceptance = obs.acceptance_length if obs.acceptance_length and obs.acceptance_length >= 1 else None
            self.predictor.observe(obs.content, acceptance, obs.output_tokens)
        if obs.output_tokens >= 2 and obs.total_s > ttft:
            u_run = u if obs.run_load is None else load_position(obs.run_load)
            self._observe_tpot(state, obs, ttft, u_run, deviation)
        self._remember_length(obs.segment, obs.output_tokens)
        state.samples = min(state.samples + 1.0, cap * 4)
        state.last_observed_s = obs.at_s
        self.observations += 1
        self._frozen = None
        if self.observations % REFILL_EVERY == 0:
            state.ttft.refresh()
            state.tpot.refresh()
            for each in self._pools.values():  # both: pools observed in turn would leave one never refreshed
                each.cross.refresh(self.shared_device)

    def _observe_tpot(
        self, state: PoolState, obs: Observation, ttft: float, u: float, deviation: float | None
    ) -> None:  # fmt: skip
        floor, cap = self.floor, self.cap
        target = math.log((obs.total_s - ttft) / (obs.output_tokens - 1))
        x = obs.other_busy
        cross = state.cross.used * x if x is not None else 0.0
        target -= cross  # the curve and offsets learn the pool's speed with the other pool idle
        offset = cell_of(state.tpot_offsets, obs.segment)
        seen = state.segment_seen.get(obs.segment)
        if seen is not None and self.forget_s and obs.at_s - seen > self.forget_s:
            # a segment unseen on this pool for longer than forget_s (its traffic went to the other pool): what
            # its cell knows fades by e per further forget_s, so the observation that brings it back (an
            # exploration) counts for more than one sample among twenty
            offset.weight *= math.exp(-(obs.at_s - seen - self.forget_s) / self.forget_s)
        state.segment_seen[obs.segment] = obs.at_s
        key = template_key(obs.segment, obs.template)
        template = None if key is None else template_cell(state.templates, key)
        mean_log_a = state.mean_log_acceptance
        if obs.acceptance_length is not None and obs.acceptance_length >= 1.0:
            log_a = math.log(obs.acceptance_length)
            mean_log_a.step(log_a, 1.0, floor, cap)
            state.acceptance_max = max(state.acceptance_max, obs.acceptance_length)
            cell_of(state.acceptance, obs.segment).step(obs.acceptance_length, 1.0, floor, cap)
            before = _log_tpot_offset(offset, mean_log_a)
            explained = _content_part(state, deviation, -log_a - before)
            if template is not None:  # how far this template's acceptance lies from its segment's and content's
                template.step(-log_a - before - explained, 1.0, floor, cap)
            offset.step(-log_a, 1.0, floor, cap)
            # The curve learns the engine's time per step at this load (time per token x tokens per step), the
            # offset -log(acceptance): the load's effect apart from the mix of acceptances the pool serves at
            # that load. (Against a running mean acceptance instead, a mix that shifts with the load, e.g. more
            # low-acceptance requests sent to the pool when it is busier, showed as a slope of the curve.)
            step_error = state.tpot.step(u, target + log_a, floor, cap)
            error = step_error - log_a - before  # the error of the per-token prediction: the residual's scale
        elif mean_log_a.weight > 0:  # a pool that reports acceptance, a reply without it: the segment's own
            error = state.tpot.step(u, target - _log_tpot_offset(offset, mean_log_a), floor, cap)
        else:
            error = _fit(state.tpot, offset, u, target, floor, cap, template, (state, deviation))
        state.tpot_var += floor * (error * error - state.tpot_var)
        if x is not None:
            state.cross.step(u, x, error + cross)

    def _remember_length(self, segment: str, tokens: int) -> None:
        if tokens <= 0:
            return
        window = self._lengths.get(segment)
        if window is None:
            window = self._lengths[segment] = deque(maxlen=LENGTH_WINDOW)
        window.append(tokens)
        self._all_lengths.append(tokens)

    def model(self, now_s: float = 0.0) -> LatencyModel:
        """The current state as an immutable model (rebuilt only after new observations)."""
        if self._frozen is not None:
            return self._frozen
        for state in self._pools.values():
            state.cross.refresh(self.shared_device)
        pools = {name: _freeze_pool(state) for name, state in self._pools.items()}
        lengths = {seg: Lengths.of(list(window)) for seg, window in self._lengths.items() if window}
        everything = Lengths.of(list(self._all_lengths)) if self._all_lengths else None
        predictor = self.predictor.freeze() if any(self.predictor.seen) else None
        centres = MappingProxyType({key: value for key, (value, _) in self._centres.items()})
        self._frozen = LatencyModel(pools, lengths, everything, self.observations, now_s, predictor, centres)
        return self._frozen

    # -- sharing (gateway.adaptive.shared turns these into Redis estimates) ----------------------------
    def export(self) -> dict[str, tuple[float, float]]:
        """Every learned number as ``name -> (value, weight)``."""
        out: dict[str, tuple[float, float]] = {}
        for pool, state in self._pools.items():
            for curve_name, curve in (("ttft", state.ttft), ("tpot", state.tpot)):
                for i, (value, weight) in enumerate(zip(curve.values, curve.weights, strict=True)):
                    if weight > 0:
                        out[f"{pool}|{curve_name}|node|{i}"] = (value, weight)
                        out[f"{pool}|{curve_name}|pos|{i}"] = (curve.positions[i], weight)
            for key, cell in state.ttft_offsets.items():
                out[f"{pool}|ttft|off|{key}"] = (cell.value, cell.weight)
            for seg, cell in state.tpot_offsets.items():
                out[f"{pool}|tpot|off|{seg}"] = (cell.value, cell.weight)
            for seg, cell in state.acceptance.items():
                out[f"{pool}|acc|off|{seg}"] = (cell.value, cell.weight)
            for name, cell in state.templates.items():
                # part "tmpl", not "off": replicas of the version before templates ignore a part they do not
                # know, where an "off" would be filed as an offset of theirs (no EXPORT_FORMAT bump needed)
                out[f"{pool}|tpot|tmpl|{name}"] = (cell.value, cell.weight)
            out[f"{pool}|var|ttft|-"] = (state.ttft_var, state.samples)
            out[f"{pool}|var|tpot|-"] = (state.tpot_var, state.samples)
            out[f"{pool}|mla|-|-"] = (state.mean_log_acceptance.value, state.mean_log_acceptance.weight)
            if state.slope.dd > 0:
                out[f"{pool}|slope|-|-"] = (state.slope.value(state.slope_prior), state.slope.dd)
            if state.acceptance_max > 0:
                out[f"{pool}|amax|-|-"] = (state.acceptance_max, 1.0)
            if state.prefill.spread > 0:
                out[f"{pool}|prefill|-|-"] = (state.prefill.value(), state.prefill.spread)
        out.update(self.predictor.export())
        for seg, window in self._lengths.items():
            for q, quantile in enumerate(_quantiles(window)):
                out[f"-|len|{seg}|{q}"] = (float(quantile), float(len(window)))
        for seg, (value, count) in self._centres.items():  # "" (all segments) included
            out[f"-|lcen|{seg}|-"] = (value, count)
        return out

    def absorb(self, shared: Mapping[str, tuple[float, float]]) -> None:
        """Blend numbers learned elsewhere (other gateway replicas) into this state, weighted by samples.

        A number this learner knows better than the others is barely moved; one it has never seen is taken
        as it is. Weights are not summed (the others keep their own), so repeated syncs converge instead of
        counting the same requests twice.
        """
        lengths: dict[str, list[tuple[int, float, float]]] = {}
        variances: dict[str, list[tuple[str, float, float]]] = {}
        # positions first: each is blended against the node's weight before its value moves that weight; slopes
        # last: each is read around its prior, which the pool's mean acceptance ("mla") decides
        for name, (value, weight) in sorted(shared.items(), key=lambda item: _absorb_order(item[0])):
            pool, kind, part, key = name.split("|", 3)
            if kind == "len":
                lengths.setdefault(part, []).append((int(key), value, weight))
                continue
            if weight <= 0 or not math.isfinite(value):
                continue
            if kind == "prd":
                self.predictor.absorb(part, key, value, weight)
                continue
            if kind == "lcen":
                found = self._centres.get(part)
                self._centres[part] = list(_blend(found[0], found[1], value, weight) if found else (value, weight))
                continue
            if kind == "var":
                variances.setdefault(pool, []).append((part, value, weight))
                continue
            # get() first: setdefault would build a PoolState per number (2/3 of an absorb's time) to drop it
            state = self._pools.get(pool) or self._pools.setdefault(pool, PoolState())
            self._absorb_one(state, kind, part, key, value, weight)
        for pool, entries in variances.items():
            self._absorb_variances(self._pools.get(pool) or self._pools.setdefault(pool, PoolState()), entries)
        for seg, quantiles in lengths.items():
            window = self._lengths.get(seg)
            remote_n = max(w for _, _, w in quantiles)
            if window is None or len(window) < min(remote_n, 20):
                values = [round(v) for _, v, _ in sorted(quantiles)]
                self._lengths[seg] = deque(values, maxlen=LENGTH_WINDOW)
                self._all_lengths.extend(values)
        self._frozen = None

    def _absorb_one(self, state: PoolState, kind: str, part: str, key: str, value: float, weight: float) -> None:
        if part == "node":
            curve = state.ttft if kind == "ttft" else state.tpot
            i = int(key)
            curve.values[i], curve.weights[i] = _blend(curve.values[i], curve.weights[i], value, weight)
            curve.refresh()
        elif part == "pos":
            curve = state.ttft if kind == "ttft" else state.tpot
            i = int(key)
            curve.positions[i], _ = _blend(curve.positions[i], curve.weights[i], value, weight)
        elif part == "off":
            if kind == "ttft":
                cell = state.ttft_offsets.setdefault(int(key), Cell())
            elif kind == "tpot":
                cell = state.tpot_offsets.setdefault(key, Cell())
            else:
                cell = state.acceptance.setdefault(key, Cell())
            cell.value, cell.weight = _blend(cell.value, cell.weight, value, weight)
        elif part == "tmpl":
            cell = template_cell(state.templates, key)
            cell.value, cell.weight = _blend(cell.value, cell.weight, value, weight)
        elif kind == "mla":
            cell = state.mean_log_acceptance
            cell.value, cell.weight = _blend(cell.value, cell.weight, value, weight)
        elif kind == "slope":
            slope, prior = state.slope, state.slope_prior
            blended, dd = _blend(slope.value(prior), slope.dd, value, weight)
            slope.dd, slope.dt = dd, blended * (dd + SLOPE_PRIOR_WEIGHT) - SLOPE_PRIOR_WEIGHT * prior
        elif kind == "amax":
            state.acceptance_max = max(state.acceptance_max, value)
        elif kind == "prefill":
            prefill = state.prefill
            blended, spread = _blend(prefill.value(), prefill.spread, value, weight)
            prefill.take(blended, spread)

    def _absorb_variances(self, state: PoolState, entries: list[tuple[str, float, float]]) -> None:
        """Both residual variances blended against the pool's sample count as it was before this sync (the
        count is one weight for both: raising it for the first would let the second barely move)."""
        before = state.samples
        for part, value, weight in entries:
            if part == "ttft":
                state.ttft_var, _ = _blend(state.ttft_var, before, value, weight)
            else:
                state.tpot_var, _ = _blend(state.tpot_var, before, value, weight)
            state.samples = max(state.samples, min(weight, self.cap * 4))


def _absorb_order(name: str) -> int:
    return 0 if "|pos|" in name else 2 if "|slope|" in name else 1


def _centre(centres: dict[str, list[float]], key: str, value: float) -> None:
    """One step of a segment's mean length deviation: the plain mean of its first requests, then a moving one."""
    found = centres.get(key)
    if found is None:
        centres[key] = [value, 1.0]
        return
    found[1] += 1.0
    rate = 1.0 / found[1]
    found[0] += (rate if rate > CENTRE_RATE else CENTRE_RATE) * (value - found[0])


def _content_part(state: PoolState, deviation: float | None, residual: float) -> float:
    """The part of a request's tpot residual (over its segment's offset) that its predicted content deviation
    explains on this pool, by the pool's slope as it was; the slope then learns from this residual."""
    if deviation is None:
        return 0.0
    slope = state.slope.value(state.slope_prior)
    state.slope.step(deviation, residual)
    return slope * deviation


def _fit(
    curve: CurveState, offset: Cell, u: float, target: float, floor: float, cap: float,
    template: Cell | None = None, content: tuple[PoolState, float | None] | None = None,
) -> float:  # fmt: skip
    """One step of the additive model ``target ~ curve(load) + offset (+ slope x content + template)`` at load
    position ``u``; returns the curve's error. The slope and the template cell learn what the offset leaves
    over (the template what the slope leaves).

    The curve learns the pool's level at each load over whatever mix of requests it serves; the offset
    learns what the curve leaves over for its cell. (Fitting both to each other's residuals lets a common
    constant drift between them, and nodes learned at different times then disagree.)
    """
    before = curve.filled()
    error = curve.step(u, target, floor, cap)
    after = curve.filled()
    # the step left the curve's fill as it was (no new node): the offset's residual is the curve's error
    residual = error if after is before else target - curve.predict(u, after)
    explained = 0.0 if content is None else _content_part(*content, residual - offset.value)
    if template is not None:
        template.step(residual - offset.value - explained, 1.0, floor, cap)
    offset.step(residual, 1.0, floor, cap)
    return error


def _log_tpot_offset(offset: Cell, mean_log_a: Cell) -> float:
    """A segment's learned ``-log(acceptance)`` on a pool that reports acceptance, the pool's mean for a
    segment not seen there yet."""
    return offset.value if offset.weight > 0 else -mean_log_a.value


def _known_ttft(state: PoolState, offset: Cell, u: float, total_s: float, held: float = 0.0) -> float:
    """The predicted first-token time at load position ``u`` (less what ``held`` thousand cached prompt tokens
    save, capped at half the total), or 0 with no stream seen yet."""
    if not any(w > 0 for w in state.ttft.weights):
        return 0.0
    predicted = math.exp(state.ttft.predict(u, state.ttft.filled()) + offset.value * _shrink(offset))
    if held:
        rate = state.prefill.value()
        predicted = max(predicted - max(rate, 0.0) * held, predicted / 10)
    return min(predicted, total_s / 2)


def _prefill_saving(state: PoolState, u: float, prompt: float, held: float, ttft: float) -> float:
    """What ``held`` thousand cached prompt tokens saved this request, by the pool's prefill rate as it was.
    The rate then learns from the request: its first token's time over the load curve's (which takes the
    queue's part) against the thousands of prompt tokens it was expected to prefill, ``prompt - held`` (a
    :class:`Trend`: the intercept takes the curve's bias, the slope the time per uncached token).

    Against the uncached tokens, not against those held: a conversation's later turns hold more and are
    longer, so the time saved by what is held hides behind the time added by the longer prompt (on the
    simulator's sessions a regression on what is held read a tenth of the rate); the uncached count carries
    both."""
    rate = state.prefill.value()
    saved = rate * held if held and rate > 0 else 0.0
    if any(w > 0 for w in state.ttft.weights):
        state.prefill.step(prompt - held, ttft - math.exp(state.ttft.predict(u, state.ttft.filled())))
    return saved


def _blend(local: float, local_w: float, remote: float, remote_w: float) -> tuple[float, float]:
    total = local_w + remote_w
    return (local * local_w + remote * remote_w) / total, max(local_w, remote_w)


def _shrink(cell: Cell) -> float:
    return min(1.0, cell.weight / SHRINK)  # as Offset.shrunk


def _quantiles(window: Iterable[int], count: int = 20) -> list[int]:
    ordered = sorted(window)
    if not ordered:
        return []
    return [ordered[min(len(ordered) - 1, (2 * q + 1) * len(ordered) // (2 * count))] for q in range(count)]


def _freeze_pool(state: PoolState) -> PoolModel:
    tpot = state.tpot.freeze()
    # A pool that reports acceptance learns time per step and -log(acceptance) per segment (see
    # _observe_tpot); the model reads them around the pool's mean acceptance, so that an offset shrunk for
    # want of samples falls back to the pool's mean, not to one token per step.
    mean = state.mean_log_acceptance.value if state.mean_log_acceptance.weight > 0 else 0.0
    if mean:
        tpot = Curve(tuple(v - mean for v in tpot.values), tpot.weights)
    return PoolModel(
        ttft=state.ttft.freeze(),
        tpot=tpot,
        ttft_offsets={k: Offset(c.value, c.weight) for k, c in state.ttft_offsets.items()},
        tpot_offsets={k: Offset(c.value + mean, c.weight) for k, c in state.tpot_offsets.items()},
        ttft_var=state.ttft_var,
        tpot_var=state.tpot_var,
        samples=state.samples,
        acceptance={k: Offset(c.value, c.weight) for k, c in state.acceptance.items()},
        template_offsets={k: Offset(c.value, c.weight) for k, c in state.templates.items()},
        last_observed_s=state.last_observed_s,
        segment_seen=dict(state.segment_seen),
        slope=state.slope.value(state.slope_prior),
        acceptance_mean=mean if state.mean_log_acceptance.weight > 0 else None,
        acceptance_max=state.acceptance_max,
        cross=state.cross.used,
        cross_fit=state.cross.last_fit,
        prefill_rate=max(state.prefill.value(), 0.0) / PREFILL_UNIT,
    )
