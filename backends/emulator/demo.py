"""``specgate demo``: two emulated vLLM pools and the real gateway on loopback, driven with the mixed workload.

Each load level runs four phases on the same arrival schedule: every request pinned to the standard pool,
every request pinned to the speculative pool (the gateway's ``x-specgate-pool`` header rule), every request
routed by the reference rules (a second gateway, ``gateway/rules-reference.yaml``), and every request routed
by the shipped adaptive policy (``fastest``), which learns from all the traffic it carries, the pinned
phases included, as it would in a deployment. All latencies are measured by the client through the gateways,
and the figures are EMULATED (cpu-smollm2 profile at a speed factor; see :data:`FULL`).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

import httpx
from rich.console import Console
from rich.progress import Progress, TaskID

from backends.workloads.loader import Workload, WorkloadItem
from gateway.rules import reference_rules_path
from gateway.servers import free_port

PHASES = ("standard", "speculative", "rules", "adaptive")
ROUTED = ("rules", "adaptive")


@dataclass(frozen=True, slots=True)
class LoadLevel:
    name: str
    qps: float  # wall-clock requests per second, as the gateway sees them
    requests: int
    # Arrivals in the first seconds load the pools but are not reported: the gateway's QPS window (one-second
    # buckets, so it looks back up to one second more than its length) is still filling with the phase's rate.
    warmup_s: float


@dataclass(frozen=True, slots=True)
class DemoPlan:
    """cpu-smollm2 because its knee is at a few concurrent requests (the CPU engine's step time doubles from
    4 to 16 streams), so speculation visibly turns from a gain into a loss at a load two loopback servers and
    a client on a 2-core machine can drive; speed 5 keeps a full run near a minute."""

    profile: str
    speed: float
    levels: tuple[LoadLevel, ...]
    # The gateway's QPS window. Its default 10 s would span several phases of a sped-up run; a few seconds
    # follow the phases and are still long enough that 25 QPS reads as more than the rules' 20.
    qps_window_s: float = 4.0
    seed: int = 0


FULL = DemoPlan("cpu-smollm2", 5.0, (LoadLevel("low", 2.0, 25, 0.0), LoadLevel("high", 25.0, 200, 4.5)))
QUICK = DemoPlan(
    "cpu-smollm2", 8.0, (LoadLevel("low", 4.0, 8, 0.0), LoadLevel("high", 25.0, 80, 2.2)), qps_window_s=2.0
)


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    item: WorkloadItem


@dataclass(frozen=True, slots=True)
class Sample:
    level: str
    phase: str
    arrival: Arrival
    status: int
    latency_s: float
    pool: str
    task: str
    reason: str


def schedule(workload: Workload, level: LoadLevel, seed: int) -> list[Arrival]:
    """Poisson arrivals; categories taken in turn so every task is represented even in a short run."""
    rng = random.Random(f"{seed}:{level.name}")
    by_category: dict[str, list[WorkloadItem]] = {}
    for item in workload.items:
        by_category.setdefault(item.category, []).append(item)
    categories = sorted(by_category)
    arrivals, now = [], 0.0
    for index in range(level.requests):
        arrivals.append(Arrival(now, rng.choice(by_category[categories[index % len(categories)]])))
        now += rng.expovariate(level.qps)
    return arrivals


class Stack:
    """The three servers as child processes; ``stop`` ends every one of them (terminate, then kill)."""

    def __init__(self, plan: DemoPlan, log: IO[bytes]) -> None:
        self.plan = plan
        self._log = log
        self._children: list[subprocess.Popen[bytes]] = []
        self.ports = {
            "standard": free_port(), "speculative": free_port(), "gateway": free_port(), "gateway-rules": free_port()
        }  # fmt: skip

    @property
    def gateway_url(self) -> str:
        """The gateway with the shipped (adaptive) rules."""
        return f"http://127.0.0.1:{self.ports['gateway']}"

    @property
    def rules_gateway_url(self) -> str:
        """The gateway with the reference rules."""
        return f"http://127.0.0.1:{self.ports['gateway-rules']}"

    def start(self) -> None:
        cli = [sys.executable, "-m", "gateway.cli"]
        for mode in ("standard", "speculative"):
            self._spawn(
                [
                    *cli,
                    "emulate",
                    f"--{mode}",
                    "--profile",
                    self.plan.profile,
                    "--speed",
                    str(self.plan.speed),
                    "--port",
                    str(self.ports[mode]),
                ],
                {},
            )
        urls = {mode: f"http://127.0.0.1:{self.ports[mode]}" for mode in ("standard", "speculative")}
        env = {
            "SPECGATE_QPS_WINDOW_S": str(self.plan.qps_window_s),
            "SPECGATE_HEALTH_INTERVAL_S": "0.5",
            "SPECGATE_LOG_LEVEL": "warning",
        }
        serve = [*cli, "serve", "--standard", urls["standard"], "--speculative", urls["speculative"]]
        self._spawn([*serve, "--port", str(self.ports["gateway"])], env)
        rules = [*serve, "--rules", str(reference_rules_path()), "--port", str(self.ports["gateway-rules"])]
        self._spawn(rules, env)

    def _spawn(self, argv: list[str], env: dict[str, str]) -> None:
        child_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self._children.append(
            subprocess.Popen(
                argv,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=child_env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(child.poll() is not None for child in self._children):
                raise RuntimeError("a demo server exited during start-up")
            if self._ready():
                return
            time.sleep(0.1)
        raise RuntimeError("the demo servers did not become ready in time")

    def _ready(self) -> bool:
        for url in (self.gateway_url, self.rules_gateway_url):
            try:
                response = httpx.get(f"{url}/ready", timeout=1.0)
            except httpx.HTTPError:
                return False
            pools = response.json().get("pools", {}) if response.status_code == 200 else {}
            if not all(pools.get(name, {}).get("healthy", 0) >= 1 for name in ("standard", "speculative")):
                return False
        return True

    def stop(self) -> None:
        for child in self._children:
            if child.poll() is None:
                child.terminate()
        for child in self._children:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=5)
        self._children.clear()


@contextmanager
def running_stack(plan: DemoPlan) -> Iterator[Stack]:
    with tempfile.TemporaryFile() as log:
        stack = Stack(plan, log)
        try:
            stack.start()
            try:
                stack.wait_ready()
            except RuntimeError as exc:
                log.seek(0)
                raise RuntimeError(f"{exc}; server output:\n{log.read().decode(errors='replace')[-3000:]}") from exc
            yield stack
        finally:
            stack.stop()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Stop on SIGTERM the way Ctrl-C stops (KeyboardInterrupt), so the servers are always shut down."""

    def _raise(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


async def drive(stack: Stack, model: str, plan: DemoPlan, workload: Workload, progress: Progress) -> list[Sample]:
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with (
        httpx.AsyncClient(base_url=stack.gateway_url, timeout=120.0, limits=limits) as adaptive,
        httpx.AsyncClient(base_url=stack.rules_gateway_url, timeout=120.0, limits=limits) as rules,
    ):
        for level in plan.levels:
            arrivals = schedule(workload, level, plan.seed)
            for phase in PHASES:
                task = progress.add_task(f"{level.name} load {level.qps:g} QPS, {phase}", total=len(arrivals))
                client = rules if phase == "rules" else adaptive
                phase_samples = await _run_phase(client, model, level, phase, arrivals, progress, task)
                samples.extend(s for s in phase_samples if s.arrival.at_s >= level.warmup_s)
    return samples


async def _run_phase(
    client: httpx.AsyncClient,
    model: str,
    level: LoadLevel,
    phase: str,
    arrivals: list[Arrival],
    progress: Progress,
    task: TaskID,
) -> list[Sample]:
    headers = {} if phase in ROUTED else {"x-specgate-pool": phase}
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(arrival: Arrival) -> Sample:
        await asyncio.sleep(max(0.0, start + arrival.at_s - loop.time()))
        sent = time.perf_counter()
        try:
            response = await client.post("/v1/chat/completions", json=arrival.item.request_body(model), headers=headers)
        except httpx.HTTPError as exc:  # counted as a failed request (status 0) and reported
            progress.advance(task)
            return Sample(level.name, phase, arrival, 0, time.perf_counter() - sent, "?", "?", type(exc).__name__)
        latency = time.perf_counter() - sent
        progress.advance(task)
        h = response.headers
        pool, task_name, reason = (
            h.get(name, "?") for name in ("x-specgate-pool", "x-specgate-task", "x-specgate-reason")
        )
        return Sample(level.name, phase, arrival, response.status_code, latency, pool, task_name, reason)

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(arrival)) for arrival in arrivals]
    return [t.result() for t in tasks]


