"""Read a vLLM ``/metrics`` text into :class:`EngineStats`, and turn counter deltas into windowed acceptance.

The parser is a pure function of the text. It reads only the handful of series the decider needs, so it scans
lines itself instead of building every metric family (about 20x faster than
``prometheus_client.parser.text_string_to_metric_families`` on vLLM 0.32.0's ~640-line text; see
``tests/signals/test_vllm_metrics.py::test_fast_parser_agrees_with_prometheus_client``).

A replica may run several engines (data parallel, label ``engine``): queue gauges and counters are summed over
them, KV-cache use is averaged.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
KV_CACHE_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"  # vLLM before the V1 engine
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
REQUEST_SUCCESS = "vllm:request_success_total"

_WANTED = frozenset(
    {
        RUNNING,
        WAITING,
        KV_CACHE_USAGE,
        KV_CACHE_USAGE_LEGACY,
        DRAFTS,
        DRAFT_TOKENS,
        ACCEPTED_TOKENS,
        ACCEPTED_PER_POS,
        GENERATION_TOKENS,
        PROMPT_TOKENS,
        PREEMPTIONS,
        REQUEST_SUCCESS,
    }
)
_POSITION = re.compile(r'position="(\d+)"')


class MetricsParseError(ValueError):
    """The text is not a vLLM metrics exposition (no engine gauges found, or a malformed sample)."""


@dataclass(frozen=True, slots=True)
class SpecCounters:
    """vLLM's cumulative speculative-decoding counters (monotonic until the engine restarts)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_position: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What one replica's engine reports about itself, at one scrape."""

    running: float
    waiting: float
    kv_cache_usage: float | None
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    preemptions: float = 0.0
    finished_requests: float = 0.0
    spec: SpecCounters | None = None  # None: the engine does not speculate

    @property
    def speculative(self) -> bool:
        return self.spec is not None

    @property
    def lifetime_acceptance_rate(self) -> float | None:
        """Accepted / proposed since the engine started; the windowed value is what routing should use."""
        if self.spec is None or self.spec.draft_tokens <= 0:
            return None
        return self.spec.accepted_tokens / self.spec.draft_tokens


@dataclass(slots=True)
class _Sums:
    values: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    per_position: dict[int, float] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.values[name] = self.values.get(name, 0.0) + value
        self.counts[name] = self.counts.get(name, 0) + 1


def _split_sample(line: str) -> tuple[str, str, float]:
    """``name{labels} value [timestamp]`` -> (name, labels, value)."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        close = line.rfind("}")
        if close < brace:
            raise MetricsParseError(f"unterminated labels in {line[:80]!r}")
        name, labels, rest = line[:brace], line[brace + 1 : close], line[close + 1 :]
    else:
        name, labels, rest = line[:space], "", line[space:]
    parts = rest.split()
    if not parts:
        raise MetricsParseError(f"sample without a value: {line[:80]!r}")
    try:
        return name, labels, float(parts[0])
    except ValueError as exc:
        raise MetricsParseError(f"bad sample value in {line[:80]!r}") from exc


def _collect(text: str) -> _Sums:
    sums = _Sums()
    for raw in text.splitlines():
        if not raw.startswith("vllm:"):
            continue  # comments, blank lines, python_* / process_* series
        end = len(raw)
        for stop in ("{", " "):
            at = raw.find(stop)
            if at != -1:
                end = min(end, at)
        if raw[:end] not in _WANTED:
            continue
        name, labels, value = _split_sample(raw)
        if math.isnan(value):
            continue
        if name == ACCEPTED_PER_POS:
            match = _POSITION.search(labels)
            if match is not None:
                position = int(match.group(1))
                sums.per_position[position] = sums.per_position.get(position, 0.0) + value
            continue
        sums.add(name, value)
    return sums


def _spec_counters(sums: _Sums) -> SpecCounters | None:
    if DRAFT_TOKENS not in sums.values:
        return None
    positions = tuple(sums.per_position[p] for p in sorted(sums.per_position))
    return SpecCounters(
        drafts=sums.values.get(DRAFTS, 0.0),
        draft_tokens=sums.values[DRAFT_TOKENS],
        accepted_tokens=sums.values.get(ACCEPTED_TOKENS, 0.0),
        accepted_per_position=positions,
    )


