"""Circuit breaking per replica, from the outcomes of real requests.

Active health checks (``gateway/health.py``) ask each replica ``/health`` every few seconds; a replica can
pass them and still fail every request (an engine error, a broken model load, a proxy in front of a dead
engine), or fail requests long before its next check. The breaker watches what the proxy saw instead:

* closed: traffic flows. ``failure_threshold`` failures in a row, or an error rate of at least
  ``error_rate`` over ``window_s`` seconds (once ``min_requests`` were seen in the window), open it.
* open: the replica gets no traffic for ``cooldown_s`` seconds.
* half-open: after the cool-down, exactly one request (the probe) goes to it. Success closes the breaker,
  failure opens it again for another cool-down; a probe that ends without an outcome (the client went
  away) lets the next request probe.

A failure is a connect error, a response broken off, a first-byte or idle timeout, or a 5xx status; a 4xx
is the client's fault and counts as a success. The open-to-half-open step is taken by :meth:`tick`, which
the snapshot loop calls a few times a second, so the request path only reads one attribute (``admits``)
per candidate replica and pays one clock read and a few integer updates per outcome.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config import Settings

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"
STATES = (CLOSED, OPEN, HALF_OPEN)


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    failure_threshold: int = 5  # consecutive failures that open the breaker; 0 disables circuit breaking
    error_rate: float = 0.5  # failures / requests over the window that open it
    min_requests: int = 20  # the error rate counts only with at least this many outcomes in the window
    window_s: float = 10.0
    cooldown_s: float = 5.0

    @property
    def enabled(self) -> bool:
        return self.failure_threshold > 0


class CircuitBreaker:
    """One replica's breaker. ``admits`` is what ``Pool.pick`` reads: False while open or while the
    half-open probe is in flight."""

    __slots__ = (
        "_buckets",
        "_clock",
        "_consecutive",
        "_on_change",
        "_policy",
        "admits",
        "opened_at",
        "opens",
        "state",
    )

    def __init__(
        self,
        policy: BreakerPolicy,
        on_change: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policy = policy
        self._on_change = on_change
        self._clock = clock
        self._consecutive = 0
        # One [second, requests, failures] bucket per second of the window, indexed by second % size.
        self._buckets = [[-1, 0, 0] for _ in range(max(1, math.ceil(policy.window_s)))]
        self.state = CLOSED
        self.admits = True
        self.opened_at = 0.0
        self.opens = 0  # times opened, for tests and logs

    # -- outcomes (the proxy) ------------------------------------------------------------------------
    def success(self) -> None:
        self._consecutive = 0
        if not self._policy.enabled:
            return
        self._count(failed=False)
        if self.state == HALF_OPEN:
            self._set(CLOSED)

    def failure(self) -> None:
        policy = self._policy
        if not policy.enabled:
            return
        self._consecutive += 1
        requests, failures = self._count(failed=True)
        tripped = self._consecutive >= policy.failure_threshold or (
            requests >= policy.min_requests and failures >= policy.error_rate * requests
        )
        if self.state == HALF_OPEN or (self.state == CLOSED and tripped):
            self._open()

    # -- dispatch (the pools) ------------------------------------------------------------------------
    def dispatched(self) -> bool:
        """A request was booked on this replica; True when it is the half-open probe."""
        if self.state != HALF_OPEN:
            return False
        self.admits = False
        return True

    def probe_ended(self) -> None:
        """The probe's booking was released; without an outcome the breaker lets the next request probe."""
        if self.state == HALF_OPEN:
            self.admits = True

    def tick(self) -> None:
        """Move from open to half-open once the cool-down is over (called off the request path)."""
        if self.state == OPEN and self._clock() >= self.opened_at + self._policy.cooldown_s:
            self._set(HALF_OPEN)

    # -- internals -----------------------------------------------------------------------------------
    def _open(self) -> None:
        self.opened_at = self._clock()
        self.opens += 1
        self._consecutive = 0
        for bucket in self._buckets:  # a fresh window after the cool-down: old failures do not reopen it
            bucket[0] = -1
        self._set(OPEN)

    def _set(self, state: str) -> None:
        self.state = state
        self.admits = state != OPEN
        if self._on_change is not None:
            self._on_change(state)

    def _count(self, failed: bool) -> tuple[int, int]:
        """Count one outcome; returns (requests, failures) over the window (summed on failures only)."""
        second = int(self._clock())
        buckets = self._buckets
        bucket = buckets[second % len(buckets)]
        if bucket[0] != second:
            bucket[0], bucket[1], bucket[2] = second, 0, 0
        bucket[1] += 1
        if not failed:
            return 0, 0
        bucket[2] += 1
        oldest = second - len(buckets)
        live = [b for b in buckets if b[0] > oldest]
        return sum(b[1] for b in live), sum(b[2] for b in live)


def breaker_policy(settings: Settings) -> BreakerPolicy:
    return BreakerPolicy(
        failure_threshold=settings.breaker_failures,
        error_rate=settings.breaker_error_rate,
        min_requests=settings.breaker_min_requests,
        window_s=settings.breaker_window_s,
        cooldown_s=settings.breaker_cooldown_s,
    )
