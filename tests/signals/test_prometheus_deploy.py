"""deploy/prometheus/: promtool checks the config and rules and runs the alert unit tests."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.signals._paths import REPO_ROOT
from tests.signals.servers import require_binary

PROM_DIR = REPO_ROOT / "deploy" / "prometheus"

pytestmark = pytest.mark.prometheus


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = require_binary("promtool")
    return subprocess.run([binary, *args], cwd=PROM_DIR, capture_output=True, text=True, timeout=60, check=False)


def test_check_config() -> None:
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_rules() -> None:
    result = promtool("check", "rules", "rules/recording.yml", "rules/alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_unit_tests() -> None:
    tests = sorted(str(p.relative_to(PROM_DIR)) for p in (PROM_DIR / "tests").glob("*.yml"))
    assert tests, "no promtool unit tests found"
    result = promtool("test", "rules", *tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test() -> None:
    alerts = {
        rule["alert"]
        for group in yaml.safe_load((PROM_DIR / "rules" / "alerts.yml").read_text())["groups"]
        for rule in group["rules"]
    }
    tested = {
        case["alertname"]
        for path in (PROM_DIR / "tests").glob("*.yml")
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    }
    assert alerts <= tested, f"alerts without a promtool test: {sorted(alerts - tested)}"


def test_scrape_config_covers_gateway_and_both_pools() -> None:
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    targets = {
        target: entry.get("labels", {}).get("pool")
        for job in config["scrape_configs"]
        for entry in job["static_configs"]
        for target in entry["targets"]
    }
    assert "gateway:8080" in targets
    for pool in ("standard", "speculative"):
        assert targets[f"vllm-{pool}:8000"] == pool
        assert targets[f"emulator-{pool}:8000"] == pool
