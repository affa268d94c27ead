"""`specgate demo --quick` end to end: two emulator processes and the real gateway on loopback."""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from backends.emulator.demo import QUICK, run_demo
from backends.emulator.demo_report import task_rows


@pytest.mark.slow
def test_quick_demo_routes_through_the_gateway_and_stops_everything(tmp_path: Path) -> None:
    out = io.StringIO()
    plot = tmp_path / "demo.png"
    outcome = run_demo(QUICK, Console(file=out, width=140), plot)
    text = out.getvalue()
    assert outcome.exit_code == 0, text
    assert "EMULATED through the gateway: low load" in text and "high load" in text
    assert plot.stat().st_size > 10_000

    pinned = [s for s in outcome.samples if s.phase in ("standard", "speculative")]
    assert all(s.pool == s.phase for s in pinned)  # the x-specgate-pool header pins the pool
    low = [s for s in outcome.samples if s.level == "low" and s.phase == "rules"]
    assert all(s.pool == "speculative" for s in low if s.arrival.item.category == "code")
    assert all(s.pool == "standard" for s in low if s.arrival.item.category in ("chat", "short"))
    assert not any(s.reason == "high-load" for s in low)
    adaptive = [s for s in outcome.samples if s.phase == "adaptive"]
    assert adaptive and all(s.status == 200 for s in adaptive)
    assert outcome.learned_after is not None  # the pinned phases taught it: it decides in the high-load phase
    assert any(s.reason.startswith("fastest") for s in adaptive if s.level == "high")
    assert "adaptive: the learned model decided after" in text
    high = [s for s in outcome.samples if s.level == "high" and s.phase == "rules"]
    reasons = Counter(s.reason for s in high)
    # 25 QPS > the rules' 20, so the high-load rule fires; how often depends on the quick run's short, noisy
    # QPS window and on how evenly a loaded machine lets the client send, so only its firing is asserted.
    assert reasons["high-load"] > 0, reasons
    rows = {row[0]: row for row in task_rows(outcome.samples, "high")}
    assert rows["all"][4] > rows["all"][3], text  # speculative slower than standard at high load (emulated)
    assert rows["all"][6] < rows["all"][4], text  # adaptive: not stuck on the pool that is slow under load

    for port in outcome.ports.values():
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still open"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_demo_stops_every_server(signum: int) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        assert demo.stdout is not None
        ready = ""
        for line in demo.stdout:
            if line.startswith("servers ready:"):
                ready = line
                break
        ports = [int(port) for port in re.findall(r":(\d+)", ready)]
        assert len(ports) == 3, ready
        demo.send_signal(signum)
        assert demo.wait(timeout=20) == 130
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        if demo.stdout is not None:
            demo.stdout.close()
    for port in ports:
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still open"
