"""``bench compare`` pieces that need no server: statistics, counters, workload reading, table/JSON/plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from gateway.bench.compare import (
    BenchItem,
    CategoryResult,
    PoolStats,
    RequestResult,
    category_requests,
    percentile,
    spec_counters,
)
from gateway.bench.compare_report import print_table, write_json, write_plot
from gateway.cli_bench_compare import WorkloadFileError, load_items

DATA = Path(__file__).parent / "data"


def test_spec_counters_from_real_vllm_metrics() -> None:
    assert spec_counters((DATA / "ngram-metrics-excerpt.txt").read_text()) == (701.0, 1262.0)
    assert spec_counters((DATA / "plain-metrics-excerpt.txt").read_text()) is None


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
