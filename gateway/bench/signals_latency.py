"""``specgate bench signals``: request-path latency through the gateway while Prometheus and Redis are healthy,
slow, or down.

    specgate bench signals [--requests 1500] [--settle 3]

Starts real redis-server and prometheus processes (Debian packages; see scripts/setup/10-services.sh), two
fake upstream pools and four gateways (uvicorn in threads), one per condition, then sends sequential chat
requests to the four in turn (A, B, C, D, A, B, ...), so that whatever else the machine is doing falls on
every condition alike, and prints one table:

- ``no signals``: a gateway without Prometheus or Redis configured (the reference);
- ``healthy``: its own Redis and Prometheus, both up; it polls and syncs in the background;
- ``slow``: its own Redis and Prometheus, both SIGSTOPped after start: connections are accepted by the
  kernel but never answered, the worst kind of slow (every poll and sync runs into its timeout);
- ``down``: Redis and Prometheus URLs where nothing listens: connections are refused.

The claim under test: the request path never waits on Redis or Prometheus, so latency does not grow.
Client, gateways and upstreams share one process and one machine, so absolute figures include that (and
the gateways' background work is shared by all rows); compare the rows.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
import timeit
from collections.abc import Iterator
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.bench.services import ManagedProcess, PrometheusServer, RedisServer, prometheus_server, redis_server
from gateway.bench.signals_rig import CHAT, Upstreams, fake_pools, gateway_settings, prometheus_config_for
from gateway.config import Settings
from gateway.servers import ThreadServer, free_port
from gateway.signals.shared_qps import SharedQps
from gateway.signals.store import MemorySharedState

CONDITIONS = ("no signals", "healthy", "slow", "down")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def stopped_at_exit(servers: list[ManagedProcess]) -> Iterator[None]:
    try:
        yield
    finally:
        for server in servers:
            server.stop()


def hot_path_cost() -> float:
    """ns per ``SharedQps.record`` call, the only thing the request path adds for shared QPS."""
    counter = SharedQps(MemorySharedState())
    now = time.time()
    runs = 200_000
    return timeit.timeit(lambda: counter.record(now), number=runs) / runs * 1e9


def services(workdir: Path, name: str) -> tuple[RedisServer, PrometheusServer]:
    (workdir / f"{name}-redis").mkdir()
    (workdir / f"{name}-prometheus").mkdir()
    return redis_server(workdir / f"{name}-redis"), prometheus_server(workdir / f"{name}-prometheus", config="")


def build_gateways(workdir: Path, pools: Upstreams) -> tuple[dict[str, ThreadServer], list[ManagedProcess]]:
    gateways: dict[str, ThreadServer] = {}
    processes: list[ManagedProcess] = []
    for name in CONDITIONS:
        sub = workdir / name.replace(" ", "-")
        sub.mkdir()
        overrides: dict[str, object] = {}
        redis = prom = None
        if name in ("healthy", "slow"):
            redis, prom = services(workdir, name)
            overrides = {"redis_url": redis.url, "prometheus_url": prom.url}
        elif name == "down":
            overrides = {
                "redis_url": f"redis://127.0.0.1:{free_port()}/0",
                "prometheus_url": f"http://127.0.0.1:{free_port()}",
            }
        gateways[name] = ThreadServer(create_app(bench_settings(sub, pools, **overrides), CollectorRegistry()))
        if redis is not None and prom is not None:
            prom.configure(prometheus_config_for(gateways[name].port))
            processes += [redis, prom]
    return gateways, processes


def run(requests: int, settle_s: float) -> dict[str, int]:
    """Measure and print the table; returns the failed requests per condition."""
    latencies: dict[str, list[float]] = {name: [] for name in CONDITIONS}
    failures = dict.fromkeys(CONDITIONS, 0)
    with tempfile.TemporaryDirectory() as tmp, fake_pools() as pools, httpx.Client(timeout=10) as client:
        gateways, processes = build_gateways(Path(tmp), pools)
        with contextlib.ExitStack() as stack:
            stack.enter_context(stopped_at_exit(processes))
            for server in processes:
                server.start()
            for gateway in gateways.values():
                stack.enter_context(gateway)
            for server in processes[2:]:  # the "slow" condition's Redis and Prometheus
                server.pause()
            time.sleep(settle_s)
            for _ in range(100):  # warm-up
                for gateway in gateways.values():
                    client.post(f"{gateway.url}/v1/chat/completions", json=CHAT)
            for _ in range(requests):
                for name, gateway in gateways.items():
                    started = time.perf_counter()
                    response = client.post(f"{gateway.url}/v1/chat/completions", json=CHAT)
                    latencies[name].append(time.perf_counter() - started)
                    failures[name] += response.status_code != 200
            details = {name: explain_status(client, gw.url) for name, gw in gateways.items()}
    print_table(latencies, failures, details, requests)
    return failures


def explain_status(client: httpx.Client, url: str) -> str:
    signals = client.get(f"{url}/ready").json()["signals"]
    up = [f"{k}={'up' if signals[k]['up'] else 'down'}" for k in ("redis", "prometheus") if signals[k] is not None]
    return f"qps from {signals['qps']['source']}" + (f" ({', '.join(up)})" if up else "")


def bench_settings(workdir: Path, pools: Upstreams, **overrides: object) -> Settings:
    return gateway_settings(
        workdir, pools, prometheus_qps_query="sum(rate(specgate_routed_requests_total[5s]))", **overrides
    )


def print_table(
    latencies: dict[str, list[float]], failures: dict[str, int], details: dict[str, str], requests: int
) -> None:
    print(f"\nrequest latency through the gateway (ms), {requests} sequential requests per condition, interleaved")
    print(f"{'condition':<11} {'n':>5} {'failed':>6} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} {'mean':>7}  signals")
    for name, values in latencies.items():
        ms = [v * 1e3 for v in values]
        row = (percentile(ms, 0.5), percentile(ms, 0.9), percentile(ms, 0.99), max(ms), statistics.fmean(ms))
        cells = " ".join(f"{v:7.2f}" for v in row)
        print(f"{name:<11} {len(ms):>5} {failures[name]:>6} {cells}  {details[name]}")
    print(f"\nhot-path cost of SharedQps.record: {hot_path_cost():.0f} ns per request")


def main(requests: int, settle_s: float) -> int:
    """Run the benchmark; exit status 1 when a request failed in a condition where none may (all of them)."""
    failures = run(requests, settle_s)
    return 1 if any(failures.values()) else 0
