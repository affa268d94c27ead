"""Virtual-time simulation: the gateway's own ``decide()`` routing a workload between two emulated pools.

No HTTP and no sleeping: arrivals (see :mod:`backends.emulator.scenarios`) are turned into the gateway's
:class:`RequestFeatures` by the gateway's ``extract_features`` (so the classifier's mistakes count), routed
by ``decide(features, snapshot, rules)`` and served by the same :class:`Engine` the emulator server runs,
one per replica. Deterministic for a seed.

The decider sees only what a gateway sees: each pool's engine stats (running, waiting, KV use, acceptance)
as of the last scrape, every ``scrape_interval_s``, plus the gateway's own in-flight requests, fresh. The
learning policies feed the gateway's own :class:`~gateway.adaptive.learner.Learner` with every finished
request, as the deployment's telemetry reports it (:mod:`backends.emulator.telemetry`: exact tokens or the
gateway's count of a stream's events, the request's acceptance or none), and refresh the model in the
snapshot every ``model_interval_s``.

Policies: ``always-standard`` / ``always-speculative`` (rules with no rule, so they too go through
``decide()``), ``rules`` (the reference rules, ``gateway/rules-reference.yaml``), ``adaptive`` (the shipped
rules: pins, then ``fastest``, from a cold start), ``adaptive-warm`` (the same, in steady state: its learner
first served other arrivals at the same load, as a gateway replica that joins the others through Redis
does), ``perfect-predictor`` (the bound to judge by: the shipped decision, warm as ``adaptive-warm`` is, fed
each request's true acceptance and output length through ``RequestFeatures.known`` and the engines' exact
state at every decision; its distance from ``adaptive-warm`` is what prediction error costs) and ``myopic``
(knows each request's truth and the engines' exact state, and picks the replica that finishes this request
first, blind to the delay it adds to the others: a reference, not a bound; a policy that counts that delay
beats it under load). Each policy's run is made in :mod:`backends.emulator.policies`.

Sessions (:mod:`backends.emulator.session_sim`): an arrival may wait for an earlier one (``after``, the
index of the previous turn of its session); it arrives when that one finishes plus its ``think_s``. With
``prefix_caching`` every request carries its prompt's KV block hashes (``Arrival.block_hashes``) and the
engines' prefix caches work; without it they carry none and nothing is cached (every figure on single-turn
workloads is computed that way). ``layout`` sets how many engines each pool has (a single-pool baseline puts
all of them in one pool) and ``picker`` how a replica is chosen within the pool: ``fewest`` in flight (the
default), ``two-choices`` (the gateway's choice with its prefix index off: power of two choices on booked
tokens, ``gateway.pools.choose_replica`` without blocks), ``prefix``
(:func:`backends.emulator.prefix_router.prefix_choice`, reading the engines' caches), ``sticky`` (a session's
turns return to the replica of its first turn) or ``index``: the gateway's own choice
(``gateway.pools.choose_replica``) over the gateway's prefix index (``gateway.prefix_index.PrefixIndex``) of
what this gateway sent where, from the blocks of each request's text (``RequestFeatures.blocks``), with power
of two choices on booked tokens where no eligible replica holds any. With ``see_cache`` the decision also reads,
per pool, the prompt tokens the replica it would choose is expected to hold (``RequestFeatures.cached_tokens``,
``gateway.pools.expected_cached``), as the gateway does, and the learner learns against the uncached rest.

``known`` carries the acceptance as the speculative engine draws it: the per-token acceptance ``a`` (the
workload's, times the profile's ``acceptance_scale``), whose mean tokens per step is ``(1 - a^(k+1)) / (1 - a)``.
The model reads it in ``gateway.adaptive.policy``; a model that did not would make ``perfect-predictor``
``adaptive-warm`` with the engines' exact state.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from backends.emulator.prefix_cache import BLOCK_SIZE
from backends.emulator.prefix_router import Candidate, prefix_choice
from backends.emulator.profiles import Profile
from backends.emulator.telemetry import FULL, Telemetry, estimated_tokens, has_usage, usage_draw
from backends.emulator.timing import Engine, EngineRequest, StepOutcome, TimingModel, expected_tokens_per_step
from backends.workloads.loader import WorkloadItem
from gateway.adaptive.cross import other_busy_share
from gateway.adaptive.learner import Learner, Observation
from gateway.adaptive.model import LatencyModel, segment_of
from gateway.decide import decide, replica_worth
from gateway.features import RequestFeatures
from gateway.pools import LoadClock, LoadSpan, choose_replica, expected_cached
from gateway.prefix_index import PrefixIndex
from gateway.qps import LocalQps
from gateway.rules import RoutingRules
from gateway.snapshot import POOL_NAMES, SPECULATIVE, PoolSnapshot, Snapshot, other_pool

ALWAYS_STANDARD = "always-standard"
ALWAYS_SPECULATIVE = "always-speculative"
RULES = "rules"
ADAPTIVE = "adaptive"
ADAPTIVE_WARM = "adaptive-warm"
PERFECT = "perfect-predictor"
MYOPIC = "myopic"
DYNAMIC_POOL = "dynamic-pool"  # one pool of twice the engines, every one speculative with vLLM's dynamic table
# what perfect-predictor is fed (``--perfect-knows``): the truth of both, or of one (the other estimated), which
# splits its distance from the learned policy into what each prediction's error costs
BOTH, ACCEPTANCE, LENGTH = "both", "acceptance", "length"
PERFECT_KNOWS = (BOTH, ACCEPTANCE, LENGTH)
POLICIES = (ALWAYS_STANDARD, ALWAYS_SPECULATIVE, RULES, ADAPTIVE, ADAPTIVE_WARM, PERFECT, MYOPIC, DYNAMIC_POOL)
# The single-pool baselines of session workloads, at equal hardware (session_sim.py builds them)
PLAIN_PREFIX = "plain-prefix"  # every replica standard, prefix-aware and load-aware replica choice
DYNAMIC_PREFIX = "dynamic-prefix"  # every replica speculative with dynamic k, the same replica choice
PLAIN_STICKY = "plain-sticky"  # every replica standard, a session always back on its first turn's replica
PLAIN_BLIND = "plain-blind"  # every replica standard, the fewest in flight (cache-blind)
ADAPTIVE_PREFIX = "adaptive-prefix"  # specgate's two pools, the gateway's prefix index choosing the replica
ADAPTIVE_CACHE = "adaptive-cache"  # the same, and the pool choice reads what each pool is expected to hold
SESSION_POLICIES = (ADAPTIVE, ADAPTIVE_PREFIX, ADAPTIVE_CACHE, PLAIN_PREFIX, DYNAMIC_PREFIX, PLAIN_STICKY, PLAIN_BLIND)
Picker = Literal["fewest", "two-choices", "prefix", "sticky", "index"]  # how a replica is picked within the pool
FEWEST: Picker = "fewest"
TWO_CHOICES: Picker = "two-choices"
PREFIX: Picker = "prefix"
STICKY: Picker = "sticky"
INDEX: Picker = "index"


@dataclass(frozen=True, slots=True)
class Arrival:
    index: int
    at_s: float
    item: WorkloadItem
    features: RequestFeatures
    acceptance: float  # the truth the engine draws from (the item's, unless a drift scenario changed it)
    block_hashes: tuple[int, ...] | None = None  # its prompt's KV blocks (sessions)
    session: str | None = None  # the session it belongs to, and its turn there (1: the first)
    turn: int = 1
    after: int | None = None  # the previous turn's index: this arrives when that one finishes, plus think_s
    think_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RequestResult:
    index: int
    item_id: str
    task: str  # ground truth
    classified_task: str  # what the gateway's classifier said
    pool: str
    reason: str
    arrival_s: float
    acceptance: float
    output_tokens: int
    ttft_s: float
    latency_s: float
    explored: bool = False
    session: str | None = None
    turn: int = 1  # of its session (1 outside sessions)
    replica: int = 0  # which engine of its pool served it
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of its prompt, found in the replica's prefix cache


@dataclass(eq=False)
class _Replica:
    pool: str
    engine: Engine
    index: int = 0  # within its pool
    step_end_s: float = math.inf
    outcome: StepOutcome | None = None
    inflight: int = 0
    booked_tokens: int = 0  # as the gateway books them: prompt + max_tokens x sequences, per request in flight

    @property
    def url(self) -> str:
        """Its name in the gateway's prefix index."""
        return f"{self.pool}/{self.index}"

    def start_step(self, now: float, slowdown: float = 1.0) -> None:
        self.outcome = self.engine.step()
        self.step_end_s = now + self.outcome.duration_s * slowdown


