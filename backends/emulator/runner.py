"""Drives an :class:`Engine` in scaled real time and hands each request its tokens as steps finish.

One asyncio task (owned by the server's lifespan) runs the loop: take a step, sleep until the step's
scheduled end (``duration / speed`` after the previous one), deliver. Deadlines accumulate, so when the event
loop falls behind the emulated clock the lag is visible in :class:`RunnerStats` rather than hidden.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from backends.emulator.metrics import EmulatorMetrics
from backends.emulator.timing import Emission, Engine, EngineRequest, StepOutcome


@dataclass(eq=False, slots=True)
class Ticket:
    """A request's place in the engine: its tokens arrive on ``queue``; ``None`` means aborted."""

    request: EngineRequest
    queue: asyncio.Queue[Emission | None]
    submitted_at: float
    last_at: float
    first: bool = True


@dataclass(slots=True)
class RunnerStats:
    """How well the loop keeps to the emulated clock (wall seconds unless named emulated)."""

    steps: int = 0
    emulated_s: float = 0.0  # sum of step durations in emulated seconds
    scheduled_wall_s: float = 0.0  # the same, divided by the speed factor
    busy_wall_s: float = 0.0  # wall time the loop actually spent in busy periods
    max_lag_s: float = 0.0  # worst delay of a step's delivery past its scheduled end
    lag_sum_s: float = 0.0
    max_batch: int = 0

    def as_dict(self) -> dict[str, float]:
        mean_lag = self.lag_sum_s / self.steps if self.steps else 0.0
        ratio = self.busy_wall_s / self.scheduled_wall_s if self.scheduled_wall_s else 1.0
        return {
            "steps": self.steps,
            "emulated_s": self.emulated_s,
            "scheduled_wall_s": self.scheduled_wall_s,
            "busy_wall_s": self.busy_wall_s,
            "wall_over_scheduled": ratio,
            "mean_lag_s": mean_lag,
            "max_lag_s": self.max_lag_s,
            "max_batch": self.max_batch,
        }


@dataclass(eq=False)
class EngineRunner:
    engine: Engine
    metrics: EmulatorMetrics
    speed: float = 1.0
    stats: RunnerStats = field(default_factory=RunnerStats)

    def __post_init__(self) -> None:
        self._tickets: dict[EngineRequest, Ticket] = {}
        self._work = asyncio.Event()

    def submit(self, request: EngineRequest) -> Ticket:
        now = asyncio.get_running_loop().time()
        self.engine.add(request)
        ticket = Ticket(request, asyncio.Queue(), submitted_at=now, last_at=now)
        self._tickets[request] = ticket
        self._work.set()
        return ticket

    def abort(self, ticket: Ticket) -> None:
        if self._tickets.pop(ticket.request, None) is None:
            return
        self.engine.abort(ticket.request)
        now = asyncio.get_running_loop().time()
        self.metrics.finished("abort", (now - ticket.submitted_at) * self.speed)
        ticket.queue.put_nowait(None)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._work.wait()
            busy_start = deadline = loop.time()
            while self.engine.has_work:
                outcome = self.engine.step()
                deadline += outcome.duration_s / self.speed
                delay = deadline - loop.time()
                await asyncio.sleep(max(delay, 0.0))
                now = loop.time()
                self._record(outcome, lag=now - deadline)
                self._deliver(outcome, now)
            self.stats.busy_wall_s += loop.time() - busy_start
            self._work.clear()

    def _record(self, outcome: StepOutcome, lag: float) -> None:
        stats = self.stats
        stats.steps += 1
        stats.emulated_s += outcome.duration_s
        stats.scheduled_wall_s += outcome.duration_s / self.speed
        stats.lag_sum_s += max(lag, 0.0)
        stats.max_lag_s = max(stats.max_lag_s, lag)
        stats.max_batch = max(stats.max_batch, len(outcome.emissions))
        engine = self.engine
        self.metrics.update_engine(engine.counters, engine.num_running, engine.num_waiting, engine.kv_usage)

    def _deliver(self, outcome: StepOutcome, now: float) -> None:
        for emission in outcome.emissions:
            ticket = self._tickets.get(emission.request)
            if ticket is None:
                continue
            self.metrics.emitted(emission, (now - ticket.last_at) * self.speed, ticket.first)
            ticket.first = False
            ticket.last_at = now
            ticket.queue.put_nowait(emission)
            if emission.finished:
                del self._tickets[emission.request]
                self.metrics.finished(emission.request.finish_reason, (now - ticket.submitted_at) * self.speed)
