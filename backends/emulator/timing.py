"""The timing model of an emulated vLLM engine, shared by the emulator server and the simulator.

Pure and clock-free: :meth:`Engine.step` admits waiting requests, decides what one engine step does and
returns how long it takes; the caller sleeps (server) or advances a virtual clock (simulator) by that much
and then delivers the tokens.

- Continuous batching at step level: every running request is served by every step. A forward pass over
  ``n`` tokens costs ``t_step(n) = overhead + max(t_mem, a * n)``; requests that join pay
  ``prefill_s_per_token`` per prompt token in the step that admits them (their first token comes out of it).
- ``max_num_seqs`` and a KV-token capacity bound the running set; the rest waits in FCFS order. When
  growing sequences overflow the KV cache, the newest running request is preempted (recompute, as vLLM V1).
- Speculative decoding: one step = ``k`` draft steps of ``c * t_step(B)`` plus one verification of
  ``B * (k + 1)`` tokens through ``t_step``. Each request then gains ``1 + accepted`` tokens, ``accepted``
  drawn from its own per-token acceptance rate (geometric, truncated at ``k``), so the expected tokens per
  step are ``(1 - a^(k+1)) / (1 - a)``.

"Acceptance" here is the per-token acceptance probability of Leviathan et al. (the ``a`` above). vLLM's
``accepted / drafted`` counters, which the emulator's /metrics reports, come out lower: ``(E(a) - 1) / k``.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from backends.emulator.profiles import Profile


def expected_tokens_per_step(acceptance: float, k: int) -> float:
    """Mean tokens a request gains per speculative step: ``(1 - a^(k+1)) / (1 - a)``."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def draft_acceptance_rate(acceptance: float, k: int) -> float:
    """vLLM's accepted / drafted tokens for a per-token acceptance ``a``."""
    return (expected_tokens_per_step(acceptance, k) - 1.0) / k


def draw_accepted(rng: random.Random, acceptance: float, k: int) -> int:
    """Accepted draft tokens of one verification: geometric in ``acceptance``, truncated at ``k``."""
    accepted = 0
    while accepted < k and rng.random() < acceptance:
        accepted += 1
    return accepted


@dataclass(frozen=True, slots=True)
class TimingModel:
    """The cost functions of one profile, speculative or not."""

    profile: Profile
    speculative: bool

    @property
    def k(self) -> int:
        return self.profile.speculative.num_speculative_tokens

    def forward_s(self, tokens: int) -> float:
        step = self.profile.step
        return step.overhead_s + max(step.t_mem_s, step.compute_s_per_token * tokens)

    def step_s(self, decoding: int, prefill_requests: int = 0, prefill_tokens: int = 0) -> float:
        """Duration of one engine step with ``decoding`` running decodes and some joining prefills."""
        if decoding == 0 and prefill_requests == 0:
            return 0.0
        prefill_s = self.profile.step.prefill_s_per_token * prefill_tokens
        if not self.speculative or decoding == 0:
            return self.forward_s(decoding + prefill_requests) + prefill_s
        draft_s = self.k * self.profile.speculative.draft_cost_ratio * self.forward_s(decoding)
        verify_s = self.forward_s(decoding * (self.k + 1) + prefill_requests)
        return draft_s + verify_s + prefill_s

    def effective_acceptance(self, workload_acceptance: float) -> float:
        scaled = workload_acceptance * self.profile.speculative.acceptance_scale
        return min(max(scaled, 0.0), 0.999)

    def time_per_output_token_s(self, batch: int, acceptance: float) -> float:
        """Steady-state decode time per output token with ``batch`` requests decoding together."""
        tokens = expected_tokens_per_step(self.effective_acceptance(acceptance), self.k) if self.speculative else 1
        return self.step_s(batch) / tokens


@dataclass(slots=True, eq=False)
class EngineRequest:
    """One request inside an engine. ``output_tokens`` is how many it will generate in total."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    acceptance: float
    finish_reason: str = "stop"  # what the request ends with: "stop" (drawn length) or "length" (max_tokens)
    generated: int = 0
    needs_prefill: bool = True
    aborted: bool = False

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def finished(self) -> bool:
        return self.generated >= self.output_tokens


@dataclass(frozen=True, slots=True)
class Emission:
    """What one step gave one request."""

    request: EngineRequest
    tokens: int
    drafted: bool  # a speculative verification ran for it (not its prefill step)
    accepted: int  # accepted draft tokens (0 when not drafted)
    finished: bool


@dataclass(frozen=True, slots=True)
class StepOutcome:
    duration_s: float
    emissions: tuple[Emission, ...]
    batch_tokens: int
    prefill_tokens: int
    preempted: int


@dataclass(slots=True)
class EngineCounters:
    """Monotonic totals, as vLLM's counters report them."""

    steps: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    preemptions: int = 0
    accepted_per_position: list[int] = field(default_factory=list)


