"""One object that owns the signal pollers and turns their state into the decider's :class:`Snapshot`.

Wiring (see :class:`gateway.state.GatewayState`)::

    hub = SignalHub(settings, targets=..., local_qps=..., registry=registry)
    await hub.start()                              # lifespan start: one kept task per poller
    hub.record_request(time.time())                # request path: a dict increment, no I/O
    state.snapshot = hub.build_snapshot(pools)     # snapshot loop: one attribute assignment
    await hub.stop()                               # lifespan end: tasks cancelled and awaited

QPS precedence: Prometheus (cluster-wide, if configured and fresh) > Redis's shared window (every gateway
replica, if configured and reachable) > this replica's local sliding window. Each step down is reported in
``Snapshot.qps_source``, in ``/ready`` and in ``specgate_signal_up{source}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.config import Settings
from gateway.metrics import HistogramSeries
from gateway.signals.engine_poller import EnginePoller, ScrapeTarget
from gateway.signals.prometheus import PrometheusPoller
from gateway.signals.shared_qps import SharedQps
from gateway.signals.store import MemorySharedState, RedisSharedState, SharedState
from gateway.snapshot import PoolSnapshot, Snapshot
from gateway.upstream import Fetch, Upstream, fetcher, make_upstream

log = logging.getLogger("specgate.signals")

QPS_SOURCES = ("prometheus", "redis", "local")


class RoutedRequests(Collector):
    """``specgate_routed_requests_total``: one unlabeled series per gateway, what the default QPS query reads.

    A plain int bumped on the request path (tens of ns, no lock: only the event loop's thread writes it)
    and exported as a counter when scraped.
    """

    def __init__(self) -> None:
        self.total = 0

    def collect(self) -> list[Metric]:
        family = CounterMetricFamily(
            "specgate_routed_requests", "Requests routed by this gateway (the QPS signal's source)."
        )
        family.add_metric([], self.total)
        return [family]


class SignalMetrics:
    """The hub's own view of its sources, on the gateway's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.up = Gauge(
            "specgate_signal_up",
            "1 when the signal source answered its latest poll (prometheus, redis, engines: any replica).",
            ["source"],
            registry=registry,
        )
        self.age = Gauge(
            "specgate_signal_age_seconds",
            "Seconds since the source last answered successfully.",
            ["source"],
            registry=registry,
        )
        self.qps = Gauge("specgate_decider_qps", "The QPS the decider sees.", registry=registry)
        self.qps_source = Gauge(
            "specgate_decider_qps_source",
            "1 for the source the decider's QPS comes from.",
            ["source"],
            registry=registry,
        )
        self.engine_up = Gauge(
            "specgate_engine_scrape_up",
            "1 when the replica's latest /metrics scrape succeeded.",
            ["pool", "replica"],
            registry=registry,
        )


class SignalHub:
    def __init__(
        self,
        settings: Settings,
        *,
        targets: Callable[[], Sequence[ScrapeTarget]],
        local_qps: Callable[[], float],
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        inflight: Callable[[ScrapeTarget], int] | None = None,
        scrape_timing: HistogramSeries | None = None,
    ) -> None:
        self.settings = settings
        self._scrape_timing = scrape_timing
        self._targets = targets
        self._inflight = inflight  # this gateway's requests on a replica now, read around each engine scrape
        self._local_qps = local_qps
        self._clock = clock
        self._wall_clock = wall_clock
        self.metrics = SignalMetrics(registry)
        self.routed = RoutedRequests()
        registry.register(self.routed)
        self.store: SharedState = (
            RedisSharedState(settings.redis_url, timeout_s=settings.redis_timeout_s)
            if settings.redis_url
            else MemorySharedState()
        )
        self.shared_qps = SharedQps(self.store, settings.qps_window_s) if settings.redis_url else None
        self.prometheus = self._make_prometheus(settings)
        self.engines: EnginePoller | None = None
        self._upstream: Upstream | None = None  # the engine scrapes' and the health checks' own (see fetch)
        self.fetch: Fetch | None = None  # GETs to the replicas, off the request path; set by start()
        self._tasks: list[asyncio.Task[None]] = []

    def _make_prometheus(self, settings: Settings) -> PrometheusPoller | None:
        if not settings.prometheus_url:
            return None
        return PrometheusPoller(
            settings.prometheus_url,
            qps_query=settings.prometheus_qps_query,
            signal_queries=settings.prometheus_signals,
            timeout_s=settings.prometheus_timeout_s,
            stale_after_s=settings.prometheus_stale_after_s,
            warmup_s=settings.prometheus_warmup_s,
            clock=self._clock,
        )

    # -- request path ---------------------------------------------------------------------------------
    def record_request(self, now: float) -> None:
        """Count one routed request (wall-clock ``now``): the exported counter and, with Redis, the shared
        window's pending bucket. No I/O."""
        self.routed.total += 1
        if self.shared_qps is not None:
            self.shared_qps.record(now)

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        # an upstream of its own: a scrape or a check never waits for a connection the proxied requests hold
        self._upstream = make_upstream(s)
        await self._upstream.start()
        self.fetch = fetcher(self._upstream)
        self.engines = EnginePoller(
            self.fetch,
            self._targets,
            timeout_s=s.engine_metrics_timeout_s,
            window_s=s.acceptance_window_s,
            stale_after_s=s.engine_stale_after_s,
            clock=self._clock,
            inflight=self._inflight,
            timing=self._scrape_timing,
        )
        self._spawn("engine-metrics", self.engines.scrape_once, s.engine_metrics_interval_s)
        if self.prometheus is not None:
            self._spawn("prometheus", self.prometheus.poll_once, s.prometheus_interval_s)
        if self.shared_qps is not None:
            shared = self.shared_qps
            self._spawn("redis-qps", lambda: shared.sync(self._wall_clock()), s.redis_sync_interval_s)

    def _spawn(self, name: str, step: Callable[[], Awaitable[Any]], interval_s: float) -> None:
        self._tasks.append(asyncio.create_task(self._every(name, step, interval_s), name=f"signals-{name}"))

    async def _every(self, name: str, step: Callable[[], Awaitable[Any]], interval_s: float) -> None:
        while True:
            started = self._clock()
            try:
                await step()
            except Exception:  # a bug in one poller must not silence it for good: log, then retry next tick
                log.exception("signal poller %s failed; it retries in %.2f s", name, interval_s)
            await asyncio.sleep(max(0.0, interval_s - (self._clock() - started)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        closing: list[Coroutine[Any, Any, None]] = [self.store.close()]
        if self.prometheus is not None:
            closing.append(self.prometheus.close())
        if self._upstream is not None:
            closing.append(self._upstream.close())
        await asyncio.gather(*closing)

    # -- snapshot --------------------------------------------------------------------------------------
    def build_snapshot(self, pools: Mapping[str, PoolSnapshot]) -> Snapshot:
        """Combine pool health (from the caller) with engine stats, QPS and named signals."""
        now = self._clock()
        qps, source, qps_age = self._qps(now)
        signals: dict[str, float] = {}
        ages: dict[str, float] = {}
        if self.prometheus is not None:
            for name, value in self.prometheus.signals().items():
                signals[name], ages[name] = value.value, now - value.at
        snapshot = Snapshot(
            pools={name: self._with_engine_stats(pool) for name, pool in pools.items()},
            qps=qps,
            qps_source=source,
            qps_age_s=qps_age,
            signals=signals,
            signal_ages_s=ages,
        )
        self._export(snapshot)
        return snapshot

    def _with_engine_stats(self, pool: PoolSnapshot) -> PoolSnapshot:
        if self.engines is None:
            return pool
        stats = self.engines.pool_stats(pool.name)
        return dataclasses.replace(
            pool,
            running=stats.running,
            waiting=stats.waiting,
            kv_cache_usage=stats.kv_cache_usage,
            acceptance_rate=stats.acceptance_rate,
            acceptance_length=stats.acceptance_length,
            stats_age_s=stats.age_s,
            # the engine counts are as old as the scrape: so is the own count they are read against
            inflight_base=pool.inflight_base if stats.running is None else stats.inflight_base,
        )

    def _qps(self, now: float) -> tuple[float, str, float | None]:
        if self.prometheus is not None:
            value = self.prometheus.qps()
            if value is not None:
                return value.value, "prometheus", now - value.at
        shared, wall_now = self.shared_qps, self._wall_clock()
        local = self._local_qps()
        if shared is not None and shared.up and shared.last is not None:
            age = wall_now - shared.last.at
            # While Redis refills its window after an outage, both views may read low (Redis: lost buckets;
            # local: this replica only), so take the larger.
            if age <= self.settings.redis_stale_after_s and (shared.trusted(wall_now) or shared.last.qps >= local):
                return shared.last.qps, "redis", age
        return local, "local", 0.0

    def _export(self, snapshot: Snapshot) -> None:
        m = self.metrics
        m.qps.set(snapshot.qps)
        for source in QPS_SOURCES:
            m.qps_source.labels(source).set(1 if source == snapshot.qps_source else 0)
        if self.prometheus is not None:
            m.up.labels("prometheus").set(1 if self.prometheus.up else 0)
            m.age.labels("prometheus").set(_or_nan(self.prometheus.age_s()))
        if self.shared_qps is not None:
            m.up.labels("redis").set(1 if self.shared_qps.up else 0)
            last = self.shared_qps.last
            m.age.labels("redis").set(float("nan") if last is None else self._wall_clock() - last.at)
        if self.engines is not None:
            views = self.engines.replicas()
            for view in views:
                m.engine_up.labels(view.target.pool, view.target.base_url).set(1 if view.fresh else 0)
            m.up.labels("engines").set(1 if any(v.fresh for v in views) else 0)

    # -- readiness details -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Where each signal comes from and how it is doing, for ``/ready``. Never fails readiness."""
        snapshot_qps = self._qps(self._clock())
        details: dict[str, Any] = {
            "qps": {"value": snapshot_qps[0], "source": snapshot_qps[1], "age_s": snapshot_qps[2]},
            "prometheus": None,
            "redis": None,
            "engines": [],
        }
        if self.prometheus is not None:
            outcome = self.prometheus.last_outcome
            details["prometheus"] = {
                "up": self.prometheus.up,
                "qps_warming_up": self.prometheus.warming_up("qps"),
                "error": None if outcome is None else outcome.error,
                "age_s": self.prometheus.age_s(),
                "query_errors": dict(self.prometheus.query_errors),
            }
        if self.shared_qps is not None:
            last = self.shared_qps.last
            details["redis"] = {
                "up": self.shared_qps.up,
                "refilling_window": self.shared_qps.up and not self.shared_qps.trusted(self._wall_clock()),
                "error": self.shared_qps.error,
                "age_s": None if last is None else self._wall_clock() - last.at,
                "pending_requests": self.shared_qps.pending_requests(),
            }
        if self.engines is not None:
            details["engines"] = [
                {
                    "pool": v.target.pool,
                    "replica": v.target.base_url,
                    "fresh": v.fresh,
                    "error": v.error,
                    "age_s": v.age_s,
                }
                for v in self.engines.replicas()
            ]
        return details


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value
