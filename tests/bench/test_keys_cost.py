"""gateway/bench/keys_cost.py runs both variants through the real routing code."""

from __future__ import annotations

import pytest

from gateway.bench import keys_cost


def test_keys_cost_measures_both_variants(capsys: pytest.CaptureFixture[str]) -> None:
    keys_cost.main(["--requests", "200"])
    out = capsys.readouterr().out
    assert "routing step without keys:" in out and "with a key" in out

