"""``specgate bench limits``: how closely per-key limits hold when two gateway replicas share them.

Two in-process gateways share one key's limits through a real ``redis-server`` (started here, on loopback) and
forward to the fake upstream. Client tasks split over both gateways offer far more than the key allows, for a
fixed time, from a fresh key (so its buckets start full), and the benchmark counts what was admitted:

- ``rpm``: admitted requests against what the limit allows in the run, ``rpm + rpm/60 x seconds`` (a full
  bucket, then its refill);
- ``tpm``: tokens charged against ``tpm + tpm/60 x seconds``; a request is charged its estimate
  (prompt + ``max_tokens``) at admission and corrected to its ``usage`` when it ends, so with answers shorter
  than ``max_tokens`` more requests fit than the estimate alone would allow;
- ``concurrency``: the most requests the upstream held at once after the first second, against the limit
  (each replica sees the others' in-flight counts once per sync), with the first second's most (before the
  replicas have heard of each other, each may fill the limit alone) and the time-weighted mean over the run;
- ``rpm, Redis down``: the same two gateways with no store: each replica keeps the limit alone (the fallback),
  so twice the limit is admitted, and no request fails.

Overshoot is bounded by design (gateway/limits.py): between two syncs a replica may admit what the shared
bucket refilled for everyone. Run with ``--sync`` to see the effect of the sync interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from gateway.app import create_app
from gateway.bench.fake_upstream import FakeUpstream
from gateway.bench.services import redis_server, running
from gateway.config import Settings
from gateway.servers import ThreadServer

KEY = "sk-bench-limits"
PROMPT = [{"role": "user", "content": "hello there"}]


@dataclass
class Scenario:
    name: str
    limit: str  # rpm | tpm | concurrency
    value: int
    shared: bool = True  # through Redis; False: each replica alone
    max_tokens: int = 8
    answer_tokens: int = 8  # what the fake upstream actually generates (usage)
    delay_s: float = 0.0  # upstream time per request


@dataclass
class Outcome:
    scenario: Scenario
    seconds: float
    offered: int = 0
    admitted: int = 0
    limited: int = 0
    failed: int = 0  # anything but 200 and 429
    tokens: int = 0  # usage.total_tokens of the admitted
    max_inflight: int = 0  # after the first second
    first_max_inflight: int = 0  # in the first second (before the replicas have heard of each other)
    mean_inflight: float = 0.0
    replicas: int = 2
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def allowed(self) -> float:
        """What the limit allows over the run, for all replicas together (or each alone without the store)."""
        s = self.scenario
        per_store = s.value if s.limit == "concurrency" else s.value + s.value / 60.0 * self.seconds
        return per_store if s.shared else per_store * self.replicas

    @property
    def measured(self) -> float:
        s = self.scenario
        if s.limit == "concurrency":
            return float(self.max_inflight)
        return float(self.tokens if s.limit == "tpm" else self.admitted)

    @property
    def accuracy(self) -> float:
        return self.measured / self.allowed


class CountingUpstream(FakeUpstream):
    """The fake upstream, with the number of completions it holds at once (and its time-weighted mean)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inflight = self.high_water = 0
        self._area = 0.0
        self._since = self._start = time.monotonic()

    def _tick(self, change: int) -> None:
        now = time.monotonic()
        self._area += self.inflight * (now - self._since)
        self._since = now
        self.inflight += change
        self.high_water = max(self.high_water, self.inflight)

    def reset(self) -> None:
        self._tick(0)
        self.high_water, self._area, self._start = self.inflight, 0.0, self._since

    def mean(self) -> float:
        self._tick(0)
        return self._area / max(1e-9, self._since - self._start)

    async def _complete(self, request: Any) -> Any:
        self._tick(+1)
        try:
            return await super()._complete(request)
        finally:
            self._tick(-1)


def keys_yaml(scenario: Scenario) -> str:
    # A fresh name per run: the shared buckets in Redis are keyed by it, and each run starts from full ones.
    return f"keys: [{{name: bench-{uuid.uuid4().hex[:8]}, key: {KEY}, {scenario.limit}: {scenario.value}}}]"


@contextlib.contextmanager
def gateways(scenario: Scenario, upstream_url: str, redis_url: str | None, sync_s: float) -> Iterator[list[str]]:
    keys = keys_yaml(scenario)
    with contextlib.ExitStack() as stack:
        urls = []
        for _ in range(2):
            settings = Settings(standard_urls=[upstream_url], speculative_urls=[upstream_url], keys=keys,
                                redis_url=redis_url, redis_sync_interval_s=sync_s, redis_timeout_s=0.2,
                                reload_rules=False, health_interval_s=5.0)  # fmt: skip
            urls.append(stack.enter_context(ThreadServer(create_app(settings))).url)
        for url in urls:  # both ready (replicas checked) before the clock starts
            deadline = time.monotonic() + 10
            while httpx.get(f"{url}/ready").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
        yield urls


