"""``specgate bench overhead``: what the gateway costs on the request path, measured side by side.

One run starts a fast fake upstream, then for each target (the upstream called directly, a minimal aiohttp
proxy, and the gateway with each upstream client) drives the same scenarios through it: non-streaming and
streaming requests at several concurrencies, unpaced and paced (the upstream waits between chunks, as an
engine does). It reports requests/s, latency and time-to-first-byte percentiles, what each adds over calling
the upstream directly, and the CPU the proxy process spent per request (from /proc, so noise from other
processes does not count). Proxies are pinned to CPU 0, the load generator and the upstream to the others.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import orjson
from rich.console import Console
from rich.table import Table

from gateway.bench.loadgen import percentile, wait_http
from gateway.servers import free_port


@dataclass(frozen=True)
class Scenario:
    name: str
    stream: bool
    concurrency: int
    chunks: int
    interval_s: float
    requests: int


@dataclass
class Result:
    target: str
    scenario: str
    requests: int
    errors: int
    rps: float
    p50_ms: float
    p99_ms: float
    ttfb_p50_ms: float
    ttfb_p99_ms: float
    cpu_ms_per_request: float | None


def scenarios(scale: float, concurrency: Sequence[int]) -> list[Scenario]:
    def n(count: int) -> int:
        return max(20, int(count * scale))

    out: list[Scenario] = []
    for c in concurrency:
        out.append(Scenario(f"non-stream c{c}", False, c, 16, 0.0, n(600 if c == 1 else 3000)))
        out.append(Scenario(f"stream 64 chunks c{c}", True, c, 64, 0.0, n(300 if c == 1 else 1500)))
        if c > 1:
            out.append(Scenario(f"paced stream 64x20ms c{c}", True, c, 64, 0.02, max(c, n(c * 3))))
    return out


STARTUP_TIMEOUT_S = 90.0  # generous: a loaded 2-core machine can take long to start Python processes
TARGETS = (
    "direct", "minimal-aiohttp-proxy", "specgate", "specgate/aiohttp", "specgate/httpx", "specgate/httpx-aiohttp"
)  # fmt: skip


@contextmanager
def process(args: list[str], cpu: set[int] | None) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if cpu:
            os.sched_setaffinity(proc.pid, cpu)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proxy_command(target: str, port: int, upstream: str) -> list[str]:
    py = sys.executable
    if target == "minimal-aiohttp-proxy":
        return [py, "-m", "gateway.bench.minimal_proxy", "--port", str(port), "--upstream", upstream]
    client = {"specgate": "auto", "specgate/aiohttp": "aiohttp", "specgate/httpx": "httpx",
              "specgate/httpx-aiohttp": "httpx-aiohttp"}[target]  # fmt: skip
    return [py, "-m", "gateway.cli", "serve", "--standard", upstream, "--speculative", upstream,
            "--port", str(port), "--upstream-client", client]  # fmt: skip


async def drive(
    session: aiohttp.ClientSession, url: str, scenario: Scenario
) -> tuple[list[float], list[float], int, float]:
    """Send ``scenario.requests`` requests with ``concurrency`` workers; return latencies, TTFBs, errors, wall."""
    body = orjson.dumps(
        {"model": "fake-model", "stream": scenario.stream, "max_tokens": scenario.chunks,
         "messages": [{"role": "user", "content": "Tell me about the sea."}]}
    )  # fmt: skip
    headers = {"content-type": "application/json", "x-fake-chunks": str(scenario.chunks),
               "x-fake-interval": str(scenario.interval_s)}  # fmt: skip
    latencies: list[float] = []
    ttfbs: list[float] = []
    errors = 0
    remaining = scenario.requests

    async def worker() -> None:
        nonlocal remaining, errors
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as resp:
                first = await resp.content.readany()
                ttfb = time.perf_counter() - start
                while await resp.content.readany():
                    pass
                if resp.status != 200 or not first:
                    errors += 1
            latencies.append(time.perf_counter() - start)
            ttfbs.append(ttfb)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(scenario.concurrency)))
    return latencies, ttfbs, errors, time.perf_counter() - started


async def _measure(target: str, url: str, pid: int | None, scenario: Scenario) -> Result:
    warmup = Scenario(scenario.name, scenario.stream, scenario.concurrency, scenario.chunks, 0.0,
                      max(40, scenario.concurrency))  # fmt: skip
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await drive(session, url, warmup)  # also opens every connection the scenario will use
        cpu_before = cpu_seconds(pid) if pid else 0.0
        latencies, ttfbs, errors, wall = await drive(session, url, scenario)
        cpu = (cpu_seconds(pid) - cpu_before) if pid else None
    return Result(
        target=target, scenario=scenario.name, requests=len(latencies), errors=errors,
        rps=len(latencies) / wall, p50_ms=percentile(latencies, 50) * 1e3, p99_ms=percentile(latencies, 99) * 1e3,
        ttfb_p50_ms=percentile(ttfbs, 50) * 1e3, ttfb_p99_ms=percentile(ttfbs, 99) * 1e3,
        cpu_ms_per_request=None if cpu is None else cpu * 1e3 / len(latencies),
    )  # fmt: skip


def measure(target: str, url: str, pid: int | None, scenario: Scenario) -> Result:
    return asyncio.run(_measure(target, url, pid, scenario))


def run(targets: Sequence[str], plan: Sequence[Scenario], console: Console) -> list[Result]:
    cpus = sorted(os.sched_getaffinity(0))
    proxy_cpu = {cpus[0]} if len(cpus) > 1 else None
    rest = set(cpus[1:]) if len(cpus) > 1 else None
    if rest:
        os.sched_setaffinity(0, rest)
    try:
        return _run_targets(targets, plan, console, proxy_cpu, rest)
    finally:
        os.sched_setaffinity(0, set(cpus))


def _run_targets(
    targets: Sequence[str],
    plan: Sequence[Scenario],
    console: Console,
    proxy_cpu: set[int] | None,
    rest: set[int] | None,
) -> list[Result]:
    upstream_port = free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    results: list[Result] = []
    upstream_cmd = [sys.executable, "-m", "gateway.bench.fake_upstream", "--port", str(upstream_port)]
    with process(upstream_cmd, rest):
        wait_http(upstream + "/health", timeout_s=STARTUP_TIMEOUT_S)
        for target in targets:
            if target == "direct":
                results += [measure(target, upstream, None, s) for s in plan]
                console.print(f"  measured {target}")
                continue
            port = free_port()
            with process(proxy_command(target, port, upstream), proxy_cpu) as proc:
                wait_http(f"http://127.0.0.1:{port}/v1/chat/completions", STARTUP_TIMEOUT_S, method="POST")
                results += [measure(target, f"http://127.0.0.1:{port}", proc.pid, s) for s in plan]
            console.print(f"  measured {target}")
    return results


def render(results: Sequence[Result], console: Console) -> None:
    direct = {r.scenario: r for r in results if r.target == "direct"}
    for scenario in dict.fromkeys(r.scenario for r in results):
        base = direct.get(scenario)
        table = Table(title=f"gateway overhead: {scenario} (fake upstream, this machine)")
        for column in ("target", "req/s", "vs direct", "p50 ms", "+p50", "p99 ms", "+p99", "TTFB p50",
                       "+TTFB p50", "+TTFB p99", "CPU ms/req", "errors"):  # fmt: skip
            table.add_column(column, justify="right" if column != "target" else "left")
        for r in (r for r in results if r.scenario == scenario):
            ref = None if r.target == "direct" else base
            table.add_row(
                r.target, f"{r.rps:.0f}", f"{r.rps / base.rps:.2f}x" if base else "",
                f"{r.p50_ms:.2f}", _delta(r, ref, "p50_ms"), f"{r.p99_ms:.2f}", _delta(r, ref, "p99_ms"),
                f"{r.ttfb_p50_ms:.2f}", _delta(r, ref, "ttfb_p50_ms"), _delta(r, ref, "ttfb_p99_ms"),
                "" if r.cpu_ms_per_request is None else f"{r.cpu_ms_per_request:.3f}", str(r.errors),
            )  # fmt: skip
        console.print(table)


def _delta(result: Result, ref: Result | None, field: str) -> str:
    if ref is None:
        return ""
    return f"{getattr(result, field) - getattr(ref, field):+.2f}"


def main(targets: Sequence[str], concurrency: Sequence[int], scale: float, json_out: Path | None) -> int:
    console = Console(width=160)
    plan = scenarios(scale, concurrency)
    console.print(f"[bold]specgate bench overhead[/]: {len(targets)} targets x {len(plan)} scenarios")
    results = run(targets, plan, console)
    render(results, console)
    if json_out is not None:
        json_out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 1 if any(r.errors for r in results) else 0
