"""`specgate bench signals` runs end to end with real Redis and Prometheus (a few requests; the figures come
from the command itself, see docs/signals.md)."""

from __future__ import annotations

import shutil

import pytest

from gateway.cli import main
from tests.signals._paths import missing

pytestmark = [pytest.mark.redis, pytest.mark.prometheus, pytest.mark.slow]


def test_signals_benchmark_prints_every_condition_without_failures(capsys: pytest.CaptureFixture[str]) -> None:
    for binary in ("redis-server", "prometheus"):
        if shutil.which(binary) is None:
            missing(f"`{binary}` is not installed (scripts/setup/10-services.sh installs it)")
    assert main(["bench", "signals", "--requests", "20", "--settle", "0.5"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0] + (" " + line.split()[1] if line.startswith("no signals") else ""): line.split()
            for line in out.splitlines() if line.startswith(("no signals", "healthy", "slow", "down"))}  # fmt: skip
    assert set(rows) == {"no signals", "healthy", "slow", "down"}
    for name, cells in rows.items():
        n, failed = (cells[2], cells[3]) if name == "no signals" else (cells[1], cells[2])
        assert (int(n), int(failed)) == (20, 0), name
    assert "hot-path cost of SharedQps.record" in out
