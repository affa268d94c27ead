"""The gateway's Prometheus metrics, all on a registry passed in (never the global one)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.11, 1.25, 1.5, 2.0, 4.0)
STEP_BUCKETS = (1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "specgate_requests",
            "Requests answered, by the pool that answered, the routing reason, the task and the HTTP status.",
            ["pool", "reason", "task", "status"],
            registry=registry,
        )
        self.ttft = Histogram(
            "specgate_ttft_seconds",
            "Time to first byte of the response body, as seen by the gateway.",
            ["pool"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            "specgate_request_duration_seconds",
            "End-to-end request latency through the gateway.",
            ["pool"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
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
        self.rule_reloads = Counter(
            "specgate_rule_reloads", "Rules file reloads by result (ok, rejected).", ["result"], registry=registry
        )
        self.routing_step = Histogram(
            "specgate_routing_step_seconds",
            "Time spent in each routing step inside the gateway.",
            ["step"],
            buckets=STEP_BUCKETS,
            registry=registry,
        )
        self.prediction_ratio = Histogram(
            "specgate_prediction_ratio",
            "Observed / predicted latency (the objective's) of requests the learned model routed, per pool.",
            ["pool"],
            buckets=RATIO_BUCKETS,
            registry=registry,
        )
        self.predicted = Histogram(
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
        self.rule_reloads.labels("ok")
        self.rule_reloads.labels("rejected")
        # Children the hot path uses, looked up once instead of per request.
        self.route_step = self.routing_step.labels("route")
        self._outcomes: dict[tuple[str, str, str, int], Any] = {}
        self._latency: dict[str, tuple[Any, Any, Any]] = {}
        self._prediction: dict[str, tuple[Any, Any]] = {}

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
