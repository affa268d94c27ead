"""``specgate bench decide`` (gateway/bench/decide.py): every row is measured, the cache-aware path included."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.bench.decide import main, measure


def test_every_row_is_timed_including_the_pool_choice_that_reads_the_cache() -> None:
    results = measure(rounds=5)
    assert "whole decision, index on, each pool's expected cached tokens read" in results
    assert "whole decision, warm, not remembered" in results  # the memo missed: the loaded gateway's usual case
    assert all(len(samples) == 5 and min(samples) > 0 for samples in results.values())


@pytest.mark.slow
def test_the_compiled_comparison_times_both_sides(image_wheel: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--compiled``: each side in a process of its own; a side that did not run as it says fails the command."""
    assert main(rounds=20, compiled=True, wheel=image_wheel) == 0
    shown = capsys.readouterr().out
    assert "compiled / source" in shown and "whole decision, warm, not remembered" in shown
