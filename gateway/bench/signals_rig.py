"""Two fake upstream pools and gateway settings whose decisions switch on QPS alone: the rig of the signals
tests (tests/signals) and of ``specgate bench signals``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.bench.fake_upstream import FakeUpstream
from gateway.config import Settings
from gateway.servers import ThreadServer

# Decisions switch on QPS alone: above the threshold the standard pool, else the speculative one.
QPS_THRESHOLD = 5.0
RULES_YAML = f"""
version: 1
rules:
  - name: high-load
    when: {{qps: {{gt: {QPS_THRESHOLD}}}}}
    pool: standard
default_pool: speculative
"""

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


@dataclass
class Upstreams:
    standard: ThreadServer
    speculative: ThreadServer


@contextlib.contextmanager
def fake_pools() -> Iterator[Upstreams]:
    with (
        ThreadServer(FakeUpstream(name="standard").app()) as standard,
        ThreadServer(FakeUpstream(name="speculative").app()) as speculative,
    ):
        yield Upstreams(standard, speculative)


def gateway_settings(tmp_path: Path, pools: Upstreams, **overrides: Any) -> Settings:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES_YAML)
    values: dict[str, Any] = dict(
        rules_file=rules,
        reload_rules=False,
        standard_urls=[pools.standard.url],
        speculative_urls=[pools.speculative.url],
        health_interval_s=0.5,
        snapshot_interval_s=0.1,
        qps_window_s=3.0,
        engine_metrics_interval_s=0.5,
        prometheus_interval_s=0.5,
        prometheus_timeout_s=0.5,
        prometheus_stale_after_s=2.0,
        prometheus_warmup_s=5.0,  # the tests' QPS query range
        redis_timeout_s=0.2,
        redis_sync_interval_s=0.2,
    )
    values.update(overrides)
    return Settings(**values)


def prometheus_config_for(gateway_port: int, scrape_interval: str = "1s") -> str:
    return f"""
global:
  scrape_interval: {scrape_interval}
  evaluation_interval: {scrape_interval}
scrape_configs:
  - job_name: specgate
    static_configs:
      - targets: ["127.0.0.1:{gateway_port}"]
"""
