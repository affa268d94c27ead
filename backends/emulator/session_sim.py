"""Sessions in the simulator: multi-turn arrivals, the engines' prefix caches, and single-pool baselines.

**Arrivals** (:func:`make_session_arrivals`). Sessions start as a Poisson process; each is drawn uniformly
from the session set. A level's load is a share of one pool's capacity in *requests* (as for single-turn
workloads, over all turns), so sessions start at ``qps / mean turns per session``. A session's first turn
arrives when it starts; each next turn ``think_s`` after the previous answer finished, ``think_s`` drawn
exponential with mean ``think_mean_s`` (drawn with the arrivals, so every policy serves the same sessions
with the same pauses). Every turn carries its KV block hashes, its prompt's and then those its answer fills
(:func:`answer_blocks`: the engine caches them when the turn ends, as vLLM does); a session drawn again is another
user: its blocks after the system prompt hash apart (``prompt_blocks.chat_blocks(salt=...)``), while the
system prompt (tool definitions, retrieved documents) is shared. Its features carry what the gateway reads
with the prefix index on (``gateway.prefix_index.PrefixReader``: the text's 512-byte blocks, the session key,
the bytes read), from the same text with the same salt at the same message's start, so that the gateway's
index tells users apart where the engines' caches do.

**Policies at equal hardware** (``2 x replicas`` engines in all), every engine with its prefix cache on
unless ``prefix_caching`` is off:

- ``adaptive``: specgate with its prefix index off, two pools of ``replicas`` engines, the shipped adaptive rules
  from a cold start, the replica within the pool as the gateway then chooses it: power of two choices on booked
  tokens (cache-blind; the issue's baseline; until Dec 6 2026 the fewest in flight, a balance the gateway never
  had: with two replicas the two are nearly alike, with more the fewest in flight spreads a session less);
- ``adaptive-prefix``: the same pool choice, the replica within the pool by the gateway's own cache-aware
  choice (``gateway.pools.choose_replica`` over a ``gateway.prefix_index.PrefixIndex`` of what it sent where,
  read from each turn's text: ``Simulation`` picker ``index``), before any cache-aware pool choice;
- ``adaptive-cache``: the same, and the pool choice reads per pool the prompt tokens its chosen replica is
  expected to hold (``RequestFeatures.cached_tokens``), so the latency model counts a move's re-prefill;
- ``plain-prefix``: every engine standard, the replica by :func:`~backends.emulator.prefix_router.prefix_choice`
  (the longest cached prefix unless much busier than the least loaded);
- ``dynamic-prefix``: every engine speculative with vLLM's dynamic speculation (``profiles.dynamic_table``), the
  same replica choice;
- ``plain-sticky``: every engine standard, a session always back on its first turn's replica (a reference:
  the most cache reuse, no load balance after the first turn);
- ``plain-blind``: every engine standard, the fewest in flight (what the cache gives without a router that
  knows it).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.emulator.evaluate import Options
from backends.emulator.policies import PolicySet, after_warmup, fixed_pool_rules
from backends.emulator.prefix_cache import BLOCK_SIZE
from backends.emulator.profiles import Profile, with_dynamic_k
from backends.emulator.prompt_blocks import chat_blocks
from backends.emulator.report import SessionSummary, summarise_sessions
from backends.emulator.scenarios import capacity_qps, request_features
from backends.emulator.simulate import (
    ADAPTIVE,
    ADAPTIVE_CACHE,
    ADAPTIVE_PREFIX,
    DYNAMIC_PREFIX,
    FEWEST,
    INDEX,
    PLAIN_BLIND,
    PLAIN_PREFIX,
    PLAIN_STICKY,
    PREFIX,
    STICKY,
    TWO_CHOICES,
    Arrival,
    Picker,
    RequestResult,
    Simulation,
)
from backends.workloads.sessions import SessionSet, SessionTurn
from gateway.adaptive.learner import Learner
from gateway.features import Classifier
from gateway.prefix_index import PrefixReader
from gateway.rules import RoutingRules
from gateway.snapshot import SPECULATIVE, STANDARD, other_pool

DEFAULT_THINK_S = 5.0


def make_session_arrivals(
    sessions: SessionSet, qps: float, duration_s: float, seed: int, rules: RoutingRules,
    think_mean_s: float = DEFAULT_THINK_S,
) -> list[Arrival]:  # fmt: skip
    """Every turn of the sessions that start within ``duration_s`` (see the module's doc); a next turn's
    ``at_s`` is its session's start until the simulation schedules it."""
    rng = random.Random(f"{seed}:sessions:{qps}")
    classifier, reader = Classifier(rules, read_content=True), PrefixReader()
    rate = qps / sessions.mean_turns
    arrivals: list[Arrival] = []
    now, started = 0.0, 0
    while True:
        now += rng.expovariate(rate)
        if now >= duration_s:
            return arrivals
        session = rng.choice(sessions.sessions)
        name, previous = f"{session.id}#{started}", None
        started += 1
        for number, turn in enumerate(session.turns, start=1):
            think = rng.expovariate(1.0 / think_mean_s) if number > 1 and think_mean_s > 0 else 0.0
            features = request_features(turn.item, rng, rules, classifier)
            blocks = answer_blocks(turn, name)
            features.blocks, features.session, features.prefix_bytes = reader.chat(
                salted(turn.item.messages, name), None, {}
            )  # fmt: skip
            index = len(arrivals)
            arrivals.append(Arrival(index, now, turn.item, features, turn.item.acceptance, blocks, name, number,
                                    previous, think))  # fmt: skip
            previous = index


def answer_blocks(turn: SessionTurn, salt: str) -> tuple[int, ...]:
    """The turn's KV block hashes through its answer: its prompt's, then the full blocks its generated tokens
    fill (the engine caches those too when it finishes, and the next turn, which resends the answer, hits them).
    The answer is rendered as the next turn renders it (``<|im_start|> assistant``, a newline, its text)."""
    item = turn.item
    if not turn.answer:
        return chat_blocks(item.messages, salt=salt)
    generated = min(item.output_tokens, item.max_tokens)
    rendered = chat_blocks((*item.messages, {"role": "assistant", "content": turn.answer}), salt=salt)
    return rendered[: (item.prompt_tokens + generated) // BLOCK_SIZE]


def salted(messages: Sequence[Mapping[str, Any]], salt: str) -> list[Mapping[str, Any]]:
    """The messages with ``salt`` at the start of the first one after the system prompt, where
    ``prompt_blocks.chat_tokens`` salts its tokens (for the gateway's reading only: the request is unchanged; in
    the text, not the role, so that the reader still finds the first user message's end)."""
    out = list(messages)
    for position, message in enumerate(out):
        if str(message.get("role", "")) not in ("system", "developer"):
            out[position] = {**message, "content": f"{salt}\x1f{message.get('content') or ''}"}
            break
    return out


def session_simulations(
    profile: Profile, policies: PolicySet, seed: int, options: Options, prefix_caching: bool = True
) -> dict[str, Callable[[], Simulation]]:
    """How each session policy's run is made (module doc); ``options.replicas`` engines per pool of specgate's
    two, twice that in the single pool of a baseline."""

    def make(on: Profile, rules: RoutingRules, *, layout: dict[str, int] | None = None, picker: Picker = FEWEST,
             learner: Learner | None = None, see_cache: bool = False) -> Simulation:  # fmt: skip
        return Simulation(
            on, rules, seed, learner, replicas=options.replicas, gateways=options.gateways, layout=layout,
            picker=picker, scrape_interval_s=options.scrape_interval_s, telemetry=options.telemetry,
            prefix_caching=prefix_caching, see_cache=see_cache,
        )  # fmt: skip

    def single(pool: str, picker: Picker, on: Profile = profile) -> Simulation:
        layout = {pool: 2 * options.replicas, other_pool(pool): 0}
        return make(on, fixed_pool_rules(policies.reference, pool), layout=layout, picker=picker)

    sims: dict[str, Callable[[], Simulation]] = {}
    adaptive = policies.adaptive
    if adaptive is not None:
        rate, forget, shared = (
            adaptive.adaptive.learning_rate, adaptive.adaptive.stale_s, adaptive.adaptive.shared_device
        )
        sims[ADAPTIVE] = lambda: make(profile, adaptive, picker=TWO_CHOICES, learner=Learner(rate, forget, shared))
        sims[ADAPTIVE_PREFIX] = lambda: make(profile, adaptive, picker=INDEX, learner=Learner(rate, forget, shared))
        sims[ADAPTIVE_CACHE] = lambda: make(
            profile, adaptive, picker=INDEX, learner=Learner(rate, forget, shared), see_cache=True
        )  # fmt: skip
    sims[PLAIN_PREFIX] = lambda: single(STANDARD, PREFIX)
    sims[DYNAMIC_PREFIX] = lambda: single(SPECULATIVE, PREFIX, with_dynamic_k(profile))
    sims[PLAIN_STICKY] = lambda: single(STANDARD, STICKY)
    sims[PLAIN_BLIND] = lambda: single(STANDARD, FEWEST)
    return sims


@dataclass(frozen=True, slots=True)
class SessionLevel:
    share: float  # of one pool's capacity, in requests
    qps: float  # requests per second (sessions start at qps / mean turns)
    seed: int
    summaries: dict[str, SessionSummary]


def evaluate_sessions(
    profile: Profile, sessions: SessionSet, policies: PolicySet, share: float, seed: int,
    options: Options | None = None, think_mean_s: float = DEFAULT_THINK_S, prefix_caching: bool = True,
    include: Sequence[str] | None = None,
) -> SessionLevel:  # fmt: skip
    """Every session policy (or those in ``include``) at ``share`` of one pool's capacity, on the same arrivals;
    turns that arrive in the warm-up are left out."""
    options = options or Options()
    qps = capacity_qps(profile, sessions.workload) * share
    arrivals = make_session_arrivals(sessions, qps, options.duration_s, seed, policies.reference, think_mean_s)
    sims = session_simulations(profile, policies, seed, options, prefix_caching)
    results: dict[str, list[RequestResult]] = {
        name: make().run(arrivals) for name, make in sims.items() if include is None or name in include
    }
    kept = after_warmup(results, min(options.warmup_s, options.duration_s / 4))
    return SessionLevel(share, qps, seed, {name: summarise_sessions(runs) for name, runs in kept.items()})
