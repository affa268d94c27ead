"""Gateway QPS shared across replicas, without a Redis round-trip on the request path.

The request path calls :meth:`SharedQps.record` (an int increment in a dict, well under a
microsecond). A background task calls :meth:`SharedQps.sync` every few hundred milliseconds: it hands
the counts gathered since the last sync to the :class:`~gateway.signals.store.SharedState` (INCRBY per
second bucket in Redis) and reads back the total rate of every replica. If the store fails, the counts
stay pending (while they are inside the window) and go out with the next successful sync, so a Redis
outage loses nothing that could still matter. (A write that timed out after Redis applied it is counted
twice; that errs towards a higher QPS, the safe side for routing.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.signals.store import SharedState, SharedStateUnavailable


@dataclass(frozen=True, slots=True)
class SharedRate:
    """The last rate read from the shared store."""

    qps: float
    at: float  # clock time of the read


class SharedQps:
    """Counts this replica's requests per wall-clock second; :meth:`sync` publishes them and reads the total.

    Buckets are keyed by wall-clock seconds so that replicas on different hosts agree on them: pass
    ``time.time`` values (NTP-synchronised hosts), not a monotonic clock.
    """

    def __init__(self, store: SharedState, window_s: float = 10.0) -> None:
        self.store = store
        self.window_s = window_s
        self._pending: dict[int, int] = {}
        self.last: SharedRate | None = None
        self.error: str | None = None
        self.failed_before = False
        self.trusted_from = 0.0  # after an outage: Redis may have lost buckets, so wait one window

    @property
    def up(self) -> bool:
        return self.error is None

    def trusted(self, now: float) -> bool:
        """Up, and (after an outage) synced for a whole window again: a Redis that restarted empty, or
        missed other replicas' counts meanwhile, reads low until its window has refilled."""
        return self.up and self.last is not None and now >= self.trusted_from

    def record(self, now: float) -> None:
        """Hot path: count one request. No I/O."""
        second = int(now)
        self._pending[second] = self._pending.get(second, 0) + 1

    def pending_requests(self) -> int:
        return sum(self._pending.values())

    async def sync(self, now: float) -> SharedRate | None:
        """Flush pending counts and read the shared rate. Returns None (and keeps the counts) on failure."""
        batch, self._pending = self._pending, {}
        try:
            await self.store.add_requests(batch, self.window_s)
        except SharedStateUnavailable as exc:
            self._requeue(batch, now)
            return self._failed(exc)
        try:
            qps = await self.store.request_rate(now, self.window_s)
        except SharedStateUnavailable as exc:
            return self._failed(exc)
        if self.failed_before:
            self.failed_before = False
            self.trusted_from = now + self.window_s
        self.error = None
        self.last = SharedRate(qps=qps, at=now)
        return self.last

    def _failed(self, exc: SharedStateUnavailable) -> SharedRate | None:
        self.error = str(exc)
        self.failed_before = True
        return None

    def _requeue(self, batch: dict[int, int], now: float) -> None:
        horizon = math.floor(now) - math.ceil(self.window_s)
        for second, count in batch.items():
            if second > horizon:  # older counts can no longer change anyone's rate
                self._pending[second] = self._pending.get(second, 0) + count
