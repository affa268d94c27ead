"""ModelSync: replicas share their learned numbers through the shared store, each format with its own kind."""

from __future__ import annotations

from gateway.adaptive.learner import EXPORT_FORMAT, Learner, Observation
from gateway.adaptive.shared import ModelSync
from gateway.metrics import HistogramSeries
from gateway.signals.store import Estimate, MemorySharedState, SharedStateUnavailable


def taught(count: int = 30) -> Learner:
    learner = Learner()
    for i in range(count):
        learner.observe(Observation("speculative", "chat", 100, i % 8, 0.05, 0.05 + 63 * 0.01, 64, 2.5))
    return learner


async def test_a_fresh_replica_takes_in_what_another_of_its_format_learned() -> None:
    store = MemorySharedState()
    assert await ModelSync(taught(), store, ttl_s=30, owner="gw-a").sync(now=100.0)
    fresh = Learner()
    assert await ModelSync(fresh, store, ttl_s=30, owner="gw-b").sync(now=101.0)
    assert fresh.model().samples("speculative") > 0
    assert fresh.export().keys() >= taught().export().keys()


async def test_the_export_and_the_absorb_are_each_timed_but_not_the_store() -> None:
    timing = HistogramSeries((0.001, 0.01))
    assert await ModelSync(taught(), MemorySharedState(), ttl_s=30, owner="gw-a", timing=timing).sync(now=100.0)
    assert sum(timing.counts) == 2


async def test_numbers_written_in_another_format_are_not_blended_in() -> None:
    """A rolling upgrade: a replica of an older format (numbers in other units) shares the same Redis."""
    store = MemorySharedState()
    older = {name: Estimate(value * 3 + 1, weight) for name, (value, weight) in taught().export().items()}
    await store.put_estimates("gw-old", older, now=100.0, ttl_s=30)  # the unversioned space the old code wrote
    await store.put_estimates("gw-older", older, now=100.0, ttl_s=30, space=f"est:v{EXPORT_FORMAT - 1}")
    fresh = Learner()
    sync = ModelSync(fresh, store, ttl_s=30, owner="gw-new")
    assert await sync.sync(now=101.0)
    assert fresh.export() == {} and fresh.model().samples("speculative") == 0
    # and what the new replica wrote is where only its own format reads it
    assert await store.get_estimates(now=101.0, ttl_s=30, space=sync.space) == {}
    await ModelSync(taught(), store, ttl_s=30, owner="gw-new-2").sync(now=102.0)
    assert await store.get_estimates(now=102.0, ttl_s=30, space=sync.space)
    assert (await store.get_estimates(now=102.0, ttl_s=30)).keys() == older.keys()  # the old space is untouched


async def test_the_replicas_that_synced_lately_are_counted_as_gateways() -> None:
    store = MemorySharedState()
    a = ModelSync(taught(), store, ttl_s=30, owner="gw-a", alive_s=6)
    b = ModelSync(Learner(), store, ttl_s=30, owner="gw-b", alive_s=6)
    assert (a.gateways, b.gateways) == (1, 1)  # before any sync: only itself
    assert await a.sync(now=100.0) and a.gateways == 1
    assert await b.sync(now=101.0) and b.gateways == 2
    assert await a.sync(now=102.0) and a.gateways == 2
    assert await a.sync(now=110.0) and a.gateways == 1  # b stopped syncing 9 s ago


async def test_with_the_store_down_the_last_count_stands() -> None:
    class Down(MemorySharedState):
        async def put_estimates(self, *args: object, **kwargs: object) -> None:
            raise SharedStateUnavailable("down")

    store = MemorySharedState()
    sync = ModelSync(taught(), store, ttl_s=30, owner="gw-a", alive_s=6)
    await store.put_estimates("gw-b", {}, now=100.0, ttl_s=30, space=sync.space)
    assert await sync.sync(now=101.0) and sync.gateways == 2
    sync.store = Down()
    assert not await sync.sync(now=120.0) and sync.gateways == 2
