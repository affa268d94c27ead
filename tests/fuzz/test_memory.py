"""Memory stays bounded under hostile input: caches keyed by request data are capped, metric labels never take
client values, and floods of distinct model names, system prompts and headers leave memory where it was."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
from prometheus_client import CollectorRegistry

from gateway.features import _CACHE_LIMIT, Classifier
from gateway.rules import default_rules
from tests.conftest import Gateway

MiB = 1024 * 1024


@contextmanager
def traced() -> Iterator[Callable[[], int]]:
    """Yields a function giving the bytes allocated (and still alive) since the block began."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield lambda: (gc.collect(), tracemalloc.get_traced_memory()[0] - base)[1]
    finally:
        tracemalloc.stop()


def test_a_flood_of_huge_distinct_system_prompts_keeps_the_classifier_cache_small() -> None:
    """Before the fix the cache kept whole prompts (up to max_body_bytes each) as keys: 1,024 prompts of
    200 kB held ~200 MB. It now keeps the classified prefix only (classify_chars)."""
    rules = default_rules()
    classifier = Classifier(rules)
    filler = "lorem ipsum " * 17_000  # ~200 kB
    with traced() as grown:
        for i in range(_CACHE_LIMIT + 200):
            classifier.classify(f"{i} You are a translator. {filler}", "hi")
        growth = grown()
    assert len(classifier._system_cache) <= _CACHE_LIMIT
    bound = _CACHE_LIMIT * (rules.defaults.classify_chars + 200) + MiB  # keys, values and the dict itself
    assert growth < bound, f"{growth / MiB:.1f} MiB held"


def sample_count(registry: CollectorRegistry) -> int:
    return sum(len(metric.samples) for metric in registry.collect())


def label_values(registry: CollectorRegistry) -> set[str]:
    return {value for metric in registry.collect() for s in metric.samples for value in s.labels.values()}


def test_floods_of_client_values_grow_neither_metrics_nor_memory(gateway: Callable[..., Gateway]) -> None:
    gw = gateway()
    valid = {"model": "fake-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-fake-chunks": "2"}

    def flood(client: httpx.Client, count: int, offset: int) -> None:
        for i in range(offset, offset + count):
            unknown_model = {**valid, "model": f"model-{i}-" + "m" * 200}  # 404: no pool serves it
            assert client.post("/v1/chat/completions", json=unknown_model).status_code == 404
            # distinct prompts past the classified prefix (distinct prefixes: the classifier test above)
            system = [{"role": "system", "content": "s" * 4000 + f" {i}"}, {"role": "user", "content": "hi"}]
            spoofed = {**headers, f"x-client-{i}": str(i), "x-specgate-pool": f"pool-{i}", "user-agent": f"ua-{i}"}
            response = client.post("/v1/chat/completions", json={**valid, "messages": system}, headers=spoofed)
            assert response.status_code == 200

    with httpx.Client(base_url=gw.url, timeout=10.0) as client:
        flood(client, 60, 0)  # warm-up: every label combination the flood can reach exists from here on
        samples = sample_count(gw.registry)
        with traced() as grown:
            flood(client, 200, 1000)
            growth = grown()
    assert sample_count(gw.registry) == samples
    client_values = {"pool-", "model-", "ua-", "x-client-"}
    assert not {v for v in label_values(gw.registry) if any(v.startswith(p) for p in client_values)}
    assert growth < MiB, f"{growth / MiB:.2f} MiB still held after 400 requests with distinct client values"