def _mean(sums: _Sums, *names: str) -> float | None:
    for name in names:
        if name in sums.values:
            return sums.values[name] / sums.counts[name]
    return None


def parse_vllm_metrics(text: str) -> EngineStats:
    """Parse one vLLM ``/metrics`` response. Raises :class:`MetricsParseError` if it is not one."""
    sums = _collect(text)
    if RUNNING not in sums.values or WAITING not in sums.values:
        raise MetricsParseError(f"no {RUNNING} / {WAITING} gauges: not a vLLM metrics text")
    return EngineStats(
        running=sums.values[RUNNING],
        waiting=sums.values[WAITING],
        kv_cache_usage=_mean(sums, KV_CACHE_USAGE, KV_CACHE_USAGE_LEGACY),
        generation_tokens=sums.values.get(GENERATION_TOKENS, 0.0),
        prompt_tokens=sums.values.get(PROMPT_TOKENS, 0.0),
        preemptions=sums.values.get(PREEMPTIONS, 0.0),
        finished_requests=sums.values.get(REQUEST_SUCCESS, 0.0),
        spec=_spec_counters(sums),
    )


@dataclass(frozen=True, slots=True)
class SpecDelta:
    """Counter increase between two scrapes."""

    at: float
    drafts: float
    draft_tokens: float
    accepted_tokens: float


def counter_increase(previous: float, current: float) -> float:
    """Prometheus semantics: a counter that went down was reset to zero and has since counted ``current``."""
    return current - previous if current >= previous else current


def spec_delta(previous: SpecCounters, current: SpecCounters, at: float) -> SpecDelta:
    reset = (
        current.drafts < previous.drafts
        or current.draft_tokens < previous.draft_tokens
        or current.accepted_tokens < previous.accepted_tokens
    )
    if reset:  # treat all three as restarted together, so the ratios stay consistent
        return SpecDelta(at, current.drafts, current.draft_tokens, current.accepted_tokens)
    return SpecDelta(
        at,
        counter_increase(previous.drafts, current.drafts),
        counter_increase(previous.draft_tokens, current.draft_tokens),
        counter_increase(previous.accepted_tokens, current.accepted_tokens),
    )


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Acceptance over a recent window. ``rate`` = accepted / proposed draft tokens; ``length`` = mean tokens
    emitted per draft step (1 target token + the accepted draft tokens)."""

    rate: float
    length: float
    draft_tokens: float


def acceptance_from(deltas: Iterable[SpecDelta]) -> Acceptance | None:
    """Sum deltas (of one replica, or of every replica in a pool: token-weighted, not a mean of ratios)."""
    drafts = draft_tokens = accepted = 0.0
    for delta in deltas:
        drafts += delta.drafts
        draft_tokens += delta.draft_tokens
        accepted += delta.accepted_tokens
    if draft_tokens <= 0 or drafts <= 0:
        return None  # nothing speculated in the window: unknown, not zero
    return Acceptance(rate=accepted / draft_tokens, length=1.0 + accepted / drafts, draft_tokens=draft_tokens)


class AcceptanceWindow:
    """Counter deltas of one replica over the last ``window_s`` seconds."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self._last: SpecCounters | None = None
        self._last_at = 0.0
        self._deltas: deque[SpecDelta] = deque()

    def observe(self, counters: SpecCounters, now: float) -> None:
        # After a gap longer than the window (replica unreachable), the delta would describe mostly old
        # traffic stamped as new: start again from this sample instead.
        if self._last is not None and now - self._last_at <= self.window_s:
            self._deltas.append(spec_delta(self._last, counters, now))
        self._last, self._last_at = counters, now
        self._trim(now)

    def deltas(self, now: float) -> tuple[SpecDelta, ...]:
        self._trim(now)
        return tuple(self._deltas)

    def acceptance(self, now: float) -> Acceptance | None:
        return acceptance_from(self.deltas(now))

    def _trim(self, now: float) -> None:
        horizon = now - self.window_s
        while self._deltas and self._deltas[0].at < horizon:
            self._deltas.popleft()
