"""EnginePoller: per-replica and per-pool stats from /metrics scrapes; failed scrapes are stale, not zero."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from gateway.errors import UpstreamConnectError
from gateway.metrics import HistogramSeries
from gateway.signals.engine_poller import EnginePoller, ScrapeTarget


def metrics_text(running: float, waiting: float, kv: float, spec: tuple[float, float, float] | None) -> str:
    lines = [
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}',
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}',
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}',
    ]
    if spec is not None:
        drafts, draft_tokens, accepted = spec
        lines += [
            f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}',
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}',
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}',
        ]
    return "\n".join(lines) + "\n"


class FakeEngines:
    """Serves a settable /metrics text per host; a host set to None refuses the connection."""

    def __init__(self) -> None:
        self.texts: dict[str, str | None] = {}

    async def fetch(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """The poller's GET (gateway.upstream.Fetch), answered from ``texts``."""
        text = self.texts.get(urlsplit(url).hostname or "")
        if text is None:
            raise UpstreamConnectError(f"cannot reach upstream {url}: connection refused")
        return 200, text.encode()


async def busy(url: str, timeout_s: float) -> tuple[int, bytes]:
    return 503, b"busy"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


SPEC_A = ScrapeTarget("speculative", "http://spec-a:8000")
SPEC_B = ScrapeTarget("speculative", "http://spec-b:8000/")
STD_A = ScrapeTarget("standard", "http://std-a:8000")


@pytest.fixture
def engines() -> FakeEngines:
    return FakeEngines()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def poller(engines: FakeEngines, clock: Clock) -> EnginePoller:
    return EnginePoller(engines.fetch, lambda: [SPEC_A, SPEC_B, STD_A], window_s=10, stale_after_s=3, clock=clock)


async def test_pool_sums_queues_averages_kv_and_weights_acceptance(
    poller: EnginePoller, engines: FakeEngines, clock: Clock
) -> None:
    engines.texts = {
        "spec-a": metrics_text(2, 1, 0.2, (0, 0, 0)),
        "spec-b": metrics_text(3, 0, 0.4, (100, 400, 400)),
        "std-a": metrics_text(5, 7, 0.9, None),
    }
    await poller.scrape_once()
    clock.now += 1
    engines.texts["spec-a"] = metrics_text(2, 1, 0.2, (10, 40, 20))  # 20/40 accepted, 2 per draft
    engines.texts["spec-b"] = metrics_text(3, 0, 0.4, (130, 520, 460))  # 60/120 accepted
    await poller.scrape_once()
    spec = poller.pool_stats("speculative")
    assert (spec.running, spec.waiting, spec.fresh_replicas, spec.stale_replicas) == (5, 1, 2, 0)
    assert spec.kv_cache_usage == pytest.approx(0.3)
    assert spec.acceptance_rate == pytest.approx(80 / 160)
    assert spec.acceptance_length == pytest.approx(1 + 80 / 40)
    std = poller.pool_stats("standard")
    assert (std.running, std.waiting, std.kv_cache_usage, std.acceptance_rate) == (5, 7, 0.9, None)


async def test_failed_scrape_is_stale_not_zero(poller: EnginePoller, engines: FakeEngines, clock: Clock) -> None:
    engines.texts = {"spec-a": metrics_text(4, 2, 0.5, None), "spec-b": metrics_text(1, 9, 0.1, None)}
    await poller.scrape_once()
    engines.texts["spec-b"] = None
    clock.now += 1
    await poller.scrape_once()
    spec = poller.pool_stats("speculative")
    assert (spec.running, spec.waiting, spec.fresh_replicas, spec.stale_replicas) == (4, 2, 1, 1)
    by_host = {view.target.base_url: view for view in poller.replicas()}
    stale = by_host[SPEC_B.base_url]
    assert not stale.fresh and stale.error is not None and "ConnectError" in stale.error
    assert stale.stats is not None and stale.stats.waiting == 9  # last good values kept for inspection
    engines.texts["spec-a"] = "<html>oops</html>"
    await poller.scrape_once()
    gone = poller.pool_stats("speculative")
    assert (gone.running, gone.waiting, gone.kv_cache_usage, gone.fresh_replicas) == (None, None, None, 0)
    assert poller.pool_stats("standard").stale_replicas == 1  # std-a never answered


async def test_an_old_scrape_turns_stale(poller: EnginePoller, engines: FakeEngines, clock: Clock) -> None:
    engines.texts = {"std-a": metrics_text(1, 1, 0.1, None)}
    await poller.scrape_once()
    assert poller.pool_stats("standard").fresh_replicas == 1
    clock.now += 5  # no scrape for longer than stale_after_s
    assert poller.pool_stats("standard").fresh_replicas == 0


async def test_http_error_status_marks_stale(clock: Clock) -> None:
    poller = EnginePoller(busy, lambda: [STD_A], clock=clock)
    await poller.scrape_once()
    [view] = poller.replicas()
    assert view.error is not None and "503" in view.error


async def test_each_page_parse_is_timed_and_a_failed_fetch_is_not(engines: FakeEngines, clock: Clock) -> None:
    engines.texts = {"std-a": metrics_text(1, 0, 0.1, None), "spec-a": metrics_text(2, 1, 0.2, (10, 30, 100))}
    timing = HistogramSeries((0.001, 0.01))
    poller = EnginePoller(engines.fetch, lambda: [STD_A, SPEC_A], clock=clock, timing=timing)
    await poller.scrape_once()
    assert sum(timing.counts) == 2 and timing.sum > 0  # one parse per replica's page
    timing_failed = HistogramSeries((0.001,))
    await EnginePoller(busy, lambda: [STD_A], clock=clock, timing=timing_failed).scrape_once()
    assert sum(timing_failed.counts) == 0


async def test_removed_targets_are_forgotten(engines: FakeEngines, clock: Clock) -> None:
    targets = [STD_A, SPEC_A]
    poller = EnginePoller(engines.fetch, lambda: targets, clock=clock)
    await poller.scrape_once()
    targets.remove(SPEC_A)
    await poller.scrape_once()
    assert [v.target for v in poller.replicas()] == [STD_A]


async def test_the_own_requests_the_engines_count_are_those_in_flight_as_the_scrape_ran(
    engines: FakeEngines, clock: Clock
) -> None:
    """The engines' running + waiting already hold this gateway's requests that were in flight when they were
    read: ``inflight_base`` is that count (fresh replicas only), so the decision adds what was sent since and
    drops what finished since. One of spec-a's requests ends during the exchange: the larger count is kept."""
    inflight = {SPEC_A: 2, SPEC_B: 1, STD_A: 0}

    async def fetch(url: str, timeout_s: float) -> tuple[int, bytes]:
        if urlsplit(url).hostname == "spec-a":
            inflight[SPEC_A] -= 1
        return await engines.fetch(url, timeout_s)

    engines.texts = {"spec-a": metrics_text(2, 0, 0.1, None), "spec-b": None, "std-a": metrics_text(0, 0, 0, None)}
    poller = EnginePoller(fetch, lambda: [SPEC_A, SPEC_B, STD_A], clock=clock, inflight=inflight.__getitem__)
    await poller.scrape_once()
    inflight[SPEC_A] = 0  # both finished after the scrape
    assert poller.pool_stats("speculative").inflight_base == 2  # spec-b refused: its request is not in it
    assert poller.pool_stats("standard").inflight_base == 0
    inflight[SPEC_A] = 5
    await poller.scrape_once()
    assert poller.pool_stats("speculative").inflight_base == 5
