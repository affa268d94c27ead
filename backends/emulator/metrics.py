"""The emulator's /metrics: vLLM 0.32's names, types, labels (``engine``, ``model_name``) and buckets.

Latency histograms are observed in emulated seconds (wall seconds times the speed factor), which is what a
real engine running at the profile's speed would report.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from backends.emulator.timing import Emission, EngineCounters

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
_LABELS = ("engine", "model_name")


class EmulatorMetrics:
    """All series of one emulated engine, on an injected registry."""

    def __init__(self, registry: CollectorRegistry, model_name: str, speculative_k: int | None) -> None:
        labels = {"engine": "0", "model_name": model_name}
        self._labels = labels
        self.running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            _LABELS,
            registry=registry,
        ).labels(**labels)
        self.waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            _LABELS,
            registry=registry,
        ).labels(**labels)
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            _LABELS,
            registry=registry,
        ).labels(**labels)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _LABELS,
            buckets=TTFT_BUCKETS,
            registry=registry,
        ).labels(**labels)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _LABELS,
            buckets=ITL_BUCKETS,
            registry=registry,
        ).labels(**labels)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _LABELS,
            buckets=E2E_BUCKETS,
            registry=registry,
        ).labels(**labels)
        self._counters = self._make_counters(registry, labels)
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*_LABELS, "finished_reason"),
            registry=registry,
        )
        for reason in FINISHED_REASONS:
            self._success.labels(finished_reason=reason, **labels)
        self._per_position: list[Counter] = []
        if speculative_k is not None:
            self._make_spec_counters(registry, speculative_k)
        self._seen = EngineCounters(accepted_per_position=[0] * (speculative_k or 0))

    def _make_counters(self, registry: CollectorRegistry, labels: dict[str, str]) -> dict[str, Counter]:
        specs = {
            "prompt_tokens": ("vllm:prompt_tokens", "Number of prefill tokens processed."),
            "generation_tokens": ("vllm:generation_tokens", "Number of generation tokens processed."),
            "preemptions": ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
            # vLLM 0.32 (vllm/v1/metrics/loggers.py): counted at a request's first admission, in tokens
            "prefix_cache_queries": (
                "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
            "prefix_cache_hits": ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
        }  # fmt: skip
        return {
            field: Counter(name, doc, _LABELS, registry=registry).labels(**labels)
            for field, (name, doc) in specs.items()
        }

    def _make_spec_counters(self, registry: CollectorRegistry, k: int) -> None:
        specs = {
            "drafts": ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
            "draft_tokens": ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
            "accepted_tokens": ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
        }
        for field, (name, doc) in specs.items():
            self._counters[field] = Counter(name, doc, _LABELS, registry=registry).labels(**self._labels)
        per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            (*_LABELS, "position"),
            registry=registry,
        )
        self._per_position = [per_pos.labels(position=str(pos), **self._labels) for pos in range(k)]

    def update_engine(self, counters: EngineCounters, running: int, waiting: int, kv_usage: float) -> None:
        """Bring the counters up to the engine's totals and set the gauges."""
        for field, counter in self._counters.items():
            delta = getattr(counters, field) - getattr(self._seen, field)
            if delta:
                counter.inc(delta)
                setattr(self._seen, field, getattr(counters, field))
        for pos, counter in enumerate(self._per_position):
            delta = counters.accepted_per_position[pos] - self._seen.accepted_per_position[pos]
            if delta:
                counter.inc(delta)
                self._seen.accepted_per_position[pos] = counters.accepted_per_position[pos]
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)

    def finished(self, reason: str, e2e_s: float) -> None:
        self._success.labels(finished_reason=reason, **self._labels).inc()
        if reason != "abort":
            self.e2e.observe(e2e_s)

    def emitted(self, emission: Emission, since_previous_s: float, first: bool) -> None:
        (self.ttft if first else self.itl).observe(since_previous_s)
