"""Two gateway replicas over HTTP, one real Redis, in front of the same two emulated pools (EMULATED,
cpu-smollm2 profile, sped up): under steady load the share each second sends to the speculative pool settles
instead of swinging. Each replica sees its own requests at once and the other's only in the engines' stats,
a scrape late, which is where herding would come from: both read the same "faster" pool and send it
everything, then both swing back."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from backends.emulator.report import split_per_second
from gateway.app import SpecgateApp, create_app
from gateway.config import Settings
from gateway.servers import ThreadServer
from tests.adaptive.test_adaptive_http import ITEMS, adaptive_rules, emulated
from tests.conftest import wait_for
from tests.signals.conftest import private_redis  # noqa: F401  (the fixture)
from tests.signals.servers import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.redis]
PER_GATEWAY = 5  # closed-loop clients per gateway: ten on the pools, past this profile's knee (see test_adaptive_http)


@pytest.fixture
def replicas(private_redis: RedisServer, tmp_path: Path) -> Iterator[tuple[list[str], list[SpecgateApp]]]:  # noqa: F811
    with emulated("cpu-smollm2", 4.0) as (_, standard, speculative):
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            standard_urls=[standard], speculative_urls=[speculative], rules_file=adaptive_rules(tmp_path),
            reload_rules=False, health_interval_s=0.2, snapshot_interval_s=0.05, engine_metrics_interval_s=0.5,
            redis_url=private_redis.url, model_sync_interval_s=0.25, redis_timeout_s=0.2,
        )  # fmt: skip
        apps = [create_app(settings, CollectorRegistry()) for _ in range(2)]
        with ThreadServer(apps[0]) as a, ThreadServer(apps[1]) as b:
            for app in apps:
                wait_for(lambda app=app: app.state.health_rounds > 0, what="first health check")  # type: ignore[misc]
            yield [a.url, b.url], apps


def drive(urls: list[str], seconds: float) -> list[tuple[float, int, str]]:
    """``PER_GATEWAY`` closed-loop clients on each gateway for ``seconds``: (sent at, gateway, pool) of each."""
    outcomes: list[tuple[float, int, str]] = []
    lock = threading.Lock()
    start = time.monotonic()

    def client(gateway: int, worker: int) -> None:
        with httpx.Client(base_url=urls[gateway], timeout=60) as http:
            i = worker
            while (sent := time.monotonic() - start) < seconds:
                item = ITEMS[i % len(ITEMS)]
                response = http.post("/v1/chat/completions", json={**item.request_body("smollm2"), "max_tokens": 64})
                assert response.status_code == 200, response.text
                with lock:
                    outcomes.append((sent, gateway, response.headers["x-specgate-pool"]))
                i += PER_GATEWAY * len(urls)

    workers = [(g, g * PER_GATEWAY + w) for g in range(len(urls)) for w in range(PER_GATEWAY)]
    with ThreadPoolExecutor(len(workers)) as pool:
        for future in [pool.submit(client, g, w) for g, w in workers]:
            future.result()
    return sorted(outcomes)


def test_two_replicas_split_the_load_and_the_split_settles(replicas: tuple[list[str], list[SpecgateApp]]) -> None:
    urls, apps = replicas
    drive(urls, 6.0)  # both learn (and teach each other through Redis)
    assert [app.state.snapshot.gateways for app in apps] == [2, 2]  # each counts the other, through Redis
    outcomes = [o for o in drive(urls, 16.0) if o[0] >= 2.0]
    shares = [share for _, share in split_per_second((sent, pool) for sent, _, pool in outcomes)]  # both gateways
    by_gateway = [[pool == "speculative" for _, g, pool in outcomes if g == gateway] for gateway in (0, 1)]
    print(f"\nspeculative share per second, both gateways: {' '.join(f'{s:.2f}' for s in shares)}; "
          f"per gateway {', '.join(f'{sum(v) / len(v):.0%} of {len(v)}' for v in by_gateway)}; "
          f"sd {statistics.pstdev(shares):.2f}")  # fmt: skip
    assert len(shares) >= 10
    # A split: both pools used by each gateway (past the knee neither pool alone is fastest for everything).
    assert all(0.1 < sum(v) / len(v) < 0.9 for v in by_gateway)
    # Settled, not herding: herding would send whole seconds to one pool and then the other (a spread near 0.5).
    # At 10-25 requests a second a steady split of ~0.4 already spreads ~0.1-0.15 by chance.
    assert statistics.pstdev(shares) < 0.25
    assert sum(share in (0.0, 1.0) for share in shares) <= 1
