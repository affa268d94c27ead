"""Active health checks: each replica's ``/health``, and the models it serves from ``/v1/models``.

Health checks run off the request path with httpx and never touch bookings. A replica that fails a
request is marked unhealthy at once by the proxy; the next passing check brings it back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

from gateway.pools import PoolSet, Replica

log = logging.getLogger("specgate.health")


class HealthChecker:
    def __init__(self, pools: PoolSet, interval_s: float, timeout_s: float, on_round: Callable[[], None]) -> None:
        self._pools = pools
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._on_round = on_round

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=self._timeout_s) as client:
            while True:
                await self.check_all(client)
                await asyncio.sleep(self._interval_s)

    async def check_all(self, client: httpx.AsyncClient) -> None:
        replicas = self._pools.replicas()
        results = await asyncio.gather(*(self._check(client, r) for r in replicas))
        for replica, (healthy, models) in zip(replicas, results, strict=True):
            if healthy != replica.healthy:
                log.warning("replica %s (%s) is now %s", replica.url, replica.pool, "up" if healthy else "down")
                replica.set_healthy(healthy)
            if models is not None:
                replica.models = models
        self._on_round()

    async def _check(self, client: httpx.AsyncClient, replica: Replica) -> tuple[bool, tuple[str, ...] | None]:
        try:
            response = await client.get(f"{replica.url}/health")
            if response.status_code != 200:
                return False, None
            if replica.models:
                return True, None
            listing = await client.get(f"{replica.url}/v1/models")
            data = listing.json().get("data", []) if listing.status_code == 200 else []
            models = tuple(sorted(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m))
            return True, models or None
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.debug("health check of %s failed: %r", replica.url, exc)
            return False, None
