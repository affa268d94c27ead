"""Redis and Prometheus SIGKILLed and restarted under load, and a storm of rules reloads under load:
no request may fail. Real processes throughout (redis-server, prometheus, fake replicas, ``specgate serve``);
the load is a bounded loop of concurrent clients as fast as the machine allows. Run with ``-s`` for figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.faults.procs import Load, fake_replica, gateway_proc, metric, ready, running, summary, wait_ready
from tests.signals.harness import prometheus_config_for
from tests.signals.servers import ManagedProcess, prometheus_server, redis_server, wait_until

pytestmark = pytest.mark.slow

WORKERS = 32
# The Redis and Prometheus outage runs at the overhead benchmark's concurrency, half of it streams, under an
# API key with limits: the key's limiter syncs through Redis while it is killed (limits far above the load,
# so a refusal would be a fault, not the limit).
OUTAGE_WORKERS = 64
LOAD_KEY = "{keys: [{name: load, key: sk-load, rpm: 10000000, tpm: 1000000000, concurrency: 10000}]}"
VALID = """
version: 1
rules:
  - name: {name}
    when: {{}}
    pool: {pool}
default_pool: standard
"""
# Valid YAML whose first rule is fine and whose second is not: a reload that applied files partly would
# show `storm-partial` as the rule in effect.
INVALID = """
version: 1
rules:
  - name: storm-partial
    when: {}
    pool: standard
  - name: storm-bad
    when: {no_such_condition: 1}
    pool: standard
default_pool: standard
"""


def sigkill(server: ManagedProcess) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=10)
    server.proc = None


def write_atomically(path: Path, text: str) -> None:
    """As a ConfigMap update or an editor's save does: never a half-written file."""
    tmp = path.with_name(".tmp-" + path.name)
    tmp.write_text(text)
    os.replace(tmp, path)


def rate(load: Load) -> float:
    span = max(o.ended for o in load.outcomes) - min(o.started for o in load.outcomes)
    return len(load.outcomes) / span


@pytest.mark.redis
@pytest.mark.prometheus
def test_redis_and_prometheus_killed_and_restarted_under_load(tmp_path: Path) -> None:
    for name in ("redis", "prometheus"):
        (tmp_path / name).mkdir()
    redis = redis_server(tmp_path / "redis")
    prom = prometheus_server(tmp_path / "prometheus", config="")
    std, spec = fake_replica(tmp_path, "A"), fake_replica(tmp_path, "C")
    signals = {
        "redis_url": redis.url,
        "prometheus_url": prom.url,
        "prometheus_interval_s": 0.5,
        "prometheus_timeout_s": 0.5,
        "prometheus_warmup_s": 2.0,
        "redis_timeout_s": 0.2,
        "redis_sync_interval_s": 0.2,
        "keys": LOAD_KEY,
        "admin_token": "adm-signal-faults",  # with keys set, /ready names the replicas only to the admin token
    }
    gw = gateway_proc(tmp_path, [std.url], [spec.url], **signals)
    prom.configure(prometheus_config_for(gw.port))
    with contextlib.ExitStack() as stack:
        for server in (redis, prom):
            server.start()
            stack.callback(server.stop)
        stack.enter_context(running(std, spec, gw))
        wait_ready(gw)
        wait_until(lambda: ready(gw)["signals"]["prometheus"]["up"], 30, "Prometheus answering the gateway")
        faults: list[str] = []

        def outages() -> None:
            for action, what in (
                (lambda: sigkill(redis), "redis SIGKILL"),
                (lambda: sigkill(prom), "prometheus SIGKILL"),
                (redis.start, "redis restarted"),
                (prom.start, "prometheus restarted"),
            ):
                time.sleep(1.5)
                action()
                faults.append(f"{what} ({ready(gw)['signals']['qps']['source']})")
            wait_until(lambda: _signals_up(gw), 30, "Redis and Prometheus back in the gateway's view", 0.2)

        load = Load(gw.url, workers=OUTAGE_WORKERS, stream_share=0.5, headers={"authorization": "Bearer sk-load"})
        asyncio.run(_under(load, outages))
        print(f"\nRedis and Prometheus outages: {'; '.join(faults)}")
        print(f"  {summary(load.outcomes)} at {rate(load):.0f} req/s ({OUTAGE_WORKERS} concurrent clients)")
        assert all(o.ok for o in load.outcomes), summary(load.outcomes)
        assert len(load.outcomes) > 200 and any(o.stream for o in load.outcomes)
        assert _signals_up(gw)
        assert metric(gw, "specgate_key_requests_total") >= len(load.outcomes)  # every request under the key


def _signals_up(gw: object) -> bool:
    signals = ready(gw)["signals"]  # type: ignore[arg-type]
    return bool(signals["redis"]["up"] and signals["prometheus"]["up"])


async def _under(load: Load, faults: object) -> None:
    """Run ``load`` while ``faults()`` runs in a thread; stop the load when it returns."""
    assert callable(faults)
    task = asyncio.create_task(load.run())
    try:
        await asyncio.sleep(1.0)
        await asyncio.to_thread(faults)
        await asyncio.sleep(1.0)
    finally:
        load.stop.set()
        await asyncio.wait_for(task, timeout=90)


def test_a_storm_of_valid_and_invalid_rules_reloads_under_load(tmp_path: Path) -> None:
    rules = tmp_path / "rules" / "rules.yaml"
    rules.parent.mkdir()
    rules.write_text(VALID.format(name="storm-a", pool="standard"))
    std, spec = fake_replica(tmp_path, "A"), fake_replica(tmp_path, "C")
    gw = gateway_proc(tmp_path, [std.url], [spec.url], rules_file=rules)
    seen: dict[str, int] = {}
    writes = {"valid": 0, "invalid": 0}
    with running(std, spec, gw):
        wait_ready(gw)

        def storm() -> None:
            with httpx.Client(base_url=gw.url, timeout=10) as client:
                for i in range(40):  # every 100 ms: valid a, invalid, valid b, invalid, ...
                    valid = i % 2 == 0
                    name, pool = ("storm-a", "standard") if i % 4 == 0 else ("storm-b", "speculative")
                    write_atomically(rules, VALID.format(name=name, pool=pool) if valid else INVALID)
                    writes["valid" if valid else "invalid"] += 1
                    time.sleep(0.05)
                    rule = _rule_in_effect(client)
                    seen[rule] = seen.get(rule, 0) + 1
                    time.sleep(0.05)
                # The last write was invalid, after storm-b: storm-b must stay in effect.
                time.sleep(1.0)
                final = _rule_in_effect(client)
                seen[f"final:{final}"] = 1

        load = Load(gw.url, workers=WORKERS, stream_share=0.25)
        asyncio.run(_under(load, storm))
        ok = metric(gw, 'specgate_rule_reloads_total{result="ok"}')
        rejected = metric(gw, 'specgate_rule_reloads_total{result="rejected"}')
    print(f"\nrules storm: writes {writes}; reloads ok {ok:.0f}, rejected {rejected:.0f}; rules seen {seen}")
    print(f"  {summary(load.outcomes)} at {rate(load):.0f} req/s")
    assert all(o.ok for o in load.outcomes), summary(load.outcomes)
    assert set(seen) <= {"storm-a", "storm-b", "final:storm-b"}, seen
    assert seen.get("final:storm-b") == 1
    assert ok > 0 and rejected > 0


def _rule_in_effect(client: httpx.Client) -> str:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    response = client.post("/v1/route/explain", json=body)
    response.raise_for_status()
    return str(response.json()["decision"]["rule"])
