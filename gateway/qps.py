"""Requests per second over a sliding window, counted locally in one-second buckets."""

from __future__ import annotations

import math


class LocalQps:
    """``record`` is O(1) and allocation-free on the hot path; ``rate`` sums the last ``window_s`` seconds."""

    def __init__(self, window_s: float = 10.0) -> None:
        self._width = max(1, math.ceil(window_s))
        self._counts = [0] * self._width
        self._seconds = [-1] * self._width

    def record(self, now: float) -> None:
        second = int(now)
        slot = second % self._width
        if self._seconds[slot] != second:
            self._seconds[slot] = second
            self._counts[slot] = 0
        self._counts[slot] += 1

    def rate(self, now: float) -> float:
        """Mean rate over the window: the last ``window - 1`` whole seconds plus the current partial one."""
        current = int(now)
        oldest = current - self._width + 1
        total = sum(c for c, s in zip(self._counts, self._seconds, strict=True) if oldest <= s <= current)
        return total / (self._width - 1 + max(now - current, 0.001)) if self._width > 1 else float(total)
