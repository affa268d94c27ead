"""Client-side cost of the upstream clients alone (no gateway): ``python scripts/bench_upstream_clients.py``.

Starts the fake upstream pinned to CPU 1, pins this process to CPU 0, and for each client sends 800
requests (non-streaming and 64-event streams, concurrency 1 and 32) through ``Upstream.send``, reading
each body the way the proxy does. Prints this process's CPU per request (the client's own cost plus the
event loop), the upstream's CPU per request, reads per request and requests/s. Each client runs twice,
interleaved, to show the run-to-run noise.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.bench.loadgen import free_port, wait_http
from gateway.bench.overhead import cpu_seconds
from gateway.config import Settings
from gateway.rawclient import RawUpstream
from gateway.upstream import AiohttpUpstream, Upstream

REQUESTS = 800


async def measure(client: type[AiohttpUpstream] | type[RawUpstream], url: str, upstream_pid: int,
                  stream: bool, concurrency: int) -> str:  # fmt: skip
    upstream: Upstream = client(Settings(_env_file=None))
    await upstream.start()
    body = orjson.dumps({"model": "fake-model", "stream": stream, "messages": [{"role": "user", "content": "x"}]})
    headers = {"content-type": "application/json", "x-fake-chunks": "64"}

    async def one() -> int:
        response = await upstream.send(url, body, headers)
        if not stream:
            await response.read()
            return 1
        read, reads = response.reader(), 0
        while await read():
            reads += 1
        await response.close()
        return reads

    async def worker(count: int) -> int:
        return sum([await one() for _ in range(count)])

    await asyncio.gather(*(worker(5) for _ in range(concurrency)))  # warm-up: opens the connections
    cpu, wall, up = time.process_time(), time.perf_counter(), cpu_seconds(upstream_pid)
    reads = sum(await asyncio.gather(*(worker(REQUESTS // concurrency) for _ in range(concurrency))))
    cpu, wall, up = time.process_time() - cpu, time.perf_counter() - wall, cpu_seconds(upstream_pid) - up
    await upstream.close()
    return (f"stream={stream!s:5} c={concurrency:<3} {client.__name__:16} client CPU {cpu / REQUESTS * 1e3:.3f} ms/req"
            f"  upstream CPU {up / REQUESTS * 1e3:.3f} ms/req  reads/req {reads / REQUESTS:5.1f}"
            f"  {REQUESTS / wall:6.0f} req/s")  # fmt: skip


def main() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gateway.bench.fake_upstream", "--port", str(port)])
    try:
        os.sched_setaffinity(proc.pid, {1})
        os.sched_setaffinity(0, {0})
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=30)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        for stream in (False, True):
            for concurrency in (1, 32):
                for client in (AiohttpUpstream, RawUpstream, AiohttpUpstream, RawUpstream):
                    print(uvloop.run(measure(client, url, proc.pid, stream, concurrency)), flush=True)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
