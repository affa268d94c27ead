"""Active health checks: each replica's ``/health``, and the models it serves from ``/v1/models``.

Health checks run off the request path, through the upstream seam (:func:`gateway.upstream.fetcher`, an
upstream of their own), and never touch bookings. A check ends in one of four
verdicts:

* ``ok``: ``/health`` answered 200; the replica is up.
* ``failed``: the replica answered something else, or refused the connection; it is down.
* ``timeout``: no answer within ``health_timeout_s`` while the gateway's own loop kept time (a hung replica,
  SIGSTOP); it is down, but only *suspected*: when no replica of either pool is up, the request path still
  tries a suspected one rather than answering 503 at once (``PoolSet.acquire``).
* ``late``: no answer in time, but the gateway's event loop itself stalled for a quarter of the timeout or
  more during the check (:class:`gateway.looplag.LoopLagMonitor`): the answer may be sitting unread in the
  socket. The check says nothing about the replica, which keeps its state; the next round asks again.

A replica that fails a real request is marked down at once by the proxy (connect error) or by its circuit
breaker; the next passing check brings it back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Literal

import orjson

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.looplag import LoopLagMonitor
from gateway.pools import PoolSet, Replica
from gateway.upstream import Fetch

log = logging.getLogger("specgate.health")
Verdict = Literal["ok", "failed", "timeout", "late"]  # pools.HEALTH_VERDICTS
LATE_SHARE = 0.25  # a timed-out check during which the loop stalled this share of the timeout says nothing


class HealthChecker:
    def __init__(
        self, pools: PoolSet, interval_s: float, timeout_s: float, on_round: Callable[[], None],
        lag: LoopLagMonitor | None = None,
    ) -> None:  # fmt: skip
        self._pools = pools
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._on_round = on_round
        self._lag = lag

    async def run(self, fetch: Fetch) -> None:
        while True:
            await self.check_all(fetch)
            await asyncio.sleep(self._interval_s)

    async def check_all(self, fetch: Fetch) -> None:
        replicas = self._pools.replicas()
        results = await asyncio.gather(*(self._check(fetch, r) for r in replicas))
        for replica, (verdict, models) in zip(replicas, results, strict=True):
            replica.count_check(verdict)
            if verdict == "late":
                log.info("health check of %s timed out while the gateway's loop stalled: not counted", replica.url)
                continue
            healthy = verdict == "ok"
            if healthy != replica.healthy:
                state = "up" if healthy else f"down ({verdict})"
                log.warning("replica %s (%s) is now %s", replica.url, replica.pool, state)
            replica.set_healthy(healthy, suspect=verdict == "timeout")
            if models is not None:
                replica.models = models
        self._on_round()

    async def _check(self, fetch: Fetch, replica: Replica) -> tuple[Verdict, tuple[str, ...] | None]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        stalled_before = self._lag.stalled_s(started) if self._lag is not None else 0.0
        try:
            status, _ = await fetch(f"{replica.url}/health", self._timeout_s)
            if status != 200:
                return "failed", None
            if replica.models:
                return "ok", None
            status, body = await fetch(f"{replica.url}/v1/models", self._timeout_s)
            data = orjson.loads(body).get("data", []) if status == 200 else []
            models = tuple(sorted(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m))
            return "ok", models or None
        except UpstreamTimeout as exc:
            now = loop.time()
            stalled = self._lag.stalled_s(now) - stalled_before if self._lag is not None else 0.0
            log.debug("health check of %s timed out after %.2f s (loop stalled %.2f s): %r",
                      replica.url, now - started, stalled, exc)  # fmt: skip
            return ("late" if stalled >= LATE_SHARE * self._timeout_s else "timeout"), None
        except (UpstreamError, ValueError, AttributeError, TypeError) as exc:
            log.debug("health check of %s failed: %r", replica.url, exc)
            return "failed", None