@dataclass(frozen=True, slots=True)
class DemoOutcome:
    exit_code: int
    samples: list[Sample]
    ports: dict[str, int]
    learned_after: int | None = None  # requests the adaptive gateway took in before its model decided


def run_demo(plan: DemoPlan, console: Console, plot: Path | None = None) -> DemoOutcome:
    """Start the stack, drive every load level, print the tables; the servers stop on any exit path."""
    from backends.emulator.demo_report import demo_table, plot_demo
    from backends.emulator.profiles import load_profile
    from backends.workloads.loader import load_workload

    model = load_profile(plan.profile).model_name
    console.print(
        f"specgate demo: EMULATED vLLM pools (profile {plan.profile}, x{plan.speed:g} speed) "
        "behind the gateway on 127.0.0.1; no GPU needed"
    )
    ports: dict[str, int] = {}
    learned_after: int | None = None
    try:
        with sigterm_as_interrupt(), running_stack(plan) as stack, Progress(console=console) as progress:
            ports = stack.ports
            console.print(
                f"servers ready: gateway {stack.gateway_url} (standard emulator :{ports['standard']}, "
                f"speculative emulator :{ports['speculative']})"
            )
            samples = asyncio.run(drive(stack, model, plan, load_workload(), progress))
            learned_after = httpx.get(f"{stack.gateway_url}/v1/route/model", timeout=5).json().get("warm_after")
    except KeyboardInterrupt:
        console.print("specgate demo: interrupted; all demo servers stopped")
        return DemoOutcome(130, [], ports)
    except RuntimeError as exc:
        console.print(f"specgate demo: {exc}")
        return DemoOutcome(1, [], ports)
    for level in plan.levels:
        console.print(demo_table(samples, level, plan))
    console.print(
        "adaptive: the learned model decided after "
        + (f"{learned_after} finished requests" if learned_after is not None else "more requests than this run had")
        + " (the pinned phases teach it too; before that the reference rules decide: its warm-up)"
    )
    if plot is not None:
        plot_demo(plot, samples, plan)
        console.print(f"wrote {plot} (EMULATED)")
    failed = [s for s in samples if s.status != 200]
    if failed:
        first = failed[0]
        console.print(f"specgate demo: {len(failed)} requests failed (first: status {first.status}, {first.reason})")
    return DemoOutcome(1 if failed else 0, samples, ports, learned_after)
