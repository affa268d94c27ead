"""The gateway's Prometheus metrics, all on a registry passed in (never the global one)."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.11, 1.25, 1.5, 2.0, 4.0)
STEP_BUCKETS = (1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3)


# The `key` label while no keys are configured (the gateway is open); key names cannot hold parentheses.
ANONYMOUS_KEY = "(anonymous)"
KEY_LIMITS = ("rpm", "tpm", "concurrency")


class KeyMetrics:
    """One key's counts (its configured name is the label: never what a client sends). Plain integers, added to
    on the request path without a lock; :class:`KeyCollector` turns them into series at scrape time."""

    __slots__ = ("client_error", "error", "limited", "ok", "rate_limited", "tokens")

    def __init__(self) -> None:
        self.ok = self.client_error = self.error = self.rate_limited = self.tokens = 0
        self.limited = dict.fromkeys(KEY_LIMITS, 0)

    def finished(self, status: int, tokens: int) -> None:
        """A request the key got through its limits, ended with ``status`` (0: no answer), charged ``tokens``."""
        if 0 < status < 400:
            self.ok += 1
        elif 400 <= status < 500:
            self.client_error += 1
        else:
            self.error += 1
        self.tokens += tokens

    def refused(self, limit: str) -> None:
        self.rate_limited += 1
        self.limited[limit] += 1


class KeyCollector(Collector):
    """``specgate_key_*`` from the keys in force (label cardinality: the keys in force, plus ``(anonymous)``)."""

    def __init__(self, keys: dict[str, KeyMetrics]) -> None:
        self._keys = keys

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "specgate_key_requests",
            "Requests per API key (its configured name; `(anonymous)` without keys) by outcome: ok, client_error "
            "(4xx), error (5xx or no answer), rate_limited (refused by the key's own limits).",
            labels=["key", "outcome"],
        )
        tokens = CounterMetricFamily(
            "specgate_key_tokens",
            "Tokens charged per API key, as its tpm limit counts them (prompt estimate + completion tokens).",
            labels=["key"],
        )
        limited = CounterMetricFamily(
            "specgate_key_rate_limited",
            "Requests refused (429) per API key by the limit that refused them: rpm, tpm, concurrency.",
            labels=["key", "limit"],
        )
        for name, k in list(self._keys.items()):
            for outcome, value in (("ok", k.ok), ("client_error", k.client_error), ("error", k.error),
                                   ("rate_limited", k.rate_limited)):  # fmt: skip
                requests.add_metric([name, outcome], value)
            tokens.add_metric([name], k.tokens)
            for limit, value in k.limited.items():
                limited.add_metric([name, limit], value)
        yield from (requests, tokens, limited)


class PrefixCounts:
    """One replica's prefix-index counts, in blocks of prompt text (``gateway/prefix_index.py``): blocks of the
    prompts booked on it, and the leading ones it was expected to hold. Plain integers, added to on the request
    path without a lock; :class:`PrefixCollector` turns them into series at scrape time."""

    __slots__ = ("hits", "queries")

    def __init__(self) -> None:
        self.queries = self.hits = 0


class PrefixCollector(Collector):
    """``specgate_prefix_cache_queries`` and ``_hits`` per pool and replica (as vLLM's ``vllm:prefix_cache_*``,
    but expected by the gateway's index, and in 256-byte blocks of text rather than tokens)."""

    def __init__(self, counts: dict[tuple[str, str], PrefixCounts]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        queries = CounterMetricFamily(
            "specgate_prefix_cache_queries",
            "Prompt blocks (256 bytes of text, ~64 tokens) of the requests booked on the replica while the prefix "
            "index is on.",
            labels=["pool", "replica"],
        )
        hits = CounterMetricFamily(
            "specgate_prefix_cache_hits",
            "Of those, the leading blocks the gateway's prefix index expected the replica to hold (rate over "
            "specgate_prefix_cache_queries: the expected prefix-cache hit rate, beside vLLM's).",
            labels=["pool", "replica"],
        )
        for (pool, replica), c in list(self._counts.items()):
            queries.add_metric([pool, replica], c.queries)
            hits.add_metric([pool, replica], c.hits)
        yield from (queries, hits)


class HistogramSeries:
    """One label set of a :class:`FastHistogram`: plain counts, added to without a lock."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        """As ``prometheus_client``'s: the first bucket whose bound is >= ``amount``."""
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


@contextmanager
def held(series: HistogramSeries) -> Iterator[None]:
    """Observe into ``series`` how long the block took (a periodic job's hold on the event loop)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        series.observe(time.perf_counter() - started)


class FastHistogram(Collector):
    """A histogram observed on the request path, exposed like ``prometheus_client.Histogram`` (the same
    ``_bucket``, ``_count``, ``_sum`` and ``_created`` samples).

    ``prometheus_client``'s takes a lock per bucket and per sum and walks the buckets in Python, ~1.2 us an
    observation; this one is a bisect and two additions, ~0.2 us. The gateway observes several per request
    (latencies, the routing step, the prediction's accuracy), on one event loop thread; a scrape from another
    thread may read a series between its count and its sum, as a scrape between two requests would."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:  # fmt: skip
        self.name, self.documentation = name, documentation
        self._labelnames = tuple(labelnames)  # the attribute prometheus_client's metrics have
        self.bounds = tuple(float(b) for b in buckets)
        self._series: dict[tuple[str, ...], HistogramSeries] = {}
        registry.register(self)

    def labels(self, *values: str) -> HistogramSeries:
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self.name} takes labels {self._labelnames}, got {values}")
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = HistogramSeries(self.bounds)
        return series

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self._labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self._labelnames)
        names = [*map(floatToGoString, self.bounds), "+Inf"]
        for values, series in list(self._series.items()):
            running, buckets = 0, []
            for bound, count in zip(names, list(series.counts), strict=True):
                running += count
                buckets.append((bound, float(running)))
            family.add_metric(list(values), buckets, series.sum)
            labels = dict(zip(self._labelnames, values, strict=True))
            family.samples.append(Sample(f"{self.name}_created", labels, series.created))
        yield family


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "specgate_requests",
            "Requests answered, by the pool that answered, the routing reason, the task and the HTTP status.",
            ["pool", "reason", "task", "status"],
            registry=registry,
        )
        self.ttft = FastHistogram(
            "specgate_ttft_seconds",
            "Time to first byte of the response body, as seen by the gateway.",
            ["pool"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.duration = FastHistogram(
            "specgate_request_duration_seconds",
            "End-to-end request latency through the gateway.",
            ["pool"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.tpot = FastHistogram(
            "specgate_tpot_seconds",
            "Time per output token after the first (streams and usage-reporting replies).",
            ["pool"],
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        self.inflight = Gauge(
            "specgate_inflight_requests", "Requests in flight per replica.", ["pool", "replica"], registry=registry
        )
        self.booked_tokens = Gauge(
            "specgate_booked_tokens",
            "Outstanding booked tokens (prompt estimate + max_tokens) per replica.",
            ["pool", "replica"],
            registry=registry,
        )
        self.replica_healthy = Gauge(
            "specgate_replica_healthy",
            "1 when the replica's last health check passed.",
            ["pool", "replica"],
            registry=registry,
        )
        self.health_checks = Counter(
            "specgate_health_checks",
            "Active health checks by verdict: ok, failed, timeout (down, suspected), late (timed out while the "
            "gateway's own event loop stalled: not counted against the replica).",
            ["pool", "replica", "result"],
            registry=registry,
        )
        self.suspect_dispatches = Counter(
            "specgate_suspect_dispatches",
            "Attempts sent to a replica whose last health check timed out, because no replica was up.",
            ["pool"],
            registry=registry,
        )
        self.breaker_state = Gauge(
            "specgate_replica_breaker_state",
            "1 for the replica's current circuit-breaker state (closed, open, half_open), 0 for the others.",
            ["pool", "replica", "state"],
            registry=registry,
        )
        self.breaker_opens = Counter(
            "specgate_breaker_opens",
            "Times a replica's circuit breaker opened (failures in a row or error rate from real traffic).",
            ["pool", "replica"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "specgate_upstream_errors",
            "Failures talking to a replica, by kind (connect, timeout, disconnect).",
            ["pool", "replica", "kind"],
            registry=registry,
        )
        self.retries = Counter(
            "specgate_retries",
            "Requests retried on another replica before any byte reached the client.",
            ["from_pool", "to_pool"],
            registry=registry,
        )
        self.resumes = Counter(
            "specgate_stream_resumes",
            "Streams cut after their first byte that the gateway resumed on another replica (rules `resume:`), "
            "by outcome: ok (continued to the end), ended (nothing left to generate: ended cleanly), failed "
            "(ended with an error event).",
            ["outcome"],
            registry=registry,
        )
        self.rule_reloads = Counter(
            "specgate_rule_reloads", "Rules file reloads by result (ok, rejected).", ["result"], registry=registry
        )
        self.key_reloads = Counter(
            "specgate_key_reloads", "Keys file reloads by result (ok, rejected).", ["result"], registry=registry
        )
        self.response_ids_evicted = Counter(
            "specgate_response_ids_evicted",
            "Live Responses API ids dropped from this gateway's map (responses_max_ids) before their TTL, taken "
            "from the key holding the most; without Redis, such a response can no longer be retrieved.",
            registry=registry,
        )
        self.keys: dict[str, KeyMetrics] = {}
        registry.register(KeyCollector(self.keys))
        self._prefix: dict[tuple[str, str], PrefixCounts] = {}
        registry.register(PrefixCollector(self._prefix))
        self.routing_step = FastHistogram(
            "specgate_routing_step_seconds",
            "Time spent in each routing step inside the gateway.",
            ["step"],
            buckets=STEP_BUCKETS,
            registry=registry,
        )
        self.prediction_ratio = FastHistogram(
            "specgate_prediction_ratio",
            "Observed / predicted latency (the objective's) of requests the learned model routed, per pool.",
            ["pool"],
            buckets=RATIO_BUCKETS,
            registry=registry,
        )
        self.predicted = FastHistogram(
            "specgate_predicted_latency_seconds",
            "The learned model's predicted latency (the objective's) for the pool it chose.",
            ["pool"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.explored = Counter(
            "specgate_explored_requests",
            "Requests sent to the pool the model did not prefer, to keep its predictions current.",
            ["pool"],
            registry=registry,
        )
        self.unlearned = Counter(
            "specgate_unlearned_requests",
            "Finished requests not learned from (nor checked against their prediction): past learn_max_per_s.",
            registry=registry,
        )
        self.model_warm = Gauge(
            "specgate_model_warm", "1 when the learned model decides (`fastest`), 0 while it warms up.",
            registry=registry,
        )  # fmt: skip
        self.model_samples = Gauge(
            "specgate_model_samples", "Effective samples the learned model holds per pool (decayed).", ["pool"],
            registry=registry,
        )  # fmt: skip
        self.model_age = Gauge(
            "specgate_model_age_seconds", "Seconds since the learned model last took in a finished request.",
            registry=registry,
        )  # fmt: skip
        self.loop_lag = Gauge(
            "specgate_event_loop_lag_seconds",
            "Largest event-loop lag (a timer's lateness) over the last 5 s window.",
            registry=registry,
        )
        self.loop_own_lag = Gauge(
            "specgate_event_loop_own_lag_seconds",
            "Largest event-loop lag over the last 5 s window less the time the loop's thread waited for a CPU "
            "(what the gateway's own work caused; other processes on its core excluded).",
            registry=registry,
        )
        # What holds the loop besides requests (gateway/collector.py, GatewayState.timed): how long each pass of
        # the cyclic collector and each run of a periodic job took, in one histogram each.
        stall_buckets = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25)
        self.gc_pause = FastHistogram(
            "specgate_gc_pause_seconds", "Pauses of the cyclic garbage collector, per generation ('full': the "
            "collector's safety pass over the frozen objects).", ["generation"], stall_buckets, registry,
        )  # fmt: skip
        self.gc_full_passes = Counter(
            "specgate_gc_full_passes", "Full collections run because memory outgrew its base (gateway/collector.py).",
            registry=registry,
        )  # fmt: skip
        self.background = FastHistogram(
            "specgate_background_seconds", "How long each run of a periodic job held the event loop.", ["job"],
            stall_buckets, registry,
        )  # fmt: skip
        self.rule_reloads.labels("ok")
        self.rule_reloads.labels("rejected")
        self.key_reloads.labels("ok")
        self.key_reloads.labels("rejected")
        for outcome in ("ok", "ended", "failed"):
            self.resumes.labels(outcome)
        # Children the hot path uses, looked up once instead of per request.
        self.route_step = self.routing_step.labels("route")
        self._outcomes: dict[tuple[str, str, str, int], Any] = {}
        self._latency: dict[str, tuple[HistogramSeries, HistogramSeries, HistogramSeries]] = {}
        self._prediction: dict[str, tuple[HistogramSeries, HistogramSeries]] = {}

    def key_metrics(self, key: str) -> KeyMetrics:
        """The counts of ``key`` (a configured name, or ``(anonymous)``), kept across reloads."""
        metrics = self.keys.get(key)
        if metrics is None:
            metrics = self.keys[key] = KeyMetrics()
        return metrics

    def prefix_counts(self, pool: str, replica: str) -> PrefixCounts:
        """The prefix-index counts of a replica (kept across reloads, as its other series are)."""
        counts = self._prefix.get((pool, replica))
        if counts is None:
            counts = self._prefix[pool, replica] = PrefixCounts()
        return counts

    def forget_key(self, key: str) -> None:
        """Drop a removed key's series, so the label set stays bounded by the keys in force."""
        self.keys.pop(key, None)

    def count_request(self, pool: str, reason: str, task: str, status: int) -> None:
        key = (pool, reason, task, status)
        child = self._outcomes.get(key)
        if child is None:
            child = self._outcomes[key] = self.requests.labels(pool, reason, task, str(status))
        child.inc()

    def observe_latency(self, pool: str, ttft: float, total: float, tpot: float | None) -> None:
        children = self._latency.get(pool)
        if children is None:
            children = self._latency[pool] = (
                self.ttft.labels(pool),
                self.duration.labels(pool),
                self.tpot.labels(pool),
            )
        children[0].observe(ttft)
        children[1].observe(total)
        if tpot is not None:
            children[2].observe(tpot)

    def observe_prediction(self, pool: str, predicted: float, ratio: float) -> None:
        """A finished request's predicted latency and observed / predicted (the learned model's accuracy)."""
        children = self._prediction.get(pool)
        if children is None:
            children = self._prediction[pool] = (self.predicted.labels(pool), self.prediction_ratio.labels(pool))
        children[0].observe(predicted)
        children[1].observe(ratio)
