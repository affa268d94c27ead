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
  ``B * (k + 1)`` tokens through ``t_step``, each drafted token weighing ``v`` decode tokens (the profile's
  ``verify_cost_ratio``, default 1). Each request then gains ``1 + accepted`` tokens, ``accepted``
  drawn from its own per-token acceptance rate (geometric, truncated at ``k``), so the expected tokens per
  step are ``(1 - a^(k+1)) / (1 - a)``.
- Dynamic speculation (vLLM's ``num_speculative_tokens_per_batch_size``, in the profile's speculative block):
  each step drafts the ``k`` of its batch size (running requests, prefills included). A step at ``k = 0``
  drafts nothing and decodes as a plain engine would, but is not free: the drafter still runs, so the whole
  step takes ``1 + zero_k_overhead(B)`` times a plain engine's (``gateway.adaptive.suggest_k``: vLLM issue
  #49548's two measured points, interpolated in log batch size; the gateway's k-table suggestion reads the same).
- Prefix caching (``prefix_cache.py``): a request that carries its prompt's block hashes prefills only the
  part not already cached; its blocks are shared with the other running requests and kept, once free, in LRU
  order in the KV space the running requests leave. A request without block hashes (``None``) caches nothing.
  Hashes past the prompt's (a caller that knows the answer's text: the simulator's sessions) are the blocks
  the answer fills; they are cached, free, when the request finishes, as vLLM caches generated blocks.

"Acceptance" here is the per-token acceptance probability of Leviathan et al. (the ``a`` above). vLLM's
``accepted / drafted`` counters, which the emulator's /metrics reports, come out lower: ``(E(a) - 1) / k``.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from backends.emulator.prefix_cache import BLOCK_SIZE, PrefixCache
from backends.emulator.profiles import Profile
from gateway.adaptive.suggest_k import as_ranges, tokens_per_step, zero_k_overhead

# Mean tokens a request gains per speculative step, ``(1 - a^(k+1)) / (1 - a)``: the gateway's formula, one
# definition for the emulator, the simulator and suggest-k.
expected_tokens_per_step = tokens_per_step


def draft_acceptance_rate(acceptance: float, k: int) -> float:
    """vLLM's accepted / drafted tokens for a per-token acceptance ``a``."""
    return (expected_tokens_per_step(acceptance, k) - 1.0) / k


def profiled_table(profile: Profile, acceptance: float) -> tuple[tuple[int, int, int], ...]:
    """The dynamic-speculation table an operator would profile offline for ``profile``'s speculative engine: at
    each batch size from 1 to ``max_num_seqs``, the ``k`` (0 to ``num_speculative_tokens``) that decodes the
    most tokens per second at the traffic's mean per-token ``acceptance`` (scaled by the drafter's
    ``acceptance_scale``), ``k = 0`` paying its measured overhead; written as vLLM's ranges."""
    model = TimingModel(profile, speculative=True)
    a = model.effective_acceptance(acceptance)
    chosen = []
    for batch in range(1, profile.max_num_seqs + 1):
        rates = [1.0 / (model.forward_s(batch) * (1.0 + zero_k_overhead(batch)))]
        rates += [expected_tokens_per_step(a, k) / model.speculative_step_s(batch, k) for k in range(1, model.k + 1)]
        chosen.append(max(range(len(rates)), key=rates.__getitem__))
    return as_ranges(chosen)


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
        """The most draft tokens a step can carry (vLLM's ``num_speculative_tokens``)."""
        return self.profile.speculative.num_speculative_tokens

    @property
    def dynamic(self) -> bool:
        """A speculative engine whose k follows its batch size (and can be 0)."""
        return self.speculative and self.profile.speculative.num_speculative_tokens_per_batch_size is not None

    def k_for(self, batch: int) -> int:
        """Draft tokens per request in a step of ``batch`` scheduled requests; 0 on a standard engine."""
        return self.profile.speculative.k_at(batch) if self.speculative else 0

    def forward_s(self, tokens: float) -> float:
        step = self.profile.step
        return step.overhead_s + max(step.t_mem_s, step.compute_s_per_token * tokens)

    def step_s(self, decoding: int, prefill_requests: int = 0, prefill_tokens: int = 0) -> float:
        """Duration of one engine step with ``decoding`` running decodes and some joining prefills."""
        if decoding == 0 and prefill_requests == 0:
            return 0.0
        prefill_s = self.profile.step.prefill_s_per_token * prefill_tokens
        batch = decoding + prefill_requests
        k = self.k_for(batch)
        if k == 0 or decoding == 0:
            plain = self.forward_s(batch) + prefill_s
            return plain * (1.0 + zero_k_overhead(batch)) if k == 0 and self.dynamic else plain
        return self.speculative_step_s(decoding, k, prefill_requests) + prefill_s

    def speculative_step_s(self, decoding: int, k: int, joining: int = 0) -> float:
        """A step that drafts ``k`` tokens for each of ``decoding`` requests and verifies them (``decoding x
        (k + 1)`` tokens, plus one for each of ``joining`` prefilling requests), prefill time left out. Each
        drafted token weighs ``verify_cost_ratio`` decode tokens in the verification pass (1: as many)."""
        spec = self.profile.speculative
        draft_s = k * spec.draft_cost_ratio * self.forward_s(decoding)
        v = spec.verify_cost_ratio
        verified = decoding * (k + 1) + joining if v == 1.0 else decoding + v * decoding * k + joining
        return draft_s + self.forward_s(verified)

    def effective_acceptance(self, workload_acceptance: float) -> float:
        scaled = workload_acceptance * self.profile.speculative.acceptance_scale
        return min(max(scaled, 0.0), 0.999)

    def time_per_output_token_s(self, batch: int, acceptance: float) -> float:
        """Steady-state decode time per output token with ``batch`` requests decoding together."""
        k = self.k_for(batch)
        tokens = expected_tokens_per_step(self.effective_acceptance(acceptance), k) if k else 1
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
    # Chained hashes of the prompt's full KV blocks (prefix_cache.chain_hashes); None: no prefix information,
    # nothing looked up or cached (every caller that predates the prefix cache).
    block_hashes: tuple[int, ...] | None = None
    cached_tokens: int = 0  # prompt tokens found in the prefix cache when it was last admitted
    held_blocks: int = 0  # its blocks pinned in the prefix cache while it runs
    queried: bool = False  # counted as a prefix-cache query (at its first admission, as vLLM counts)

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
    draft_tokens: int = 0  # tokens drafted for it this step (the step's k; 0 when not drafted)


