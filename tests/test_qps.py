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


def test_before_a_window_has_passed_the_rate_is_over_the_time_since_the_first_request() -> None:
    qps = LocalQps(window_s=10)
    for i in range(150):
        qps.record(100.0 + i / 60)  # 60 requests a second since 100.0
    assert 55.0 <= qps.rate(102.5) <= 65.0  # over 2.5 s, not over a 10 s window that was empty before 100.0
    early = LocalQps(window_s=10)
    for i in range(12):
        early.record(100.0 + i / 60)
    assert early.rate(100.2) == 12.0  # at least a second: a few first requests are not read as a burst
    for i in range(600):  # once a window has passed, the window's mean as before
        early.record(103.0 + i / 60)
    assert 55.0 <= early.rate(112.99) <= 65.0
