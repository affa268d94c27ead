from gateway.qps import LocalQps


def test_rate_over_window() -> None:
    qps = LocalQps(window_s=10)
    for i in range(100):
        qps.record(1000.0 + i * 0.1)  # 10 requests a second for 10 seconds
    assert 9.0 <= qps.rate(1009.95) <= 11.0


def test_old_seconds_drop_out() -> None:
    qps = LocalQps(window_s=5)
    for _ in range(50):
        qps.record(100.5)
    assert qps.rate(100.9) > 0
    assert qps.rate(106.0) == 0.0


def test_slots_are_reused_after_wraparound() -> None:
    qps = LocalQps(window_s=3)
    qps.record(10.2)
    qps.record(13.2)  # same slot as second 10
    assert qps.rate(13.5) * (2 + 0.5) == 1
