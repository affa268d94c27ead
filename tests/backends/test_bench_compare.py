"""``bench compare`` pieces that need no server: statistics, counters, workload reading, table/JSON/plot."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from aiohttp import test_utils, web
from rich.console import Console

from gateway.bench.compare import (
    BenchItem,
    CategoryResult,
    CompareConfig,
    PoolStats,
    RequestResult,
    category_requests,
    compare,
    percentile,
)
from gateway.bench.compare_report import print_table, write_json, write_plot
from gateway.cli_bench_compare import WorkloadFileError, load_items


@pytest.mark.parametrize(("values", "pct", "expected"), [
    ([], 95, None), ([3.0], 95, 3.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.0), ([float(i) for i in range(1, 21)], 95, 19.0),
    ([5.0, 1.0, 3.0], 100, 5.0),
])
def test_percentile_is_nearest_rank(values: list[float], pct: float, expected: float | None) -> None:
    assert percentile(values, pct) == expected


def test_pool_stats_skip_errors_and_compute_tpot() -> None:
    results = [RequestResult(2.0, 0.2, 10), RequestResult(4.0, 0.4, 19), RequestResult(1.0, None, 0, "HTTP 500")]
    stats = PoolStats.of(results)
    assert (stats.requests, stats.errors) == (3, 1)
    assert stats.mean_latency_s == pytest.approx(3.0)
    assert stats.mean_ttft_s == pytest.approx(0.3)
    assert stats.mean_tpot_s == pytest.approx((1.8 / 9 + 3.6 / 18) / 2)
    assert RequestResult(1.0, 0.5, 1).tpot_s is None


def result(category: str, level: int, std_latency: float, spec_latency: float) -> CategoryResult:
    def stats(latency: float) -> PoolStats:
        return PoolStats.of([RequestResult(latency, 0.1, 101)])

    return CategoryResult(level, category, stats(std_latency), stats(spec_latency), 400.0, 200.0)


def test_category_result_rates_and_speedups() -> None:
    r = result("code", 1, 3.0, 2.0)
    assert r.acceptance_rate == pytest.approx(0.5)
    assert r.speedup_latency == pytest.approx(1.5)
    assert r.speedup_tpot == pytest.approx(2.9 / 1.9)
    no_drafts = CategoryResult(1, "chat", r.standard, r.speculative, 0.0, 0.0)
    assert no_drafts.acceptance_rate is None


def test_category_requests_cycle_to_fill_the_concurrency() -> None:
    items = [BenchItem(str(i), "code", ({"role": "user", "content": str(i)},), 8) for i in range(3)]
    assert [i.id for i in category_requests(items, 1)] == ["0", "1", "2"]
    assert [i.id for i in category_requests(items, 4)] == ["0", "1", "2", "0"]


def test_load_items_reads_the_workload_shape(tmp_path: Path) -> None:
    (tmp_path / "code.yaml").write_text(
        "category: code\nitems:\n"
        "  - {id: a, system: sys, user: hello, max_tokens: 64, acceptance: 0.8}\n"
        "  - {id: b, messages: [{role: user, content: hi}], max_tokens: 32}\n", encoding="utf-8")
    (tmp_path / "chat.yaml").write_text("category: chat\nitems:\n  - {id: c, user: yo, max_tokens: 16}\n",
                                        encoding="utf-8")
    items = load_items([tmp_path])
    assert [(i.category, i.id, i.max_tokens) for i in items] == [("chat", "c", 16), ("code", "a", 64),
                                                                  ("code", "b", 32)]
    assert items[1].messages == ({"role": "system", "content": "sys"}, {"role": "user", "content": "hello"})
    assert len(load_items([tmp_path], per_category=1)) == 2


@pytest.mark.parametrize(("text", "message"), [
    ("- a\n", "expected a mapping with a 'category'"),
    ("category: x\nitems: [{user: hi}]\n", "items.0: needs an integer max_tokens"),
    ("category: x\nitems: [{max_tokens: 3}]\n", "items.0: needs 'user'"),
    ("category: x\nitems: []\n", "no prompts"),
])
def test_load_items_rejects_bad_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(WorkloadFileError, match=message):
        load_items([path])


def test_table_json_and_plot(tmp_path: Path) -> None:
    results = [result("code", 1, 3.0, 2.0), result("chat", 1, 2.0, 2.5), result("code", 4, 4.0, 3.5)]
    meta = {"model": "m", "served_by": "vllm", "items": 3, "temperature": 0.0, "duration_s": 12.0}
    console = Console(record=True, width=200)
    print_table(results, meta, console)
    text = console.export_text()
    assert "1.50x" in text and "50.0%" in text and "served by vllm" in text
    write_json(tmp_path / "out.json", results, meta)
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["results"][0]["speedup_latency"] == pytest.approx(1.5)
    assert document["results"][1]["standard"]["mean_latency_s"] == pytest.approx(2.0)
    write_plot(tmp_path / "out.png", results, meta)
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class FakePool:
    """A tiny streaming OpenAI-style server; the speculative one counts drafts like vLLM's /metrics."""

    def __init__(self, speculative: bool, fail_status: int | None = None) -> None:
        self.speculative = speculative
        self.fail_status = fail_status
        self.drafted = 0
        self.accepted = 0
        self.requests = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tiny", "owned_by": "fake"}]})

    async def _metrics(self, _: web.Request) -> web.Response:
        gauges = 'vllm:num_requests_running{engine="0"} 0.0\nvllm:num_requests_waiting{engine="0"} 0.0\n'
        if not self.speculative:
            return web.Response(text=gauges)
        return web.Response(text=gauges + (
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {self.drafted}.0\n'
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {self.accepted}.0\n'))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests += 1
        if self.fail_status is not None:
            return web.json_response({"error": {"message": "nope"}}, status=self.fail_status)
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for word in ("a", "b", "c", "d"):
            chunk = {"choices": [{"index": 0, "delta": {"content": word}}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(0.002)
        usage = {"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens": 3}}
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        if self.speculative:
            self.drafted, self.accepted = self.drafted + 8, self.accepted + 6
        return response


async def serve(pool: FakePool) -> test_utils.TestServer:
    server = test_utils.TestServer(pool.app(), host="127.0.0.1")
    await server.start_server()
    return server


def items(category: str, count: int) -> list[BenchItem]:
    return [BenchItem(f"{category}{i}", category, ({"role": "user", "content": "hi"},), 500) for i in range(count)]


async def test_compare_measures_both_pools_and_acceptance_from_counter_deltas() -> None:
    standard, speculative = FakePool(speculative=False), FakePool(speculative=True)
    std_server, spec_server = await serve(standard), await serve(speculative)
    try:
        config = CompareConfig(str(std_server.make_url("")).rstrip("/"), str(spec_server.make_url("")).rstrip("/"),
                               items("code", 2) + items("chat", 3), concurrency=(1, 4), max_tokens_cap=64)
        results, meta = await compare(config)
    finally:
        await std_server.close()
        await spec_server.close()
    assert meta["model"] == "tiny" and meta["served_by"] == "fake"
    assert [(r.concurrency, r.category, r.standard.requests) for r in results] == [
        (1, "chat", 3), (1, "code", 2), (4, "chat", 4), (4, "code", 4)]
    for r in results:
        assert r.acceptance_rate == pytest.approx(0.75)
        assert r.drafted_tokens == 8 * r.speculative.requests
        assert r.standard.errors == r.speculative.errors == 0
        assert r.standard.mean_output_tokens == 4
        assert r.standard.mean_ttft_s is not None and r.standard.mean_tpot_s is not None
    assert standard.requests == speculative.requests == 1 + 3 + 2 + 4 + 4  # one warm-up each


async def test_failed_requests_are_counted_not_hidden() -> None:
    failing, speculative = FakePool(speculative=False, fail_status=503), FakePool(speculative=True)
    bad_server, spec_server = await serve(failing), await serve(speculative)
    base = str(bad_server.make_url("")).rstrip("/")
    try:
        config = CompareConfig(base, str(spec_server.make_url("")).rstrip("/"), items("code", 2), warmup=0)
        results, _ = await compare(config)
        with pytest.raises(httpx.HTTPError, match="warm-up request"):
            await compare(CompareConfig(base, config.speculative_url, items("code", 1)))
    finally:
        await bad_server.close()
        await spec_server.close()
    first = results[0]
    assert (first.standard.errors, first.standard.mean_latency_s) == (2, None)
    assert first.speculative.errors == 0
    assert first.speedup_latency is None


def test_the_shipped_workloads_are_readable_by_bench_compare() -> None:
    data = Path(__file__).resolve().parents[2] / "backends" / "workloads" / "data"
    items = load_items([data])
    categories = {item.category for item in items}
    assert {"code", "chat", "summarization", "translation"} <= categories
    assert all(item.messages[-1]["role"] == "user" and item.max_tokens > 0 for item in items)
    assert len(load_items([data], per_category=2)) == 2 * len(categories)
