"""Per-request guards: client-disconnect detection and first-byte / idle deadlines.

One sweeper task checks every active guard's deadline a few times a second, so the hot path pays one
float store per chunk (``guard.deadline = ...``) instead of arming a timer for every read. A guard that
fires cancels the request's task and says why in ``reason``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.types import Receive

if TYPE_CHECKING:
    from gateway.direct import DirectBody


class Guard:
    __slots__ = ("_sweeper", "_task", "_watcher", "_writer", "deadline", "loop", "reason")

    def __init__(self, sweeper: Sweeper, deadline: float, loop: asyncio.AbstractEventLoop) -> None:
        self._sweeper = sweeper
        # the running loop passed in: asyncio.get_running_loop(), and current_task() without a loop, make a
        # getpid() syscall each (CPython checks the loop's process); three a request were 44 % of the syscalls
        self._task = asyncio.current_task(loop)
        self.loop = loop
        self._watcher: asyncio.Task[None] | None = None
        self._writer: DirectBody | None = None
        self.deadline = deadline
        self.reason: str | None = None  # "disconnect", "timeout" or "shutdown" once fired

    def watch_disconnect(self, receive: Receive, writer: DirectBody | None = None) -> None:
        """Fire on client disconnect: told by the server's :class:`DirectBody` when there is one,
        otherwise by a task waiting on ASGI ``receive`` for ``http.disconnect``."""
        if writer is not None:
            self._writer = writer
            writer.on_disconnect(self._disconnected)
        else:
            self._watcher = self.loop.create_task(self._watch(receive))

    def _disconnected(self) -> None:
        self.fire("disconnect")

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
        self.deadline = self.loop.time() + timeout_s
        self._sweeper.add(self)

    def settle(self) -> None:
        """Stop watching: no later event may cancel the request's task."""
        self.reason = self.reason or "settled"
        self._sweeper.discard(self)
        if self._writer is not None:
            self._writer.on_disconnect(None)
            self._writer = None  # the writer held our bound method: no reference cycle outlives the request
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    def absorb_cancel(self) -> bool:
        """After a CancelledError: True (and the cancel undone) when this guard caused it."""
        if self.reason in ("disconnect", "timeout", "shutdown") and self._task is not None:
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
        guard = Guard(self, loop.time() + timeout_s, loop)
        self._guards.add(guard)
        return guard

    def add(self, guard: Guard) -> None:
        self._guards.add(guard)

    def discard(self, guard: Guard) -> None:
        self._guards.discard(guard)

    def __len__(self) -> int:
        return len(self._guards)

    def fire_all(self, reason: str) -> int:
        """Fire every active guard (the shutdown grace period ran out); returns how many."""
        guards, self._guards = self._guards, set()
        for guard in guards:
            guard.fire(reason)
        return len(guards)

    async def run(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                now = loop.time()
                expired = [g for g in self._guards if g.deadline <= now]
                for guard in expired:
                    self._guards.discard(guard)
                    guard.fire("timeout")
        finally:
            self._loop = None  # an app served again (tests) may run on another loop
