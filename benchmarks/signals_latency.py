"""Request-path latency through the gateway while Prometheus and Redis are healthy, slow, or down.

    python -m benchmarks.signals_latency [--requests 200] [--rounds 6]

Starts real redis-server and prometheus processes (Debian packages; see scripts/setup/10-services.sh), two
fake upstream pools and the gateway (uvicorn in a thread), then sends sequential chat requests through the
gateway in each condition, round after round, and prints one table:

- ``no signals``: a gateway without Prometheus or Redis configured (the reference);
- ``healthy``: both up; the gateway polls Prometheus and syncs with Redis in the background;
- ``slow``: both SIGSTOPped: connections are accepted by the kernel but never answered, the worst kind of
  slow (every poll runs into its timeout);
- ``down``: both stopped: connections are refused.

The claim under test: the request path never waits on Redis or Prometheus, so latency does not grow.
Client, gateway and upstreams share one machine (and the client shares a process with the gateway), so
absolute figures include that; compare the rows.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.config import Settings
from gateway.servers import ThreadServer
from gateway.signals.shared_qps import SharedQps
from gateway.signals.store import MemorySharedState
from tests.signals.harness import CHAT, Upstreams, fake_pools, gateway_settings, prometheus_config_for
from tests.signals.servers import PrometheusServer, RedisServer, prometheus_server, redis_server


def measure(client: httpx.Client, url: str, count: int) -> tuple[list[float], int]:
    latencies, failures = [], 0
    for _ in range(count):
        started = time.perf_counter()
        response = client.post(f"{url}/v1/chat/completions", json=CHAT)
        latencies.append(time.perf_counter() - started)
        failures += response.status_code != 200
    return latencies, failures


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def stopped_at_exit(*servers: RedisServer | PrometheusServer) -> Iterator[None]:
    try:
        yield
    finally:
        for server in servers:
            server.stop()


def conditions(redis: RedisServer, prom: PrometheusServer) -> dict[str, Callable[[], None]]:
    def healthy() -> None:
        for server in (redis, prom):
            if server.proc is None:
                server.start()
            server.resume()

    def slow() -> None:
        healthy()
        redis.pause()
        prom.pause()

    def down() -> None:
        redis.stop()
        prom.stop()

    return {"healthy": healthy, "slow": slow, "down": down}


def hot_path_cost() -> float:
    """ns per ``SharedQps.record`` call, the only thing the request path adds for shared QPS."""
    counter = SharedQps(MemorySharedState())
    now = time.time()
    runs = 200_000
    return timeit.timeit(lambda: counter.record(now), number=runs) / runs * 1e9


def run(requests: int, rounds: int, settle_s: float) -> None:
    results: dict[str, list[float]] = {}
    failures: dict[str, int] = {}
    sources: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory() as tmp, fake_pools() as pools, httpx.Client(timeout=10) as client:
        workdir = Path(tmp)
        for sub in ("plain", "signals", "redis", "prometheus"):
            (workdir / sub).mkdir()
        redis = redis_server(workdir / "redis")
        prom = prometheus_server(workdir / "prometheus", config="")
        plain = ThreadServer(create_app(bench_settings(workdir / "plain", pools), CollectorRegistry()))
        settings = bench_settings(workdir / "signals", pools, redis_url=redis.url, prometheus_url=prom.url)
        signal_gateway = ThreadServer(create_app(settings, CollectorRegistry()))
        prom.configure(prometheus_config_for(signal_gateway.port))
        redis.start()
        prom.start()
        with stopped_at_exit(redis, prom), plain, signal_gateway:
            measure(client, plain.url, 200)  # warm-up
            measure(client, signal_gateway.url, 200)
            for round_no in range(rounds):
                # Short blocks, interleaved round after round, so that noise from other work on the machine
                # spreads over every condition alike.
                collect("no signals", client, plain.url, requests, results, failures, sources)
                for name, enter in conditions(redis, prom).items():
                    enter()
                    time.sleep(settle_s)  # let the pollers notice
                    collect(name, client, signal_gateway.url, requests, results, failures, sources)
                conditions(redis, prom)["healthy"]()
                time.sleep(3 * settle_s)  # Prometheus's start-up burns CPU: not inside a measured block
                print(f"round {round_no + 1}/{rounds} done", flush=True)
    print_table(results, failures, sources, requests, rounds)


def bench_settings(workdir: Path, pools: Upstreams, **overrides: object) -> Settings:
    return gateway_settings(workdir, pools, prometheus_qps_query="sum(rate(specgate_requests_total[5s]))", **overrides)


def collect(
    name: str,
    client: httpx.Client,
    url: str,
    requests: int,
    results: dict[str, list[float]],
    failures: dict[str, int],
    sources: dict[str, set[str]],
) -> None:
    latencies, failed = measure(client, url, requests)
    results.setdefault(name, []).extend(latencies)
    failures[name] = failures.get(name, 0) + failed
    explain = client.post(f"{url}/v1/route/explain", json=CHAT).json()
    sources.setdefault(name, set()).add(explain["snapshot"]["qps_source"])


def print_table(
    results: dict[str, list[float]], failures: dict[str, int], sources: dict[str, set[str]], n: int, rounds: int
) -> None:
    print(f"\nrequest latency through the gateway, {n} sequential requests x {rounds} rounds per condition (ms)")
    print(
        f"{'condition':<12} {'n':>5} {'failed':>6} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} {'mean':>7}  qps source"
    )
    for name, values in results.items():
        ms = [v * 1e3 for v in values]
        row = (percentile(ms, 0.5), percentile(ms, 0.9), percentile(ms, 0.99), max(ms), statistics.fmean(ms))
        cells = " ".join(f"{v:7.2f}" for v in row)
        print(f"{name:<12} {len(ms):>5} {failures[name]:>6} {cells}  {','.join(sorted(sources[name]))}")
    print(f"\nhot-path cost of SharedQps.record: {hot_path_cost():.0f} ns per request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="requests per condition per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--settle", type=float, default=1.0, help="seconds between a change and measuring")
    args = parser.parse_args()
    run(args.requests, args.rounds, args.settle)


if __name__ == "__main__":
    main()
