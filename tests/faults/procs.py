"""Real processes for the fault tests: fake or emulated replicas and ``specgate serve``, plus an asyncio load
driver.

Every process listens on 127.0.0.1 and is stopped (SIGCONT first, then SIGTERM, then SIGKILL) when the
test ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from gateway.servers import free_port
from tests.signals.servers import ManagedProcess, wait_until

REPO = Path(__file__).resolve().parents[2]
MODEL = "fake-model"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECGATE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


class Proc(ManagedProcess):
    """A ManagedProcess started with our environment, which a test may also SIGKILL."""

    env: dict[str, str] | None = None
    admin_token: str | None = None  # a gateway's: /ready names its replicas only with it once keys are set

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        try:
            wait_until(self.ready, self.ready_timeout_s, f"{self.argv[2:4]} on port {self.port}")
        except TimeoutError:
            self.stop()
            raise

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def fake_replica(workdir: Path, name: str, port: int | None = None) -> Proc:
    port = port or free_port()
    argv = [sys.executable, "-m", "gateway.bench.fake_upstream", "--port", str(port), "--name", name]
    proc = Proc(argv=argv, port=port, log=workdir / f"replica-{name}.log", ready_timeout_s=30.0)
    proc.env = _env()
    return proc


def emulator_replica(workdir: Path, name: str, speculative: bool, speed: float, port: int | None = None) -> Proc:
    """``specgate emulate`` (EMULATED vLLM) serving ``MODEL``, ``speed`` times faster than its profile."""
    port = port or free_port()
    argv = [sys.executable, "-m", "gateway.cli", "emulate", "--speculative" if speculative else "--standard"]
    argv += ["--port", str(port), "--speed", str(speed), "--served-model-name", MODEL]
    proc = Proc(argv=argv, port=port, log=workdir / f"emulator-{name}.log", ready_timeout_s=30.0)
    proc.env = _env()
    return proc


def gateway_proc(workdir: Path, standard: list[str], speculative: list[str], **settings: Any) -> Proc:
    port = free_port()
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    argv += ["--standard", ",".join(standard), "--speculative", ",".join(speculative)]
    values = {"health_interval_s": 0.5, "health_timeout_s": 1.0, "snapshot_interval_s": 0.1, **settings}
    extra = {f"SPECGATE_{k.upper()}": str(v) for k, v in values.items()}
    proc = Proc(argv=argv, port=port, log=workdir / "gateway.log", ready_timeout_s=60.0)
    proc.env = _env(extra)
    proc.admin_token = settings.get("admin_token")
    return proc


@contextlib.contextmanager
def running(*procs: Proc) -> Iterator[None]:
    try:
        for proc in procs:
            proc.start()
        yield
    finally:
        for proc in procs:
            proc.stop()


def ready(gateway: Proc) -> dict[str, Any]:
    token = gateway.admin_token
    headers = {"authorization": f"Bearer {token}"} if token else None
    response = httpx.get(f"{gateway.url}/ready", timeout=10, headers=headers)
    body: dict[str, Any] = response.json()
    body["status"] = response.status_code
    return body


def replica_state(gateway: Proc, url: str) -> dict[str, Any]:
    return next(r for r in ready(gateway)["replicas"] if r["url"] == url)


def wait_ready(gateway: Proc, timeout_s: float = 30.0) -> None:
    def all_up() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            body = ready(gateway)
            return bool(body["status"] == 200 and all(r["healthy"] for r in body["replicas"]))
        return False

    wait_until(all_up, timeout_s, "the gateway with every replica healthy", interval_s=0.2)


def metric(gateway: Proc, name: str, **labels: str) -> float:
    """Sum of every sample of ``name`` (with these ``labels``) on the gateway's /metrics."""
    total = 0.0
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    for line in httpx.get(f"{gateway.url}/metrics", timeout=10).text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and all(w in line for w in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- load --------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    stream: bool
    started: float
    status: int = 0
    head_at: float | None = None  # first byte (the gateway sends the head with the first chunk)
    ended: float = 0.0
    done: bool = False  # a stream's `data: [DONE]`, or a whole non-stream body
    error_event: bool = False  # a stream ended with `data: {"error": ...}`
    served_by: str | None = None
    reason: str = ""
    exception: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and self.exception is None and not self.error_event


@dataclass
class Load:
    """Workers each send requests back to back until ``stop`` is set; every outcome is kept."""

    url: str
    workers: int
    stream_share: float = 0.5
    headers: dict[str, str] = field(default_factory=dict)
    stream_headers: dict[str, str] = field(default_factory=dict)
    plain_headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0
    outcomes: list[Outcome] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            streams = round(self.workers * self.stream_share)
            await asyncio.gather(*(self._worker(session, i < streams) for i in range(self.workers)))

    async def _worker(self, session: aiohttp.ClientSession, stream: bool) -> None:
        while not self.stop.is_set():
            outcome = Outcome(stream=stream, started=time.monotonic())
            self.outcomes.append(outcome)
            try:
                await self._one(session, outcome)
            except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
                outcome.exception = f"{type(exc).__name__}: {exc}"
            outcome.ended = time.monotonic()

    async def _one(self, session: aiohttp.ClientSession, outcome: Outcome) -> None:
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        headers = {**self.headers, **(self.stream_headers if outcome.stream else self.plain_headers)}
        if outcome.stream:
            body["stream"] = True
        async with session.post(f"{self.url}/v1/chat/completions", json=body, headers=headers) as response:
            outcome.head_at = time.monotonic()
            outcome.status = response.status
            outcome.reason = response.headers.get("x-specgate-reason", "")
            if not outcome.stream:
                data = await response.json()
                outcome.served_by = data.get("served_by")
                outcome.done = response.status == 200
                return
            last = b""
            async for line in response.content:
                if line.startswith(b"data: "):
                    last = line.strip()
            outcome.done = last == b"data: [DONE]"
            outcome.error_event = last.startswith(b'data: {"error"')


def summary(outcomes: list[Outcome]) -> str:
    failed = [o for o in outcomes if not o.ok]
    kinds: dict[str, int] = {}
    for o in failed:
        key = "error-event" if o.error_event else o.exception or f"status {o.status} done={o.done}"
        kinds[key[:80]] = kinds.get(key[:80], 0) + 1
    return f"{len(outcomes)} requests, {len(failed)} not ok: {kinds}"
