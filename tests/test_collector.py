"""The collector policy of `specgate serve`: start-up and survivors frozen, passes timed, a full pass on growth."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from gateway.collector import GarbageCollector
from gateway.metrics import GatewayMetrics


class Node:
    """A tracked object that can sit in a reference cycle and be watched through a weak reference."""

    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def collector() -> Iterator[tuple[GarbageCollector, GatewayMetrics]]:
    metrics = GatewayMetrics(CollectorRegistry())
    tuned = GarbageCollector(metrics, interval_s=1.0, full_growth=1.0)
    tuned.install()
    try:
        yield tuned, metrics
    finally:
        tuned.uninstall()
        gc.unfreeze()
        gc.collect()


def in_generations(obj: object) -> bool:
    """Whether a pass could see ``obj`` (the permanent generation is not among the generations)."""
    return any(o is obj for g in range(3) for o in gc.get_objects(generation=g))


def test_install_freezes_what_start_up_built(collector: tuple[GarbageCollector, GatewayMetrics]) -> None:
    assert gc.get_freeze_count() > 0
    made = Node()
    assert in_generations(made)  # made after the freeze: young, scanned
    collector[0].tick()
    assert not in_generations(made)  # it lived through an interval: frozen, never scanned again
    assert gc.is_tracked(made)


def test_every_pass_is_timed_by_generation(collector: tuple[GarbageCollector, GatewayMetrics]) -> None:
    _, metrics = collector
    gc.collect(0)
    gc.collect(1)
    assert metrics.gc_pause.labels("0").counts != [0] * (len(metrics.gc_pause.bounds) + 1)
    assert sum(metrics.gc_pause.labels("1").counts) == 1
    assert sum(metrics.gc_pause.labels("full").counts) == 0  # install's own pass is start-up, not a stall


def test_a_frozen_cycle_waits_for_the_full_pass_that_growth_triggers(
    collector: tuple[GarbageCollector, GatewayMetrics],
) -> None:
    tuned, metrics = collector
    tuned.full_growth = 0.05
    a, b = Node(), Node()
    a.other, b.other = b, a
    watched = weakref.ref(a)
    tuned.tick()  # alive at the tick: frozen
    del a, b  # garbage now, inside the permanent generation: only a full pass can find it
    gc.collect()
    assert watched() is not None  # the price of freezing: no ordinary pass sees it
    assert tuned.tick() is False and tuned.full_passes == 0  # memory has not grown
    ballast = [Node() for _ in range(sys.getallocatedblocks() // 10)]  # > 10 % more blocks: past 5 %
    assert tuned.tick() is True
    assert watched() is None  # the full pass found the cycle
    assert tuned.full_passes == 1 and metrics.gc_full_passes._value.get() == 1
    assert sum(metrics.gc_pause.labels("full").counts) == 1
    assert tuned.tick() is False  # the base moved with the ballast: one pass, not one per tick
    del ballast


def test_a_cycle_dropped_within_an_interval_is_collected_before_the_freeze(
    collector: tuple[GarbageCollector, GatewayMetrics],
) -> None:
    gc.disable()  # no automatic pass: only the tick's own
    try:
        watched = cycle()  # unreferenced at once (an httpx response read and dropped between two ticks)
        assert watched() is not None
        collector[0].tick()
        assert watched() is None
    finally:
        gc.enable()


def test_the_young_threshold_is_raised_while_installed_and_restored_after() -> None:
    before = gc.get_threshold()
    tuned = GarbageCollector(GatewayMetrics(CollectorRegistry()), interval_s=1.0, young_threshold=before[0] * 3 + 1)
    tuned.install()
    try:
        assert gc.get_threshold() == (before[0] * 3 + 1, *before[1:])
    finally:
        tuned.uninstall()
        gc.unfreeze()
    assert gc.get_threshold() == before
    untouched = GarbageCollector(GatewayMetrics(CollectorRegistry()), interval_s=1.0)  # 0: CPython's own
    untouched.install()
    try:
        assert gc.get_threshold() == before
    finally:
        untouched.uninstall()
        gc.unfreeze()
