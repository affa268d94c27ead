"""Per-request guards: client-disconnect detection and first-byte / idle deadlines.

One sweeper task checks every active guard's deadline a few times a second, so the hot path pays one
float store per chunk (``guard.deadline = ...``) instead of arming a timer for every read. A guard that
fires cancels the request's task and says why in ``reason``.
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive


class Guard:
    __slots__ = ("_sweeper", "_task", "_watcher", "deadline", "loop", "reason")

    def __init__(self, sweeper: Sweeper, deadline: float) -> None:
        self._sweeper = sweeper
        self._task = asyncio.current_task()
        self.loop = asyncio.get_running_loop()
        self._watcher: asyncio.Task[None] | None = None
        self.deadline = deadline
        self.reason: str | None = None  # "disconnect" or "timeout" once fired

    def watch_disconnect(self, receive: Receive) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.fire("disconnect")

    def fire(self, reason: str) -> None:
        if self.reason is None and self._task is not None:
            self.reason = reason
            self._task.cancel()

    def rearm(self, timeout_s: float) -> None:
        """Start a fresh deadline after a fired timeout was absorbed (a retry)."""
        self.reason = None
        self.deadline = asyncio.get_running_loop().time() + timeout_s
        self._sweeper.add(self)

    def settle(self) -> None:
        """Stop watching: no later event may cancel the request's task."""
        self.reason = self.reason or "settled"
        self._sweeper.discard(self)
        if self._watcher is not None:
            self._watcher.cancel()

    def absorb_cancel(self) -> bool:
        """After a CancelledError: True (and the cancel undone) when this guard caused it."""
        if self.reason in ("disconnect", "timeout") and self._task is not None:
            self._task.uncancel()
            return True
        return False


class Sweeper:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._guards: set[Guard] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def guard(self, timeout_s: float) -> Guard:
        loop = self._loop or asyncio.get_running_loop()
        guard = Guard(self, loop.time() + timeout_s)
        self._guards.add(guard)
        return guard

    def add(self, guard: Guard) -> None:
        self._guards.add(guard)

    def discard(self, guard: Guard) -> None:
        self._guards.discard(guard)

    def __len__(self) -> int:
        return len(self._guards)

    async def run(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval_s)
            now = loop.time()
            expired = [g for g in self._guards if g.deadline <= now]
            for guard in expired:
                self._guards.discard(guard)
                guard.fire("timeout")
