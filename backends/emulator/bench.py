"""Does one emulator process keep up? Emulated step time versus wall clock at 1, 64 and 256 streams.

``python -m backends.emulator.bench [--profile a100-70b-draft] [--speed 1] [--streams 1,64,256]``

Starts ``specgate emulate`` as a child process, opens N concurrent streaming requests from this process
(aiohttp), and reads the emulator's own ``/emulator/stats``: the sum of its step durations (divided by the
speed factor: the wall time the steps should take) against the wall time the loop really spent, and how late
steps were delivered. A ratio near 1.00 means the event loop is not the bottleneck. Figures are EMULATED.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import aiohttp
from rich.console import Console
from rich.table import Table

from gateway.servers import free_port


@dataclass(frozen=True, slots=True)
class BenchRow:
    server: str
    mode: str
    streams: int
    tokens: int
    chunks: int
    client_wall_s: float
    stats: dict[str, float]


async def _one_stream(session: aiohttp.ClientSession, url: str, index: int, max_tokens: int) -> tuple[int, int]:
    body = {
        "messages": [{"role": "user", "content": f"benchmark stream {index}"}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks, tokens = 0, 0
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        async for line in response.content:
            if line.startswith(b"data: {") and b'"usage"' in line and b'"choices":[]' in line:
                tokens = int(line.split(b'"completion_tokens":')[1].split(b",")[0])
            elif line.startswith(b"data: {"):
                chunks += 1
    return chunks, tokens


async def _run_streams(url: str, streams: int, max_tokens: int) -> tuple[int, int, float]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_one_stream(session, url, i, max_tokens)) for i in range(streams)]
        wall = time.perf_counter() - started
    return sum(t.result()[0] for t in tasks), sum(t.result()[1] for t in tasks), wall


async def _stats(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/emulator/stats") as response:
        data: dict[str, float] = await response.json()
        return data


def _start(server: str, profile: str, mode: str, speed: float, port: int) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "gateway.cli",
        "emulate",
        f"--{mode}",
        "--profile",
        profile,
        "--speed",
        str(speed),
        "--port",
        str(port),
        "--server",
        server,
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


async def _wait_healthy(url: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{url}/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass  # not listening yet
            await asyncio.sleep(0.1)
    raise RuntimeError("the emulator did not start")


def measure(server: str, profile: str, mode: str, speed: float, streams: int, max_tokens: int) -> BenchRow:
    """One fresh emulator process, ``streams`` concurrent streams; the emulator's stats afterwards."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    child = _start(server, profile, mode, speed, port)
    try:
        asyncio.run(_wait_healthy(url))
        chunks, tokens, wall = asyncio.run(_run_streams(url, streams, max_tokens))
        stats = asyncio.run(_stats(url))
    finally:
        child.terminate()
        child.wait(timeout=10)
    return BenchRow(server, mode, streams, tokens, chunks, wall, stats)


def table(rows: list[BenchRow], profile: str, speed: float) -> Table:
    load = os.getloadavg()[0]
    result = Table(
        title=f"EMULATED engine loop vs wall clock: profile {profile}, speed x{speed:g}, "
        f"one emulator process (load average {load:.1f} on {os.cpu_count()} CPUs)"
    )
    for column in (
        "server",
        "mode",
        "streams",
        "max batch",
        "steps",
        "emulated s",
        "scheduled wall s",
        "actual wall s",
        "wall / scheduled",
        "mean lag ms",
        "max lag ms",
        "SSE chunks/s",
        "tokens",
    ):
        result.add_column(column, justify="left" if column in ("server", "mode") else "right")
    for row in rows:
        s = row.stats
        result.add_row(
            row.server,
            row.mode,
            str(row.streams),
            f"{s['max_batch']:.0f}",
            f"{s['steps']:.0f}",
            f"{s['emulated_s']:.2f}",
            f"{s['scheduled_wall_s']:.2f}",
            f"{s['busy_wall_s']:.2f}",
            f"{s['wall_over_scheduled']:.3f}",
            f"{1000 * s['mean_lag_s']:.2f}",
            f"{1000 * s['max_lag_s']:.1f}",
            f"{row.chunks / row.client_wall_s:.0f}",
            str(row.tokens),
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="a100-70b-draft")
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--streams", default="1,64,256")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--modes", default="standard,speculative")
    parser.add_argument("--servers", default="asgi,aiohttp", help="transports to compare")
    args = parser.parse_args(argv)
    rows = [
        measure(server, args.profile, mode, args.speed, int(n), args.max_tokens)
        for mode in args.modes.split(",")
        for n in args.streams.split(",")
        for server in args.servers.split(",")  # interleaved, so machine noise falls on both alike
    ]
    Console(width=200).print(table(rows, args.profile, args.speed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