@dataclass(frozen=True, slots=True)
class StepOutcome:
    duration_s: float
    emissions: tuple[Emission, ...]
    batch_tokens: int
    prefill_tokens: int  # prompt tokens computed this step (those found in the prefix cache are not)
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
    prefix_cache_queries: int = 0  # prompt tokens looked up (vLLM: at a request's first admission)
    prefix_cache_hits: int = 0  # of those, tokens found cached
    accepted_per_position: list[int] = field(default_factory=list)


class Engine:
    """A step-level continuous-batching engine. Not thread-safe; one owner drives it."""

    def __init__(self, model: TimingModel, rng: random.Random) -> None:
        self.model = model
        self._rng = rng
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[EngineRequest] = []
        self.counters = EngineCounters(accepted_per_position=[0] * model.k)
        self.cache = PrefixCache()

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
        """Share of the KV cache the running requests hold (free cached blocks count as free, as in vLLM)."""
        return min(1.0, self._used_tokens() / self.model.profile.kv_capacity_tokens)

    def _used_tokens(self) -> int:
        """KV tokens the running requests hold: their own, with the blocks they share counted once."""
        own = sum(request.kv_tokens - BLOCK_SIZE * request.held_blocks for request in self._running)
        return own + BLOCK_SIZE * self.cache.pinned_blocks

    def add(self, request: EngineRequest) -> None:
        if request.prompt_tokens + 1 > self.model.profile.kv_capacity_tokens:
            raise ValueError(f"prompt of {request.prompt_tokens} tokens does not fit the KV cache")
        self._waiting.append(request)

    def abort(self, request: EngineRequest) -> None:
        """Drop a request (client went away); it leaves the batch before the next step."""
        request.aborted = True
        if request in self._running:
            self._running.remove(request)
            self._stop_using(request)
        elif request in self._waiting:
            self._waiting.remove(request)

    def step(self) -> StepOutcome:
        """Run one engine step: admit, price, generate, retire, preempt on KV overflow."""
        self._admit()
        prefilling = [request for request in self._running if request.needs_prefill]
        decoding = [request for request in self._running if not request.needs_prefill]
        prompt_tokens = sum(request.kv_tokens for request in prefilling)
        prefill_tokens = prompt_tokens - sum(request.cached_tokens for request in prefilling)
        k = self.model.k_for(len(self._running))
        duration = self.model.step_s(len(decoding), len(prefilling), prefill_tokens)
        emissions = [self._prefill(request) for request in prefilling]
        emissions.extend(self._decode(request, k) for request in decoding)
        self._retire()
        preempted = self._preempt_overflow()
        self._count(emissions, prompt_tokens, preempted)
        batch_tokens = len(decoding) * (k + 1)
        return StepOutcome(duration, tuple(emissions), batch_tokens + len(prefilling), prefill_tokens, preempted)

    def _admit(self) -> None:
        limit = self.model.profile.max_num_seqs
        capacity = self.model.profile.kv_capacity_tokens
        used = self._used_tokens()
        while self._waiting and len(self._running) < limit:
            candidate = self._waiting[0]
            blocks = _blocks_of(candidate)
            shared = BLOCK_SIZE * self.cache.pinned_among(blocks) if blocks else 0  # held by running requests
            need = candidate.kv_tokens + 1 - shared
            if self._running and used + need > capacity:
                break  # (an empty engine always takes the head, so no request can wait forever)
            self._running.append(self._waiting.popleft())
            used += need
            if candidate.block_hashes is not None:
                self._start_using(candidate, blocks)
                self._evict_to_fit(used)

    def _start_using(self, request: EngineRequest, blocks: tuple[int, ...]) -> None:
        """Look the admitted request's prompt up in the prefix cache, count the query, pin its blocks. As in
        vLLM, the last prompt token is always computed (its logits give the first output token)."""
        hit = self.cache.lookup(blocks, (request.kv_tokens - 1) // BLOCK_SIZE)
        request.cached_tokens = BLOCK_SIZE * hit
        if not request.queried:  # a preempted request's second lookup is not counted
            request.queried = True
            self.counters.prefix_cache_queries += request.prompt_tokens
            self.counters.prefix_cache_hits += request.cached_tokens
        self.cache.acquire(blocks)
        request.held_blocks = len(blocks)

    def _stop_using(self, request: EngineRequest) -> None:
        if request.held_blocks:
            self.cache.release(_blocks_of(request)[: request.held_blocks])
            request.held_blocks = 0

    def _hand_back(self, request: EngineRequest) -> None:
        """A finished request's blocks stay cached, free: its prompt's, and those its answer filled where the
        caller sent their hashes (block hashes past the prompt's: vLLM caches a sequence's full generated blocks
        too, so a conversation's next turn, which resends the answer, hits them). The answer's are freed first
        (the tail first, as vLLM frees), so they are evicted before the prompt's."""
        hashes = request.block_hashes or ()
        answer = hashes[request.prompt_tokens // BLOCK_SIZE : request.kv_tokens // BLOCK_SIZE]
        if not answer:
            self._stop_using(request)
            return
        self.cache.acquire(answer)
        self.cache.release((*_blocks_of(request)[: request.held_blocks], *answer))
        request.held_blocks = 0

    def _evict_to_fit(self, used: int) -> None:
        """Evict free cached blocks (LRU) until they fit beside ``used`` running tokens."""
        excess = used + BLOCK_SIZE * self.cache.free_blocks - self.model.profile.kv_capacity_tokens
        if excess > 0:
            self.cache.evict(-(-excess // BLOCK_SIZE))

    def _retire(self) -> None:
        running = []
        for request in self._running:
            if not request.finished:
                running.append(request)
            elif request.block_hashes is not None:
                self._hand_back(request)
        self._running = running

    def _prefill(self, request: EngineRequest) -> Emission:
        request.needs_prefill = False
        request.generated += 1
        return Emission(request, 1, drafted=False, accepted=0, finished=request.finished)

    def _decode(self, request: EngineRequest, k: int) -> Emission:
        accepted = 0
        if k:
            acceptance = self.model.effective_acceptance(request.acceptance)
            accepted = draw_accepted(self._rng, acceptance, k)
        remaining = request.output_tokens - request.generated
        tokens = min(1 + accepted, remaining)
        request.generated += tokens
        return Emission(request, tokens, k > 0, accepted, request.finished, k)

    def _preempt_overflow(self) -> int:
        """Make room for grown sequences: evict free cached blocks first, then preempt the newest requests."""
        capacity = self.model.profile.kv_capacity_tokens
        preempted = 0
        used = self._used_tokens()
        self._evict_to_fit(used)
        while len(self._running) > 1 and used > capacity:
            victim = self._running.pop()
            self._stop_using(victim)
            victim.needs_prefill = True
            self._waiting.appendleft(victim)
            preempted += 1
            used = self._used_tokens()
        self._evict_to_fit(used)
        return preempted

    def _count(self, emissions: list[Emission], prompt_tokens: int, preempted: int) -> None:
        counters = self.counters
        counters.steps += 1
        counters.prompt_tokens += prompt_tokens  # vLLM counts cached prompt tokens here too
        for emission in emissions:
            counters.generation_tokens += emission.tokens
            if not emission.drafted:
                continue
            counters.drafts += 1
            counters.draft_tokens += emission.draft_tokens
            counters.accepted_tokens += emission.accepted
            for position in range(emission.accepted):
                counters.accepted_per_position[position] += 1
        counters.preemptions += preempted


def _blocks_of(request: EngineRequest) -> tuple[int, ...]:
    """The request's block hashes that its prompt fills (a caller may send more than the prompt holds)."""
    hashes = request.block_hashes
    return hashes[: request.prompt_tokens // BLOCK_SIZE] if hashes else ()
