"""gateway.metrics: the lock-free histogram exposes exactly what prometheus_client's would."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import httpx
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import LATENCY_BUCKETS, RATIO_BUCKETS, FastHistogram, GatewayMetrics
from tests.conftest import Gateway


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of the exposition (what a scrape reads), ``_created`` values left out (times differ)."""
    out = []
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            value = math.nan if sample.name.endswith("_created") else sample.value
            out.append((sample.name, sample.labels, value))
    return out


@pytest.mark.parametrize("buckets", [LATENCY_BUCKETS, RATIO_BUCKETS])
def test_the_fast_histogram_scrapes_as_prometheus_clients_does(buckets: tuple[float, ...]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = FastHistogram("x_seconds", "help text", ["pool"], buckets=buckets, registry=ours)
    slow = Histogram("x_seconds", "help text", ["pool"], buckets=buckets, registry=theirs)
    rng = random.Random(1)
    amounts = [rng.lognormvariate(0, 2) for _ in range(2000)] + [*buckets, 0.0, 1e9]  # bounds are inclusive
    for amount in amounts:
        pool = rng.choice(("standard", "speculative"))
        fast.labels(pool).observe(amount)
        slow.labels(pool).observe(amount)
    got, want = _samples(ours), _samples(theirs)
    assert len(got) == len(want) == 2 * (len(buckets) + 4)
    for (name, labels, value), (want_name, want_labels, want_value) in zip(got, want, strict=True):
        assert (name, labels) == (want_name, want_labels)
        assert value == pytest.approx(want_value, rel=1e-12, nan_ok=True)


def test_an_unobserved_fast_histogram_is_still_a_registered_family() -> None:
    registry = CollectorRegistry()
    FastHistogram("y_seconds", "help", ["pool"], buckets=(1.0,), registry=registry)
    assert [(f.name, f.type, f.samples) for f in registry.collect()] == [("y_seconds", "histogram", [])]
    with pytest.raises(ValueError):
        FastHistogram("y_seconds", "again", ["pool"], buckets=(1.0,), registry=registry)  # a duplicate name


def test_the_fast_histogram_checks_its_label_count() -> None:
    fast = FastHistogram("z_seconds", "help", ["pool"], buckets=(1.0,), registry=CollectorRegistry())
    with pytest.raises(ValueError):
        fast.labels("standard", "extra")


def test_the_gateways_latency_histograms_count_what_they_observe() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    metrics.observe_latency("standard", 0.2, 1.5, 0.01)
    metrics.observe_latency("standard", 0.3, 40.0, None)
    assert registry.get_sample_value("specgate_request_duration_seconds_count", {"pool": "standard"}) == 2
    assert registry.get_sample_value("specgate_request_duration_seconds_bucket", {"pool": "standard", "le": "2.5"}) == 1
    assert registry.get_sample_value("specgate_tpot_seconds_sum", {"pool": "standard"}) == pytest.approx(0.01)
    assert registry.get_sample_value("specgate_ttft_seconds_created", {"pool": "standard"}) is not None


def test_the_gateway_times_its_periodic_jobs_and_its_metrics_page(gateway: Callable[..., Gateway]) -> None:
    gw = gateway()
    httpx.get(f"{gw.url}/metrics")  # the first page's render is timed into the next page
    page = httpx.get(f"{gw.url}/metrics").text
    counts = {
        s.labels["job"]: s.value
        for family in text_string_to_metric_families(page)
        if family.name == "specgate_background_seconds"
        for s in family.samples
        if s.name.endswith("_count")
    }
    assert counts.get("metrics-render", 0) >= 1
    assert counts.get("snapshot", 0) >= 1  # every snapshot refresh (health rounds, the snapshot loop)
    assert "specgate_gc_pause_seconds" in page  # a family even before `specgate serve` installs the collector


def test_prefix_counts_scrape_as_counters_per_pool_and_replica() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    counts = metrics.prefix_counts("standard", "http://a:1")
    assert metrics.prefix_counts("standard", "http://a:1") is counts
    counts.queries += 10
    counts.hits += 7
    labels = {"pool": "standard", "replica": "http://a:1"}
    assert registry.get_sample_value("specgate_prefix_cache_queries_total", labels) == 10
    assert registry.get_sample_value("specgate_prefix_cache_hits_total", labels) == 7
    families = {f.name: f.type for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert families["specgate_prefix_cache_queries"] == families["specgate_prefix_cache_hits"] == "counter"
