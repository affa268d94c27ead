"""`specgate bench hooks` measures each optional hook (a few calls; the figures come from the command)."""

from __future__ import annotations

import re

import pytest

from gateway.cli import main


def test_hooks_benchmark_prints_a_positive_cost_per_hook(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "hooks", "-n", "200", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    costs = dict(re.findall(r"^  (.+?)\s+([\d.]+) us$", out, re.MULTILINE))
    assert set(costs) == {"request id (made)", "JSON request line", "tracing, sampled: all", "tracing, sampled: 10 %"}
    assert all(float(v) > 0 for v in costs.values())
