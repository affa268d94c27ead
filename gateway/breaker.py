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
the snapshot loop calls a few times a second (it also rotates the error-rate window), so the request path
only reads one attribute (``admits``) per candidate replica and pays a few integer updates per outcome.
"""

from __future__ import annotations

import math
import time
from collections import deque
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
    half-open probe is in flight.

    The error-rate window is a ring of one-second slots that :meth:`tick` rotates (off the request path),
    so an outcome costs the request path a few integer stores and no clock read.
    """

    __slots__ = (
        "_clock",
        "_consecutive",
        "_failures",
        "_on_change",
        "_policy",
        "_requests",
        "_ring",
        "_ring_failures",
        "_ring_requests",
        "_slot_start",
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
        self._requests = self._failures = 0  # outcomes in the current slot
        self._ring: deque[tuple[int, int]] = deque()  # (requests, failures) of the window's closed slots
        self._ring_requests = self._ring_failures = 0
        self._slot_start = clock()
        self.state = CLOSED
        self.admits = True
        self.opened_at = 0.0
        self.opens = 0  # times opened, for tests and logs

    # -- outcomes (the proxy) ------------------------------------------------------------------------
    def success(self) -> None:
        self._consecutive = 0
        self._requests += 1
        if self.state is HALF_OPEN:
            self._set(CLOSED)

    def failure(self) -> None:
        policy = self._policy
        self._consecutive += 1
        self._requests += 1
        self._failures += 1
        if not policy.enabled:
            return
        requests = self._ring_requests + self._requests
        failures = self._ring_failures + self._failures
        tripped = self._consecutive >= policy.failure_threshold or (
            requests >= policy.min_requests and failures >= policy.error_rate * requests
        )
        if self.state is HALF_OPEN or (self.state is CLOSED and tripped):
            self._open()

    # -- dispatch (the pools) ------------------------------------------------------------------------
    def dispatched(self) -> bool:
        """A request was booked on this replica; True when it is the half-open probe."""
        if self.state is not HALF_OPEN:
            return False
        self.admits = False
        return True

    def probe_ended(self) -> None:
        """The probe's booking was released; without an outcome the breaker lets the next request probe."""
        if self.state is HALF_OPEN:
            self.admits = True

    def tick(self) -> None:
        """Rotate the window's slots; move from open to half-open once the cool-down is over. Called a few
        times a second off the request path (the snapshot loop)."""
        now = self._clock()
        elapsed = int(now - self._slot_start)
        if elapsed >= 1:
            self._rotate(elapsed)
            self._slot_start += elapsed
        if self.state is OPEN and now >= self.opened_at + self._policy.cooldown_s:
            self._set(HALF_OPEN)

    # -- internals -----------------------------------------------------------------------------------
    def _rotate(self, slots: int) -> None:
        keep = max(1, math.ceil(self._policy.window_s)) - 1  # closed slots; the current one makes the window
        pushed = [(self._requests, self._failures)] + [(0, 0)] * min(slots - 1, keep)
        self._requests = self._failures = 0
        for requests, failures in pushed:
            self._ring.append((requests, failures))
            self._ring_requests += requests
            self._ring_failures += failures
        while len(self._ring) > keep:
            requests, failures = self._ring.popleft()
            self._ring_requests -= requests
            self._ring_failures -= failures

    def _open(self) -> None:
        self.opened_at = self._clock()
        self.opens += 1
        self._consecutive = 0
        # A fresh window after the cool-down: old failures do not reopen it.
        self._ring.clear()
        self._ring_requests = self._ring_failures = self._requests = self._failures = 0
        self._set(OPEN)

    def _set(self, state: str) -> None:
        self.state = state
        self.admits = state is not OPEN
        if self._on_change is not None:
            self._on_change(state)


def breaker_policy(settings: Settings) -> BreakerPolicy:
    return BreakerPolicy(
        failure_threshold=settings.breaker_failures,
        error_rate=settings.breaker_error_rate,
        min_requests=settings.breaker_min_requests,
        window_s=settings.breaker_window_s,
        cooldown_s=settings.breaker_cooldown_s,
    )
