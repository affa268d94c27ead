"""Sharing what the learners of several gateway replicas learned, through the shared store (Redis).

Every ``model_sync_interval_s`` each replica writes its learned numbers (``Learner.export``) under its own
name with a TTL and reads everyone's, merged by weight, back into its learner (``Learner.absorb``). A new or
restarted replica thus starts from what the others learned. The replicas that synced within ``alive_s`` are
counted too (``gateways``): each gateway scales the requests it sent since the last engine scrape by that
count to estimate everyone's (``pool_load``), and splits near balance at least as much as ``1 - 1/gateways``.
With the store down the last count stands (the replicas did not go away with it), and each replica keeps
learning alone: a failed sync is logged once per outage and retried next tick; no request ever waits on it.

The numbers live in a space named by the learner's ``EXPORT_FORMAT`` (``est:v4:*`` in Redis): during a rolling
upgrade that changes what a number means, old and new replicas each share with their own version only.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import AbstractContextManager, nullcontext

from gateway.adaptive.learner import EXPORT_FORMAT, Learner
from gateway.metrics import HistogramSeries, held
from gateway.signals.store import Estimate, SharedState, SharedStateUnavailable

log = logging.getLogger("specgate")


class ModelSync:
    def __init__(
        self, learner: Learner, store: SharedState, ttl_s: float, owner: str | None = None, *, alive_s: float = 6.0,
        timing: HistogramSeries | None = None,
    ) -> None:  # fmt: skip
        self.learner = learner
        self.store = store
        self.ttl_s = ttl_s
        self.alive_s = alive_s  # a replica that synced within this long counts as a gateway now
        self.gateways = 1  # the gateway replicas sharing the pools, this one included, as of the last sync
        self.owner = owner or f"gw-{uuid.uuid4().hex[:12]}"
        self.ok: bool | None = None  # None: not tried yet
        self.syncs = 0
        self.space = f"est:v{EXPORT_FORMAT}"
        self.timing = timing  # how long the export and the absorb held the loop (each on its own)

    async def sync(self, now: float) -> bool:
        """Publish this replica's numbers and take in everyone's. False when the store did not answer."""
        with self._held():
            exported = {name: Estimate(value, weight) for name, (value, weight) in self.learner.export().items()}
        try:
            await self.store.put_estimates(self.owner, exported, now, self.ttl_s, self.space)
            shared = await self.store.get_estimates(now, self.ttl_s, self.space)
            live = await self.store.live_owners(now, self.alive_s, self.space)
        except SharedStateUnavailable as exc:
            if self.ok is not False:
                log.warning("learned model not shared: the shared store is unavailable (%s); learning alone", exc)
            self.ok = False
            return False
        if self.ok is False:
            log.info("learned model shared again through the shared store")
        self.ok = True
        self.syncs += 1
        self.gateways = max(1, live)
        with self._held():
            self.learner.absorb({name: (e.value, e.weight) for name, e in shared.items()})
        return True

    def _held(self) -> AbstractContextManager[None]:
        return held(self.timing) if self.timing is not None else nullcontext()
