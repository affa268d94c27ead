"""Everything one gateway instance holds, built by ``create_app`` and started in its lifespan."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import socket
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from gateway.adaptive.content import content_of
from gateway.adaptive.cross import other_busy_share
from gateway.adaptive.learner import Learner, Observation
from gateway.adaptive.model import LatencyModel, segment_of
from gateway.adaptive.policy import is_warm
from gateway.adaptive.shared import ModelSync
from gateway.auth import Access, upstream_headers
from gateway.breaker import breaker_policy
from gateway.config import Settings
from gateway.decide import Decision, replica_worth
from gateway.errors import MissingExtra, UnknownModel
from gateway.features import Classifier, RequestFeatures
from gateway.guard import Sweeper
from gateway.health import HealthChecker
from gateway.limits import Limiter
from gateway.logs import RequestIds, RequestLog
from gateway.looplag import LoopLagMonitor
from gateway.metrics import GatewayMetrics, held
from gateway.pools import PoolSet
from gateway.prefix_index import PrefixIndex, PrefixReader
from gateway.qps import LocalQps
from gateway.rules import RoutingRules, default_rules, load_rules
from gateway.signals.engine_poller import ScrapeTarget
from gateway.signals.hub import SignalHub
from gateway.snapshot import POOL_NAMES, Snapshot
from gateway.upstream import Upstream, make_upstream

if TYPE_CHECKING:
    from gateway.collector import GarbageCollector
    from gateway.tracing import RequestTracer

log = logging.getLogger("specgate")

MAX_PENDING = 8192  # observations queued between two snapshot refreshes at most (~1 MB)


@dataclass(frozen=True, slots=True)
class RuleSet:
    """Rules and the classifier built from them, swapped together as one reference."""

    rules: RoutingRules
    classifier: Classifier
    models: frozenset[str]  # the rules file's `models`; empty: whatever the pools report


class GatewayState:
    def __init__(self, settings: Settings, registry: CollectorRegistry, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.metrics = GatewayMetrics(registry)
        self._snapshot_job = self.metrics.background.labels("snapshot")  # how long each refresh held the loop
        index = PrefixIndex(settings.prefix_index_blocks_per_replica) if settings.prefix_index != "off" else None
        self.pools = PoolSet(self.metrics, rng, breaker_policy(settings), index)
        self.qps = LocalQps(settings.qps_window_s)
        self.upstream: Upstream = make_upstream(settings)
        self.upstream_auth = upstream_headers(settings)  # per pool: the Authorization sent to its replicas
        limiter = Limiter(owner=f"{socket.gethostname()}:{os.getpid()}:{id(self):x}")
        self.access = Access(settings, limiter, self.metrics)
        timeouts = min(settings.first_byte_timeout_s, settings.idle_timeout_s)
        self.sweeper = Sweeper(interval_s=min(0.25, max(0.01, timeouts / 10)))
        self.learner = Learner()
        self._pending: list[Observation] = []  # finished requests not yet folded in (see learn())
        # the queue's length at most: learn_max_per_s over one snapshot interval (see learn())
        self._pending_limit = min(MAX_PENDING, max(1, round(settings.learn_max_per_s * settings.snapshot_interval_s)))
        self.warm_after: int | None = None  # finished requests the model had taken in when it first decided
        self.ruleset = self._build_ruleset(self.read_rules())
        self.pool_models: frozenset[str] = frozenset()
        self.signals = SignalHub(
            settings, targets=self._scrape_targets, local_qps=lambda: self.qps.rate(time.monotonic()),
            registry=registry, inflight=self._inflight_on,
            scrape_timing=self.metrics.background.labels("engine-scrape"),
        )
        self.snapshot = Snapshot(pools=self.pools.pool_snapshots())
        alive_s = 3 * settings.model_sync_interval_s  # a replica that missed three syncs is gone
        self.model_sync = (
            ModelSync(
                self.learner, self.signals.store, settings.model_ttl_s, alive_s=alive_s,
                timing=self.metrics.background.labels("model-sync"),
            )
            if settings.redis_url
            else None
        )
        self.health_rounds = 0
        self.draining = False  # set on SIGTERM (gateway/shutdown.py): /ready answers 503
        self._tasks: list[asyncio.Task[None]] = []
        # Observability hooks of the relay; None (no per-request work) unless switched on.
        self.request_ids = RequestIds()
        self.request_log = RequestLog() if settings.log_format == "json" else None
        self.tracer: RequestTracer | None = None
        self.collector: GarbageCollector | None = None  # set by `specgate serve` (gateway/collector.py)
        if settings.tracing == "otel":
            self.tracer = _otel_tracer()

    # -- rules ---------------------------------------------------------------------------------------
    def read_rules(self) -> RoutingRules:
        path = self.settings.rules_file
        return load_rules(path) if path is not None else default_rules()

    def _build_ruleset(self, rules: RoutingRules) -> RuleSet:
        rules = rules.with_replicas(self.settings.standard_urls, self.settings.speculative_urls)
        self.pools.configure({name: pool.replicas for name, pool in rules.pools.items()})
        self.learner.set_learning_rate(rules.adaptive.learning_rate)
        self.learner.forget_s = rules.adaptive.stale_s
        self.learner.shared_device = rules.adaptive.shared_device
        return RuleSet(rules, Classifier(rules, prefixes=self._prefix_reader(rules)), frozenset(rules.models))

    def _prefix_reader(self, rules: RoutingRules) -> PrefixReader | None:
        """What reads each request's prefix blocks and session key: while ``prefix_index`` is ``on``, or ``auto``
        with a pool of more than one replica (where the replica choice reads them); else nothing is read."""
        mode = self.settings.prefix_index
        if mode == "off" or (mode == "auto" and all(len(p.replicas) <= 1 for p in rules.pools.values())):
            return None
        return PrefixReader(self.settings.prefix_index_read_bytes)

    def apply_rules(self, rules: RoutingRules) -> None:
        """Swap in new rules between requests; in-flight requests keep the bookings they hold."""
        self.flush_observations()  # what finished under the old rules is learned at the old learning rate
        self.ruleset = self._build_ruleset(rules)
        self.refresh_snapshot()

    def check_model(self, model: str) -> None:
        known = self.ruleset.models or self.pool_models
        if model and known and model not in known:
            raise UnknownModel(f"The model '{model}' does not exist", param="model")

    def see_cache(self, features: RequestFeatures) -> None:
        """Before the decision: per pool, the prompt tokens its chosen replica is expected to hold (the prefix
        index, read under the replica choice's own rule) into ``features.cached_tokens``, for the latency model.
        Only for a request with blocks: without them the features, and so the decision, are as they were."""
        if features.blocks:
            features.cached_tokens = self.pools.expected_cached(
                features.blocks, features.prefix_bytes, features.prompt_tokens
            )  # fmt: skip

    def replica_worth(self, features: RequestFeatures, decision: Decision) -> float | None:
        """After the decision: :func:`gateway.decide.replica_worth` for its pool, with the snapshot and rules now."""
        pool = self.pools.pools[decision.pool]
        return replica_worth(decision, features, self.snapshot, self.ruleset.rules, len(pool.replicas))

    # -- snapshot ------------------------------------------------------------------------------------
    def refresh_snapshot(self) -> None:
        with held(self._snapshot_job):
            self._refresh_snapshot()

    def _refresh_snapshot(self) -> None:
        self.flush_observations()
        self.pool_models = frozenset(self.pools.models())
        snapshot = self.signals.build_snapshot(self.pools.pool_snapshots())
        if self.ruleset.rules.uses_fastest:
            now = time.monotonic()
            model = self.learner.model(now)
            gateways = self.model_sync.gateways if self.model_sync is not None else 1
            snapshot = dataclasses.replace(snapshot, model=model, gateways=gateways)
            self._export_model(snapshot, model, now)
        self.snapshot = snapshot

    def _export_model(self, snapshot: Snapshot, model: LatencyModel, now: float) -> None:
        metrics = self.metrics
        warm = is_warm(snapshot, self.ruleset.rules.adaptive)
        metrics.model_warm.set(1 if warm else 0)
        if warm and self.warm_after is None:
            self.warm_after = model.version
        last = [p.last_observed_s for p in model.pools.values() if p.last_observed_s is not None]
        if last:
            metrics.model_age.set(now - max(last))
        for pool in POOL_NAMES:
            metrics.model_samples.labels(pool).set(model.samples(pool))

    def current_snapshot(self) -> Snapshot:
        """The snapshot for a decision now: with the learned model, this gateway's in-flight counts are
        taken fresh (the model predicts from load, and a scrape is up to a second old)."""
        snapshot = self.snapshot
        if snapshot.model is None:
            return snapshot
        return snapshot.with_inflight(self.pools.inflight_counts())

    def learn(
        self, features: RequestFeatures, decision: Decision, ttft: float, total: float, tokens: int, objective: str,
        *, counted: bool = True, acceptance: float | None = None, run_shift: float | None = None,
        other_busy: float | None = None,
    ) -> None:  # fmt: skip
        """One finished request's outcome: queued for the learner, which takes the queue in order at the next
        snapshot refresh (decisions only ever see the model as of a refresh, so they see the same model as if
        it were folded in at once; off the request path, and in one tight loop), and the prediction it was
        routed by checked against what happened.

        ``counted`` is False when a stream carried no usage and ``tokens`` counts its events: vLLM sends one
        event per engine step, and a speculative step emits the pool's mean acceptance length in tokens: the
        one the model learned as of the last refresh (what decisions read too), else the engine's.

        Past ``learn_max_per_s`` (the queue holds a snapshot interval's share) the request is counted in
        ``specgate_unlearned_requests_total`` and nothing else is done: at thousands of requests a second
        the model would only forget faster, and this is the request path's largest cost after routing.
        """
        if decision.explored:
            self.metrics.explored.labels(decision.pool).inc()
        if len(self._pending) >= self._pending_limit:
            self.metrics.unlearned.inc()
            return
        segment = segment_of(features.task, features.copy)
        first = ttft if features.stream else None  # a whole reply's first byte is its last
        if not counted:  # the acceptance learned as of the last refresh: no fold-in on the request path
            model = self.snapshot.model
            per_event = (
                acceptance
                or (model.acceptance_length(decision.pool, segment) if model is not None else None)
                or self.snapshot.pool(decision.pool).acceptance_length
                or 1.0
            )
            tokens = round(1 + max(tokens - 1, 0) * per_event)
        # the load it ran at: the decision's, moved as this gateway's bookings on the pool moved while it ran
        # (scaled, as pool_load scales them, by the gateway replicas sharing the pool)
        run_load = None if run_shift is None else max(decision.load + self.snapshot.gateways * run_shift, 0.0)
        other = other_busy_share(other_busy, decision.other_load, self.snapshot.gateways)
        # the prompt and what the decision expected the pool to hold of it (0 without blocks): the prompt-size
        # offsets of time to first token learn the whole prompt's, the pool's prefill rate what the cached part saved
        self._pending.append(Observation(
            decision.pool, segment, features.prompt_tokens, decision.load, first, total, tokens, acceptance,
            at_s=time.monotonic(), run_load=run_load, template=features.template, content=content_of(features),
            other_busy=other,
            cached_tokens=None if features.cached_tokens is None else features.cached_on(decision.pool),
        ))  # fmt: skip
        predicted = decision.predicted
        if predicted is not None:
            value = predicted.value(objective)
            observed = ttft if objective == "ttft" else total
            self.metrics.observe_prediction(decision.pool, value, observed / value)

    def flush_observations(self) -> None:
        """Fold the queued observations into the learner, oldest first."""
        pending, self._pending = self._pending, []
        observe = self.learner.observe
        for observation in pending:
            observe(observation)

    def _scrape_targets(self) -> list[ScrapeTarget]:
        return [ScrapeTarget(r.pool, r.url) for r in self.pools.replicas()]

    def _inflight_on(self, target: ScrapeTarget) -> int:
        """This gateway's requests on the scraped replica now (read as each scrape starts and ends)."""
        return sum(r.inflight for r in self.pools.replicas() if r.url == target.base_url and r.pool == target.pool)

    def _health_round(self) -> None:
        self.health_rounds += 1
        self.refresh_snapshot()

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.snapshot_interval_s)
            self.pools.tick_breakers()
            self.refresh_snapshot()

    # -- lifecycle -----------------------------------------------------------------------------------
    def add_task(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))

    async def start(self) -> None:
        await self.upstream.start()
        await self.signals.start()
        lag = LoopLagMonitor(self.metrics.loop_lag, own_gauge=self.metrics.loop_own_lag)
        self.add_task(lag.run(), "loop-lag")  # before the first health check: it judges timeouts by the lag
        checker = HealthChecker(
            self.pools, self.settings.health_interval_s, self.settings.health_timeout_s, self._health_round, lag
        )
        assert self.signals.fetch is not None  # set by signals.start()
        self.add_task(checker.run(self.signals.fetch), "health")
        self.add_task(self._snapshot_loop(), "snapshot")
        self.add_task(self.sweeper.run(), "deadlines")
        if self.collector is not None:
            self.add_task(self.collector.run(), "gc-freeze")
        self.access.announce()
        if self.settings.redis_url:
            interval = self.settings.redis_sync_interval_s
            self.add_task(self.access.limiter.run(self.signals.store, interval), "limits-sync")
        if self.model_sync is not None:
            self.add_task(self._model_sync_loop(self.model_sync), "model-sync")

    async def _model_sync_loop(self, sync: ModelSync) -> None:
        while True:
            if self.ruleset.rules.uses_fastest:
                self.flush_observations()
                await sync.sync(time.time())
            await asyncio.sleep(self.settings.model_sync_interval_s)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.signals.stop()
        await self.upstream.close()
        if self.tracer is not None:
            await self.tracer.shutdown()


def _otel_tracer() -> RequestTracer:
    try:
        from gateway.tracing import RequestTracer  # imported only when tracing is on
    except ImportError as exc:
        raise MissingExtra(f"SPECGATE_TRACING=otel needs OpenTelemetry: pip install 'specgate[otel]' ({exc})") from exc
    return RequestTracer()
