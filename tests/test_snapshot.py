from gateway.snapshot import SPECULATIVE, STANDARD, PoolSnapshot, Snapshot, other_pool


def test_other_pool_is_the_fallback() -> None:
    assert other_pool(STANDARD) == SPECULATIVE
    assert other_pool(SPECULATIVE) == STANDARD


def test_missing_pool_reads_as_unavailable() -> None:
    snap = Snapshot(pools={STANDARD: PoolSnapshot(STANDARD, healthy_replicas=1, total_replicas=1)})
    assert snap.pool(STANDARD).available
    assert not snap.pool(SPECULATIVE).available