def charged_tokens(urls: list[str]) -> int:
    """What the gateways charged the key's tpm (their `specgate_key_tokens_total`), both replicas together."""
    total = 0.0
    for url in urls:
        for line in httpx.get(f"{url}/metrics").text.splitlines():
            if line.startswith("specgate_key_tokens_total{") and "bench-" in line:
                total += float(line.rsplit(" ", 1)[1])
    return int(total)


async def offer(urls: list[str], scenario: Scenario, seconds: float, clients: int,
                upstream: CountingUpstream) -> Outcome:  # fmt: skip
    """``clients`` closed loops per gateway for ``seconds``; a refused request is retried after 5 ms."""
    outcome = Outcome(scenario, seconds)

    async def first_second() -> None:
        await asyncio.sleep(1.0)
        outcome.first_max_inflight = upstream.high_water
        upstream.high_water = upstream.inflight

    body = {"model": "fake-model", "messages": PROMPT, "max_tokens": scenario.max_tokens}
    headers = {"authorization": f"Bearer {KEY}", "x-fake-chunks": str(scenario.answer_tokens)}
    if scenario.delay_s:
        headers["x-fake-delay"] = str(scenario.delay_s)
    stop = time.monotonic() + seconds

    async def loop(client: httpx.AsyncClient) -> None:
        while time.monotonic() < stop:
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
            outcome.offered += 1
            outcome.statuses[response.status_code] = outcome.statuses.get(response.status_code, 0) + 1
            if response.status_code == 200:
                outcome.admitted += 1
            elif response.status_code == 429:
                outcome.limited += 1
                await asyncio.sleep(0.005)
            else:
                outcome.failed += 1

    limits = httpx.Limits(max_connections=clients)
    async with contextlib.AsyncExitStack() as stack:
        pools = [await stack.enter_async_context(httpx.AsyncClient(base_url=u, limits=limits, timeout=30))
                 for u in urls]  # fmt: skip
        await asyncio.gather(first_second(), *(loop(pool) for pool in pools for _ in range(clients)))
    return outcome


SCENARIOS = [
    Scenario("rpm, shared", "rpm", 600),
    Scenario("tpm, shared (answers 1/4 of max_tokens)", "tpm", 6000, max_tokens=64, answer_tokens=16),
    Scenario("concurrency, shared (0.2 s answers)", "concurrency", 8, delay_s=0.2),
    Scenario("rpm, Redis down (each replica alone)", "rpm", 600, shared=False),
]


def run(seconds: float, clients: int, sync_s: float, console: Console,
        scenarios: list[Scenario] = SCENARIOS) -> list[Outcome]:  # fmt: skip
    upstream = CountingUpstream(name="standard")
    with tempfile.TemporaryDirectory(prefix="specgate-limits-") as tmp:
        redis = redis_server(Path(tmp))
        with running(redis), ThreadServer(upstream.app()) as up:
            outcomes = _scenarios(upstream, up.url, redis.url, scenarios, seconds, clients, sync_s, console)
    return outcomes


def _scenarios(upstream: CountingUpstream, upstream_url: str, redis_url: str, scenarios: list[Scenario],
               seconds: float, clients: int, sync_s: float, console: Console) -> list[Outcome]:  # fmt: skip
    outcomes = []
    for scenario in scenarios:
        with gateways(scenario, upstream_url, redis_url if scenario.shared else None, sync_s) as urls:
            upstream.reset()
            console.print(f"[dim]{scenario.name}: {seconds:g} s, {clients} clients per gateway[/dim]")
            outcome = asyncio.run(offer(urls, scenario, seconds, clients, upstream))
            outcome.max_inflight, outcome.mean_inflight = upstream.high_water, upstream.mean()
            outcome.tokens = charged_tokens(urls)
            outcomes.append(outcome)
    return outcomes


def table(outcomes: list[Outcome], sync_s: float) -> Table:
    t = Table(title=f"Per-key limits, 2 gateway replicas, one key (fake upstream; Redis sync every {sync_s:g} s)")
    for column in ("scenario", "limit", "offered", "admitted", "429", "other", "measured", "allowed", "ratio"):
        t.add_column(column, justify="left" if column == "scenario" else "right")
    for o in outcomes:
        s = o.scenario
        what = {"rpm": "requests", "tpm": "tokens charged", "concurrency": "max in flight"}[s.limit]
        concurrency = s.limit == "concurrency"
        extra = f" (first second {o.first_max_inflight}; mean {o.mean_inflight:.1f})" if concurrency else ""
        t.add_row(s.name, f"{s.limit} {s.value}", str(o.offered), str(o.admitted), str(o.limited), str(o.failed),
                  f"{o.measured:g} {what}{extra}", f"{o.allowed:.0f}", f"{o.accuracy:.3f}x")  # fmt: skip
    return t


def main(seconds: float = 30.0, clients: int = 8, sync_s: float = 0.25) -> int:
    console = Console(width=max(Console().width, 140))
    outcomes = run(seconds, clients, sync_s, console)
    console.print(table(outcomes, sync_s))
    console.print("allowed: limit + limit/60 x seconds for rpm and tpm (a full bucket, then its refill); the limit "
                  "itself for concurrency; twice that with Redis down (each replica alone, by design)")
    return 1 if any(o.failed for o in outcomes) else 0