class Engine:
    """A step-level continuous-batching engine. Not thread-safe; one owner drives it."""

    def __init__(self, model: TimingModel, rng: random.Random) -> None:
        self.model = model
        self._rng = rng
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[EngineRequest] = []
        self.counters = EngineCounters(accepted_per_position=[0] * model.k)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def mean_remaining_tokens(self) -> float:
        """Tokens the running requests still have to generate, on average (0 when idle)."""
        if not self._running:
            return 0.0
        return sum(max(r.output_tokens - r.generated, 1) for r in self._running) / len(self._running)

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    @property
    def kv_usage(self) -> float:
        used = sum(request.kv_tokens for request in self._running)
        return min(1.0, used / self.model.profile.kv_capacity_tokens)

    def add(self, request: EngineRequest) -> None:
        if request.prompt_tokens + 1 > self.model.profile.kv_capacity_tokens:
            raise ValueError(f"prompt of {request.prompt_tokens} tokens does not fit the KV cache")
        self._waiting.append(request)

    def abort(self, request: EngineRequest) -> None:
        """Drop a request (client went away); it leaves the batch before the next step."""
        request.aborted = True
        if request in self._running:
            self._running.remove(request)
        elif request in self._waiting:
            self._waiting.remove(request)

    def step(self) -> StepOutcome:
        """Run one engine step: admit, price, generate, retire, preempt on KV overflow."""
        self._admit()
        prefilling = [request for request in self._running if request.needs_prefill]
        decoding = [request for request in self._running if not request.needs_prefill]
        prefill_tokens = sum(request.kv_tokens for request in prefilling)
        duration = self.model.step_s(len(decoding), len(prefilling), prefill_tokens)
        emissions = [self._prefill(request) for request in prefilling]
        emissions.extend(self._decode(request) for request in decoding)
        self._running = [request for request in self._running if not request.finished]
        preempted = self._preempt_overflow()
        self._count(emissions, prefill_tokens, preempted)
        batch_tokens = len(decoding) * (self.model.k + 1 if self.model.speculative else 1)
        return StepOutcome(duration, tuple(emissions), batch_tokens + len(prefilling), prefill_tokens, preempted)

    def _admit(self) -> None:
        limit = self.model.profile.max_num_seqs
        capacity = self.model.profile.kv_capacity_tokens
        used = sum(request.kv_tokens for request in self._running)
        while self._waiting and len(self._running) < limit:
            candidate = self._waiting[0]
            if self._running and used + candidate.kv_tokens + 1 > capacity:
                break  # (an empty engine always takes the head, so no request can wait forever)
            self._running.append(self._waiting.popleft())
            used += candidate.kv_tokens + 1

    def _prefill(self, request: EngineRequest) -> Emission:
        request.needs_prefill = False
        request.generated += 1
        return Emission(request, 1, drafted=False, accepted=0, finished=request.finished)

    def _decode(self, request: EngineRequest) -> Emission:
        accepted = 0
        if self.model.speculative:
            acceptance = self.model.effective_acceptance(request.acceptance)
            accepted = draw_accepted(self._rng, acceptance, self.model.k)
        remaining = request.output_tokens - request.generated
        tokens = min(1 + accepted, remaining)
        request.generated += tokens
        return Emission(request, tokens, self.model.speculative, accepted, request.finished)

    def _preempt_overflow(self) -> int:
        capacity = self.model.profile.kv_capacity_tokens
        preempted = 0
        while len(self._running) > 1 and sum(r.kv_tokens for r in self._running) > capacity:
            victim = self._running.pop()
            victim.needs_prefill = True
            self._waiting.appendleft(victim)
            preempted += 1
        return preempted

    def _count(self, emissions: list[Emission], prefill_tokens: int, preempted: int) -> None:
        counters = self.counters
        counters.steps += 1
        counters.prompt_tokens += prefill_tokens
        for emission in emissions:
            counters.generation_tokens += emission.tokens
            if not emission.drafted:
                continue
            counters.drafts += 1
            counters.draft_tokens += self.model.k
            counters.accepted_tokens += emission.accepted
            for position in range(emission.accepted):
                counters.accepted_per_position[position] += 1
        counters.preemptions += preempted