@dataclass(eq=False)
class _Progress:
    arrival: Arrival
    replica: _Replica
    reason: str
    load: float
    explored: bool
    request: EngineRequest
    other_load: float | None  # the other pool's load as the decision saw it (None: not read)
    other_mark: tuple[float, float]  # the other pool's load clock as the request began (LoadClock.mark)
    span: LoadSpan  # its time on the pool's load clock, as a gateway booking keeps it
    features: RequestFeatures  # as the decision read them
    booked: int = 0  # tokens booked on its replica
    gateway: int = 0  # the gateway replica that routed it
    first_token_s: float | None = None
    steps: int = 0  # engine steps that gave it tokens: a stream's events after the role event
    drafted_steps: int = 0
    drafted_tokens: int = 0


@dataclass(frozen=True, slots=True)
class _Scrape:
    at_s: float
    pools: dict[str, PoolSnapshot]


@dataclass
class Simulation:
    """One policy against fresh emulated pools of ``replicas`` engines each."""

    profile: Profile
    rules: RoutingRules
    seed: int = 0
    learner: Learner | None = None
    myopic: bool = False  # route by the request's true completion time alone, not by decide()
    perfect: bool = False  # decide() with each request's truth in ``features.known``
    perfect_knows: str = BOTH  # with ``perfect``: which truth (BOTH, ACCEPTANCE or LENGTH; the other estimated)
    replicas: int = 1
    scrape_interval_s: float = 1.0  # 0: every decision reads the engines as they are
    model_interval_s: float = 0.25
    # gateway replicas in front of the pools, arrivals dealt round-robin: each sees its own requests at once
    # and the others' only through the engines' stats, a scrape late (its own scrape clock); they share one
    # learner (as Redis would, without its delay). ``gateways_known``: each knows how many there are (Redis).
    gateways: int = 1
    gateways_known: bool = True
    telemetry: Telemetry = FULL
    prefix_caching: bool = False  # requests carry their block hashes (sessions); off: nothing is cached
    layout: Mapping[str, int] | None = None  # engines per pool; None: ``replicas`` each
    picker: Picker = FEWEST
    see_cache: bool = False  # the decision reads each pool's expected cached tokens (picker ``index`` only)
    _index: PrefixIndex | None = field(init=False, default=None)  # the gateway's (picker ``index``)
    _pick_rng: random.Random = field(init=False)  # its power of two choices' draws
    _homes: dict[str, _Replica] = field(init=False, default_factory=dict)  # sticky: a session's replica
    _followers: dict[int, Arrival] = field(init=False, default_factory=dict)  # next turns by previous index
    _due: list[tuple[float, int, Arrival]] = field(init=False, default_factory=list)  # next turns, scheduled
    _replicas: dict[str, list[_Replica]] = field(init=False)
    _qps: LocalQps = field(init=False, default_factory=LocalQps)
    _scrapes: list[_Scrape | None] = field(init=False)
    _model: LatencyModel | None = field(init=False, default=None)
    _model_at: float = field(init=False, default=-math.inf)
    _own: list[dict[str, int]] = field(init=False)  # per gateway, its requests in flight per pool
    _clocks: list[dict[str, LoadClock]] = field(init=False)  # per gateway and pool, as each gateway's

    def __post_init__(self) -> None:
        def engine(name: str, index: int) -> Engine:
            rng = random.Random(f"{self.seed}:{name}" + (f":{index}" if index else ""))
            return Engine(TimingModel(self.profile, name == SPECULATIVE), rng)

        counts = self.layout or dict.fromkeys(POOL_NAMES, self.replicas)
        self._replicas = {
            name: [_Replica(name, engine(name, i), i) for i in range(counts[name])] for name in POOL_NAMES
        }
        self._all = [r for name in POOL_NAMES for r in self._replicas[name]]
        self._scrapes = [None] * self.gateways
        self._own = [dict.fromkeys(POOL_NAMES, 0) for _ in range(self.gateways)]
        self._clocks = [{name: LoadClock(at=0.0) for name in POOL_NAMES} for _ in range(self.gateways)]
        self._pick_rng = random.Random(f"{self.seed}:replica")
        if self.picker == INDEX:
            self._index = PrefixIndex()

    def run(self, arrivals: Sequence[Arrival]) -> list[RequestResult]:
        """Serve the arrivals; one that waits for an earlier one (``after``) comes when that one finishes."""
        live: dict[EngineRequest, _Progress] = {}
        results: list[RequestResult] = []
        first = [arrival for arrival in arrivals if arrival.after is None]
        self._followers = {arrival.after: arrival for arrival in arrivals if arrival.after is not None}
        position = 0
        while position < len(first) or self._due or any(r.outcome is not None for r in self._all):
            next_arrival = first[position].at_s if position < len(first) else math.inf
            due = self._due[0][0] if self._due else math.inf
            replica = min(self._all, key=lambda candidate: candidate.step_end_s)
            if min(next_arrival, due) <= replica.step_end_s:
                if due < next_arrival:
                    self._admit(heapq.heappop(self._due)[2], live)
                else:
                    self._admit(first[position], live)
                    position += 1
            else:
                self._finish_step(replica, live, results)
        return sorted(results, key=lambda result: result.index)

    # -- what the gateway sees --------------------------------------------------------------------------
    @property
    def _gateways_seen(self) -> int:
        """How many gateways each one counts (``Snapshot.gateways``): all of them with Redis, else itself."""
        return self.gateways if self.gateways_known else 1

    def _snapshot(self, now: float, gateway: int = 0) -> Snapshot:
        scrape = self._scrapes[gateway]
        if scrape is None or now - scrape.at_s >= self.scrape_interval_s:
            scrape = self._scrapes[gateway] = _Scrape(now, {name: self._scraped(name, gateway) for name in POOL_NAMES})
        if self.learner is not None and now - self._model_at >= self.model_interval_s:
            self._model, self._model_at = self.learner.model(now), now
        own = self._own[gateway]
        pools = {
            name: dataclasses.replace(scraped, inflight=own[name], stats_age_s=now - scrape.at_s)
            for name, scraped in scrape.pools.items()
        }
        return Snapshot(
            pools=pools, qps=self._qps.rate(now), qps_age_s=0.0, model=self._model, gateways=self._gateways_seen
        )

    def _scraped(self, name: str, gateway: int) -> PoolSnapshot:
        replicas = self._replicas[name]
        drafts = sum(r.engine.counters.drafts for r in replicas)
        draft_tokens = sum(r.engine.counters.draft_tokens for r in replicas)
        accepted = sum(r.engine.counters.accepted_tokens for r in replicas)
        inflight = self._own[gateway][name]
        return PoolSnapshot(
            name,
            healthy_replicas=len(replicas),
            total_replicas=len(replicas),
            running=float(sum(r.engine.num_running for r in replicas)),
            waiting=float(sum(r.engine.num_waiting for r in replicas)),
            kv_cache_usage=sum(r.engine.kv_usage for r in replicas) / len(replicas) if replicas else 0.0,
            acceptance_rate=accepted / draft_tokens if draft_tokens else None,
            acceptance_length=1 + accepted / drafts if drafts else None,
            stats_age_s=0.0,
            inflight=inflight,
            inflight_base=inflight,
        )

    # -- events ---------------------------------------------------------------------------------------
    def _admit(self, arrival: Arrival, live: dict[EngineRequest, _Progress]) -> None:
        now = arrival.at_s
        self._qps.record(now)
        gateway = arrival.index % self.gateways
        item = arrival.item
        output_tokens = min(item.output_tokens, item.max_tokens)
        features = arrival.features
        if self.myopic:
            replica = self._myopic(item.prompt_tokens, float(output_tokens), arrival.acceptance)
            reason, load, explored, other_load = MYOPIC, 0.0, False, None
        else:
            features = self._features(arrival, output_tokens)
            snapshot = self._snapshot(now, gateway)
            decision = decide(features, snapshot, self.rules)
            replicas = self._replicas[decision.pool]
            worth = None
            if self._index is not None and features.blocks:  # the gateway's replica choice prices its cache
                worth = replica_worth(decision, features, snapshot, self.rules, len(replicas))
            replica = self._pick(replicas, arrival, features, worth)
            reason, load, explored = decision.reason, decision.load, decision.explored
            other_load = decision.other_load if decision.learning else None
        request = EngineRequest(
            request_id=str(arrival.index),
            prompt_tokens=item.prompt_tokens,
            output_tokens=output_tokens,
            acceptance=arrival.acceptance,
            finish_reason="length" if item.max_tokens < item.output_tokens else "stop",
            block_hashes=arrival.block_hashes if self.prefix_caching else None,
        )
        replica.engine.add(request)
        replica.inflight += 1
        booked = features.prompt_tokens + features.max_tokens * features.sequences
        replica.booked_tokens += booked
        self._own[gateway][replica.pool] += 1
        clocks = self._clocks[gateway]
        span = clocks[replica.pool].begin(now)
        mark = clocks[other_pool(replica.pool)].mark(now)
        live[request] = _Progress(
            arrival, replica, reason, load, explored, request, other_load, mark, span, features, booked, gateway
        )  # fmt: skip
        if replica.outcome is None:
            self._start_step(replica, now)

    def _pick(
        self, replicas: Sequence[_Replica], arrival: Arrival, features: RequestFeatures, worth: float | None = None
    ) -> _Replica:  # fmt: skip
        """The replica of the chosen pool: the fewest in flight, power of two choices on booked tokens
        (``two-choices``), the longest cached prefix (``prefix``, within a load slack), the session's first
        replica (``sticky``) or the gateway's choice (``index``)."""
        if self._index is not None:
            chosen = choose_replica(replicas, features.blocks, self._index, self._pick_rng, worth)
            assert chosen is not None
            if features.blocks:
                self._index.record(chosen.url, features.blocks)
            return chosen
        if self.picker == TWO_CHOICES:
            chosen = choose_replica(replicas, (), None, self._pick_rng)
            assert chosen is not None
            return chosen
        if self.picker == PREFIX and arrival.block_hashes is not None:
            limit = (arrival.item.prompt_tokens - 1) // BLOCK_SIZE  # what the engine could hit (timing.py)
            candidates = [Candidate(r.engine.cache.lookup(arrival.block_hashes, limit), r.inflight) for r in replicas]
            return replicas[prefix_choice(candidates)]
        home = self._homes.get(arrival.session) if self.picker == STICKY and arrival.session is not None else None
        if home is not None and home in replicas:
            return home
        chosen = min(replicas, key=lambda r: r.inflight)
        if self.picker == STICKY and arrival.session is not None:
            self._homes[arrival.session] = chosen
        return chosen

    def _features(self, arrival: Arrival, output_tokens: int) -> RequestFeatures:
        """The request's features as ``decide()`` reads them: with its truth for ``perfect-predictor`` (the
        acceptance the speculative engine draws from, and its output length), as extracted for the others; with
        ``see_cache``, what each pool is expected to hold of its prompt (as the gateway reads it)."""
        features = arrival.features
        if self._index is not None and self.see_cache and features.blocks:
            cached = expected_cached(
                self._replicas, features.blocks, features.prefix_bytes, features.prompt_tokens, self._index
            )  # fmt: skip
            features = dataclasses.replace(features, cached_tokens=cached)
        if not self.perfect:
            return features
        model = self._replicas[SPECULATIVE][0].engine.model
        rate = None if self.perfect_knows == LENGTH else model.effective_acceptance(arrival.acceptance)
        return dataclasses.replace(features, known=(rate, None if self.perfect_knows == ACCEPTANCE else output_tokens))

    def _myopic(self, prompt_tokens: int, output_tokens: float, acceptance: float) -> _Replica:
        """The replica whose estimated completion for this request is earliest, from the exact engine state;
        what the request does to the others' completions is not counted."""
        best, best_s = self._all[0], math.inf
        for replica in self._all:
            engine, model = replica.engine, replica.engine.model
            limit = model.profile.max_num_seqs
            batch = min(engine.num_running + engine.num_waiting + 1, limit)
            step = model.step_s(batch)
            tokens = (
                expected_tokens_per_step(model.effective_acceptance(acceptance), model.k) if model.speculative else 1.0
            )
            queued = max(engine.num_running + engine.num_waiting + 1 - limit, 0)
            wait = queued / limit * step * engine.mean_remaining_tokens
            done = wait + model.profile.step.prefill_s_per_token * prompt_tokens + step * output_tokens / tokens
            if done < best_s:
                best, best_s = replica, done
        return best

    def _finish_step(
        self, replica: _Replica, live: dict[EngineRequest, _Progress], results: list[RequestResult]
    ) -> None:
        now, outcome = replica.step_end_s, replica.outcome
        assert outcome is not None
        for emission in outcome.emissions:
            progress = live[emission.request]
            if progress.first_token_s is None:
                progress.first_token_s = now
            progress.steps += 1
            if emission.drafted:
                progress.drafted_steps += 1
                progress.drafted_tokens += emission.tokens
            if emission.finished:
                live.pop(emission.request)
                replica.inflight -= 1
                replica.booked_tokens -= progress.booked
                self._own[progress.gateway][replica.pool] -= 1
                results.append(self._result(progress, now, progress.span.end(now)))
                self._schedule_next(progress.arrival, now)
        replica.outcome, replica.step_end_s = None, math.inf
        if replica.engine.has_work:
            self._start_step(replica, now)

    def _schedule_next(self, arrival: Arrival, finished_s: float) -> None:
        """The session's next turn, if any, arrives ``think_s`` after this answer ends."""
        follower = self._followers.pop(arrival.index, None)
        if follower is not None:
            at = finished_s + follower.think_s
            heapq.heappush(self._due, (at, follower.index, dataclasses.replace(follower, at_s=at)))

    def _start_step(self, replica: _Replica, now: float) -> None:
        """The replica's next step; on hardware shared with the other pool (``Profile.shared_hardware``), slower
        by that share for the other pool's replicas that have work as the step starts."""
        shared = self.profile.shared_hardware
        if not shared:
            replica.start_step(now)
            return
        others = self._replicas[other_pool(replica.pool)]
        busy = sum(1 for other in others if other.engine.has_work) / len(others) if others else 0.0
        replica.start_step(now, 1.0 + shared * busy)

    def _result(self, progress: _Progress, finished_s: float, run_shift: float | None) -> RequestResult:
        arrival = progress.arrival
        first = progress.first_token_s if progress.first_token_s is not None else finished_s
        result = RequestResult(
            index=arrival.index,
            item_id=arrival.item.id,
            task=arrival.item.task,
            classified_task=arrival.features.task,
            pool=progress.replica.pool,
            reason=progress.reason,
            arrival_s=arrival.at_s,
            acceptance=arrival.acceptance,
            output_tokens=progress.request.generated,
            ttft_s=first - arrival.at_s,
            latency_s=finished_s - arrival.at_s,
            explored=progress.explored,
            session=arrival.session,
            turn=arrival.turn,
            replica=progress.replica.index,
            prompt_tokens=progress.request.prompt_tokens,
            cached_tokens=progress.request.cached_tokens,
        )
        if self.learner is not None:
            self.learner.observe(self._observation(progress, result, finished_s, run_shift))
        return result

    def _observation(
        self, progress: _Progress, result: RequestResult, finished_s: float, run_shift: float | None
    ) -> Observation:
        """What the gateway learns from the finished request, as the telemetry reports it."""
        features = progress.features
        segment = segment_of(features.task, features.copy)
        usage = has_usage(self.telemetry, features.stream, usage_draw(self.seed, progress.arrival.index))
        acceptance = None
        if usage and self.telemetry.spec_metrics and progress.drafted_steps:
            acceptance = progress.drafted_tokens / progress.drafted_steps
        tokens = result.output_tokens
        if not usage:  # the role event and one per step, counted by the acceptance length known so far
            scrape = self._scrapes[progress.gateway]
            scraped = scrape.pools[result.pool].acceptance_length if scrape is not None else None
            tokens = estimated_tokens(progress.steps + 1, self._model, result.pool, segment, scraped)
        seen_ttft = result.ttft_s if features.stream else None  # a whole reply shows only its end
        # the load it ran at, as the gateway learns it (gateway.pools.Booking.run_shift)
        load, gateways = progress.load, self._gateways_seen
        run_load = load if run_shift is None else max(load + gateways * run_shift, 0.0)
        return Observation(
            result.pool, segment, features.prompt_tokens, load, seen_ttft, result.latency_s, tokens,
            acceptance, finished_s, run_load, features.template, features.content,
            other_busy_share(
                self._clocks[progress.gateway][other_pool(result.pool)].busy_since(progress.other_mark, finished_s),
                progress.other_load, gateways,
            ),
            None if features.cached_tokens is None else features.cached_on(result.pool),
        )  # fmt: skip
