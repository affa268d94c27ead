"""``specgate bench decide`` (gateway/bench/decide.py): every row is measured, the cache-aware path included."""

from __future__ import annotations

from gateway.bench.decide import measure


def test_every_row_is_timed_including_the_pool_choice_that_reads_the_cache() -> None:
    results = measure(rounds=5)
    assert "whole decision, index on, each pool's expected cached tokens read" in results
    assert "whole decision, warm, not remembered" in results  # the memo missed: the loaded gateway's usual case
    assert all(len(samples) == 5 and min(samples) > 0 for samples in results.values())
