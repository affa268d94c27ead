"""How long a cold start takes to settle: against its own tail, or window by window against a warm run."""

from __future__ import annotations

from backends.emulator.evaluate import _settling
from backends.emulator.scenarios import requests_to_learn
from backends.emulator.simulate import ADAPTIVE_WARM, MYOPIC, RequestResult


def results(latencies: list[float]) -> list[RequestResult]:
    return [RequestResult(i, f"item-{i}", "chat", "chat", "standard", "test", float(i), 0.5, 64, 0.1, latency)
            for i, latency in enumerate(latencies)]  # fmt: skip


def test_settles_when_three_windows_in_a_row_come_within_the_tolerance() -> None:
    curve = [(100, 2.0), (200, 1.5), (300, 1.05), (400, 1.0), (500, 1.02), (600, 1.0), (700, 1.01), (800, 1.0)]
    assert requests_to_learn(curve) == 200
    assert requests_to_learn(curve, steady_ratio=1.0) == 200
    assert requests_to_learn([(100, 2.0), (200, 1.5), (300, 1.3)], steady_ratio=1.0) is None


def test_a_light_last_third_does_not_set_the_bar() -> None:
    """The cold run against the myopic reference, on arrivals that go quiet at the end: the cold run's own last
    third is easy, so its ratio there is lower than the warm run's ever is, and the cold run looks unsettled
    long after it has caught up with the warm run on the same requests."""
    warm = [1.0] * 900
    cold = [3.0] * 100 + [1.05] * 500 + [1.0] * 300
    myopic = [0.7] * 600 + [0.99] * 300  # the quiet end: every policy near the bound
    against_tail, _ = _settling(results(cold), {MYOPIC: results(myopic)})
    against_warm, windows = _settling(results(cold), {MYOPIC: results(myopic), ADAPTIVE_WARM: results(warm)})
    assert windows == 9
    assert against_warm == 100
    assert against_tail == 600  # only the quiet tail itself is within 10 % of the tail's ratio
