"""The cyclic garbage collector, kept to short pauses while ``specgate serve`` runs.

CPython's collector scans a generation's objects all at once, with the event loop stopped. In a loaded gateway
the objects it finds are in-flight requests (a stream's relay, parsers, tasks: ~55 tracked objects each), alive
and not garbage: a request leaves no reference cycles behind (tests/test_direct.py collects with
``DEBUG_SAVEALL``), so each pass over them only stalls every request. With 1,000 streams in flight, measured
with ``gc.callbacks`` under ``specgate bench soak`` (Dec 6 2026, this 2-core machine): middle-generation
passes of 8 ms (max 18 ms) about once a second and oldest-generation passes of 27 ms (max 57 ms) every ten
seconds or so, the largest part of the loop lag and of the first-byte tail (docs/performance.md, "What stalls
the event loop").

So, once start-up is built, :class:`GarbageCollector` runs, every ``interval_s``, a pass over the two young
generations (what the last interval made and still holds: ~1 ms with 1,000 streams) and then
``gc.freeze()``: every tracked object moves to the permanent generation, which no pass scans again (a frozen
object still dies the moment its last reference goes, as any object does). Passes then only ever scan what
the last interval made, and the oldest generation stays empty. ``gc.freeze()`` is a list splice, O(1).

The cost: a cycle whose objects lived through a tick before they became garbage is not found while frozen.
The young pass before each freeze finds the cycles made and dropped within one interval (the health checks'
and scrapes' httpx responses, the only cycles the gateway makes: without that pass a light load froze them
before any pass ran, and RSS grew ~1 MiB a minute at 64 streams). A leak that grows anyway is caught by a
full pass (unfreeze, collect, freeze) when the memory blocks Python has allocated (``sys.getallocatedblocks``,
~3 us) have grown ``full_growth`` times over their count after the last full pass. In-flight requests count
too, so a jump in load can trigger one full pass, which resets the base. (Counting the frozen objects
instead walks them all: 10-15 ms for 150k objects, measured as a stall of its own.)

Every pass is timed into ``specgate_gc_pause_seconds{generation}`` (``full`` for the safety pass).

The youngest generation's threshold is raised from CPython's 700 to ``young_threshold`` (10,000 by default):
a pass runs every that many container allocations, and at thousands of requests a second (~55 tracked
objects each) 700 meant ~600 passes a second, each rescanning the in-flight requests made since the last
freeze. At 10,000 a pass scans at most that many young objects (~1 ms) about 40 times a second, and the
gateway's CPU per non-streamed request fell ~7 % (gateway/bench/overhead.py's rig, issue 30; figures in
docs/performance.md). Objects that die young are never scanned at any threshold; the freeze bounds the rest.

Only ``specgate serve`` installs one: tests build many apps in one process, and freezing a test runner's
objects is not theirs to do.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from typing import Any

from gateway.metrics import GatewayMetrics, held

log = logging.getLogger("specgate")


class GarbageCollector:
    def __init__(
        self, metrics: GatewayMetrics, interval_s: float = 1.0, full_growth: float = 1.0, young_threshold: int = 0
    ) -> None:
        self.interval_s = interval_s
        self.full_growth = full_growth
        self.young_threshold = young_threshold  # 0: CPython's own
        self._thresholds = gc.get_threshold()  # as they were before install()
        self.full_passes = 0
        self._pauses = {str(g): metrics.gc_pause.labels(str(g)) for g in range(3)}
        self._full_pause = metrics.gc_pause.labels("full")
        self._full_counter = metrics.gc_full_passes
        self._job = metrics.background.labels("gc-freeze")
        self._started = 0.0
        self._in_full = False
        self._base = 0  # memory blocks allocated after the last full pass

    def install(self) -> None:
        """Collect and freeze what start-up built; time every pass from then on."""
        self._full()
        self._thresholds = gc.get_threshold()
        if self.young_threshold > 0:
            gc.set_threshold(self.young_threshold, *self._thresholds[1:])
        gc.callbacks.append(self._on_gc)

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
            gc.set_threshold(*self._thresholds)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        (self._full_pause if self._in_full else self._pauses[str(info["generation"])]).observe(took)

    def _full(self) -> int:
        """Unfreeze, collect every generation, freeze again: the objects found unreachable."""
        self._in_full = True
        try:
            gc.unfreeze()
            found = gc.collect()
            gc.freeze()
        finally:
            self._in_full = False
        self._base = sys.getallocatedblocks()
        return found

    def tick(self) -> bool:
        """Collect the young generations, freeze what they still hold; a full pass if memory outgrew its base.
        True when a full pass ran."""
        gc.collect(1)
        gc.freeze()
        base, blocks = self._base, sys.getallocatedblocks()
        if blocks <= base * (1 + self.full_growth):
            return False
        started = time.perf_counter()
        found = self._full()
        self.full_passes += 1
        self._full_counter.inc()
        log.info("gc: allocated blocks grew from %d to %d: a full pass found %d unreachable objects in %.1f ms "
                 "(%d blocks now)", base, blocks, found, (time.perf_counter() - started) * 1e3, self._base)  # fmt: skip
        return True

    async def run(self) -> None:
        if self.interval_s <= 0:
            return
        while True:
            await asyncio.sleep(self.interval_s)
            with held(self._job):
                self.tick()
