"""Per-request guards: a fired guard cancels its request's task and says why; made without looking up the loop."""

from __future__ import annotations

import asyncio

import pytest

from gateway.guard import Sweeper


async def test_a_guard_past_its_deadline_cancels_its_task_and_says_why() -> None:
    sweeper = Sweeper(interval_s=0.01)
    running = asyncio.create_task(sweeper.run())
    await asyncio.sleep(0)
    seen: list[str | None] = []

    async def request() -> None:
        guard = sweeper.guard(0.03)
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            seen.append(guard.reason)
            assert guard.absorb_cancel()

    await asyncio.wait_for(request(), 2)
    assert seen == ["timeout"] and len(sweeper) == 0
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)


async def test_a_running_sweeper_makes_guards_without_looking_up_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """``asyncio.get_running_loop()`` and ``asyncio.current_task()`` without a loop each make a getpid()
    syscall: the sweeper passes its loop to every guard it makes."""
    sweeper = Sweeper(interval_s=10)
    running = asyncio.create_task(sweeper.run())
    await asyncio.sleep(0)
    loop, this = asyncio.get_running_loop(), asyncio.current_task()
    asked: list[object] = []
    real_current = asyncio.current_task

    def current(given: asyncio.AbstractEventLoop | None = None) -> asyncio.Task[object] | None:
        asked.append(given)
        return real_current(given)

    monkeypatch.setattr(asyncio, "get_running_loop", lambda: asked.append("get_running_loop"))
    monkeypatch.setattr(asyncio, "current_task", current)
    guard = sweeper.guard(5)
    guard.rearm(5)
    monkeypatch.undo()
    assert asked == [loop] and guard.loop is loop
    guard.fire("disconnect")  # the guard holds this task: firing cancels it
    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(0)
    assert guard.absorb_cancel() and this is not None and this.cancelling() == 0
    guard.settle()
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert sweeper._loop is None  # stopped: a later guard looks the loop up again (an app served on another loop)
