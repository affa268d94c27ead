"""Requests per second over a sliding window, counted locally in one-second buckets."""

from __future__ import annotations

import math


class LocalQps:
    """``record`` is O(1) and allocation-free on the hot path; ``rate`` sums the last ``window_s`` seconds."""

    def __init__(self, window_s: float = 10.0) -> None:
        self._width = max(1, math.ceil(window_s))
        self._counts = [0] * self._width
        self._seconds = [-1] * self._width
        self._first: float | None = None  # the first request's time: before a window has passed, the rate's span

    def record(self, now: float) -> None:
        if self._first is None:
            self._first = now
        second = int(now)
        slot = second % self._width
        if self._seconds[slot] != second:
            self._seconds[slot] = second
            self._counts[slot] = 0
        self._counts[slot] += 1

    def rate(self, now: float) -> float:
        """Mean rate over the window: the last ``window - 1`` whole seconds plus the current partial one; until a
        window has passed since the first request, over the time since it (at least a second), not over seconds
        in which nothing could have been counted (a gateway started into 60 QPS read 6 QPS after a second)."""
        current = int(now)
        oldest = current - self._width + 1
        total = sum(c for c, s in zip(self._counts, self._seconds, strict=True) if oldest <= s <= current)
        if self._width == 1:
            return float(total)
        span = self._width - 1 + max(now - current, 0.001)
        if self._first is not None and now - self._first < span:
            span = max(now - self._first, 1.0)
        return total / span
