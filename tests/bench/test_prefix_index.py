from __future__ import annotations

import pytest

from gateway.bench.prefix_index import measure_memory, session_messages
from gateway.cli import main


def test_memory_is_bounded_by_the_capacity_not_the_sessions() -> None:
    small = measure_memory(sessions=200, replicas=2, turns=2, capacity=64)
    more = measure_memory(sessions=2000, replicas=2, turns=2, capacity=64)
    assert small.values_held == more.values_held == 2 * 64
    assert more.bytes_held < 1.3 * small.bytes_held + 4096
    assert more.bytes_per_value < 400
    assert more.later_turn_hit_share > 0.5  # each session's next turn found on its replica


def test_session_messages_resend_the_history() -> None:
    turns = session_messages(3, 3)
    assert len(turns) == 3 and turns[2][: len(turns[1])] == turns[1]


def test_the_command_prints_memory_and_costs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "prefix-index", "--sessions", "300", "--capacity", "64", "--rounds", "200"]) == 0
    out = capsys.readouterr().out
    assert "typical chat" in out and "300" in out and "256" in out  # 4 replicas x 64 values held
