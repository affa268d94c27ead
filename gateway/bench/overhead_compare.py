"""``specgate bench overhead --compare-to REV``: this tree's gateway against another commit's, side by side.

The machine is shared and noisy, so one run alternates the two gateways (A B B A A B ...: a drift in the
neighbours' load hits both sides alike) through the same fake upstream and load generator (this tree's
apparatus for both, so only the gateway differs). The other commit is exported with ``git archive`` into a
temporary directory and its gateway runs with ``PYTHONPATH`` (and the working directory) pointing there; both
use this interpreter and its packages. Each side's figure per scenario is the median over its rounds; the
ratio column is head / base of those medians, and the range is that of the rounds' paired ratios.

``--paired`` runs the two gateways at the same time instead, on the same CPU, each driven by the same
scenario through the same upstream over the same seconds (:func:`run_paired`): whatever the machine does in
those seconds (a neighbour's job, a slower clock, the cache both share) it does to both, so a round's
ratio moves by a few percent where the alternating rounds' moved by tens. What it measures is each
gateway's CPU per request while it shares its CPU with the other one (both are slower than alone: they
evict each other's caches), so the absolute figures are not those of a gateway alone; the ratio is.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import uvloop
from rich.console import Console
from rich.table import Table

from gateway.bench.cpu import CpuMeter, cpu_seconds
from gateway.bench.lean_client import LeanClient, Measurement
from gateway.bench.loadgen import wait_http
from gateway.bench.overhead import (
    REPO_ROOT,
    REQUEST_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    Result,
    Rig,
    Scenario,
    busy_warnings,
    drive,
    measure,
    process,
    proxy_command,
    proxy_env,
    result_of,
    scenario_request,
    warmup_of,
)
from gateway.servers import free_port


@dataclass(frozen=True)
class Side:
    label: str  # "base" or "head"
    tree: Path  # the root whose `gateway` package the proxy imports
    target: str | None = None  # the gateway target this side runs (None: the one the comparison names)


@contextmanager
def exported(rev: str) -> Iterator[Path]:
    """``rev``'s files (``git archive``) in a temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="specgate-base-") as tmp:
        archive = Path(tmp) / "tree.tar"
        with archive.open("wb") as out:
            subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", rev], stdout=out, check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(Path(tmp) / "tree", filter="data")
        yield Path(tmp) / "tree"


def order(rounds: int) -> list[str]:
    """base head, head base, base head, ...: each side goes first as often as the other."""
    out: list[str] = []
    for i in range(rounds):
        out += ["base", "head"] if i % 2 == 0 else ["head", "base"]
    return out


def run_compare(
    target: str,
    plan: Sequence[Scenario],
    sides: dict[str, Side],
    rounds: int,
    rig: Rig,
    rules: Path | None,
    console: Console,
) -> dict[str, list[Result]]:
    """Every scenario through ``target`` of each side, ``rounds`` times, alternating; results per side."""
    results: dict[str, list[Result]] = {label: [] for label in sides}
    for i, label in enumerate(order(rounds)):
        with gateway(sides[label], target, rig, rules) as (url, pid):
            meter = CpuMeter(rig.layout, rig.upstream_pid, pid)
            results[label] += [measure(label, url, meter, s) for s in plan]
        console.print(f"  run {i + 1}/{2 * rounds}: {label}")
    return results


@contextmanager
def gateway(side: Side, target: str, rig: Rig, rules: Path | None) -> Iterator[tuple[str, int]]:
    """``side``'s gateway (its own ``target``, else ``target``) on the proxy CPU, ready: (URL, pid)."""
    name = side.target or target
    port = free_port()
    env = {**proxy_env(name, rig.upstream), "PYTHONPATH": str(side.tree)}
    if rules is not None:
        env["SPECGATE_RULES_FILE"] = str(rules.resolve())
    with process(proxy_command(name, port, rig.upstream), rig.proxy_cpu, env, cwd=side.tree) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/v1/chat/completions", STARTUP_TIMEOUT_S, method="POST")
        yield url, proc.pid


PAIRED_MIN_S = 3.0  # seconds of load per scenario and round in a paired run (at --scale 1)


def paired_seconds(scenario: Scenario, scale: float) -> float:
    """How long a paired round drives a scenario: long enough for every worker to finish several requests."""
    per_request = scenario.chunks * scenario.interval_s
    return max(PAIRED_MIN_S * scale, 4 * per_request, 0.5)


def run_paired(
    target: str,
    plan: Sequence[Scenario],
    sides: dict[str, Side],
    rounds: int,
    rig: Rig,
    rules: Path | None,
    console: Console,
    scale: float = 1.0,
) -> dict[str, list[Result]]:
    """Every scenario through both sides' gateways at once (each side's ``target``, else ``target``),
    ``rounds`` times; results per side."""
    results: dict[str, list[Result]] = {label: [] for label in sides}
    for i in range(rounds):
        with ExitStack() as stack:
            urls, pids = {}, {}
            for label, side in sides.items():
                urls[label], pids[label] = stack.enter_context(gateway(side, target, rig, rules))
            for scenario in plan:
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    measured = runner.run(_paired(scenario, urls, pids, paired_seconds(scenario, scale)))
                for label, result in measured.items():
                    results[label].append(result)
        console.print(f"  round {i + 1}/{rounds}: both sides at once")
    return results


async def _paired(
    scenario: Scenario, urls: dict[str, str], pids: dict[str, int], seconds: float
) -> dict[str, Result]:  # fmt: skip
    clients = {label: LeanClient(url, timeout_s=REQUEST_TIMEOUT_S) for label, url in urls.items()}
    warmup = warmup_of(scenario)
    try:
        await asyncio.gather(*(drive(client, warmup) for client in clients.values()))
        runs = {label: Measurement() for label in clients}
        request = scenario_request(scenario)
        stagger = scenario.chunks * scenario.interval_s
        started = {label: cpu_seconds(pid) for label, pid in pids.items()}
        await asyncio.gather(*(
            client.run_for(client.request(*request), seconds, scenario.concurrency, runs[label], stagger,
                           scenario.interval_s)
            for label, client in clients.items()
        ))  # fmt: skip
        spent = {label: cpu_seconds(pid) - started[label] for label, pid in pids.items()}
    finally:
        for client in clients.values():
            client.close()
    return {label: result_of(label, scenario, run, spent[label]) for label, run in runs.items()}


def render_compare(
    results: dict[str, list[Result]], base_rev: str, console: Console, paired: bool = False,
    head_name: str = "this tree",
) -> None:  # fmt: skip
    how = "both at once on one CPU (paired)" if paired else "medians over rounds"
    table = Table(title=f"gateway CPU per request: {head_name} (head) vs {base_rev} (base), {how}")
    for column in ("scenario", "base ms/req", "head ms/req", "head/base", "round ratios", "base req/s",
                   "head req/s", "errors"):  # fmt: skip
        table.add_column(column, justify="left" if column == "scenario" else "right")
    base, head = results["base"], results["head"]
    for scenario in dict.fromkeys(r.scenario for r in base):
        b = [r for r in base if r.scenario == scenario]
        h = [r for r in head if r.scenario == scenario]
        b_cpu, h_cpu = _cpu(b), _cpu(h)
        ratios = [hc / bc for bc, hc in zip(b_cpu, h_cpu, strict=False) if bc > 0]
        b_med, h_med = statistics.median(b_cpu), statistics.median(h_cpu)
        table.add_row(
            scenario, f"{b_med:.3f}", f"{h_med:.3f}", f"{h_med / b_med:.2f}",
            f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "",
            f"{statistics.median(r.rps for r in b):.0f}", f"{statistics.median(r.rps for r in h):.0f}",
            str(sum(r.errors for r in b + h)),
        )  # fmt: skip
    console.print(table)
    for warning in busy_warnings([*base, *head]):
        console.print(f"[yellow]{warning}[/]")


def _cpu(results: Sequence[Result]) -> list[float]:
    return [r.cpu_ms_per_request for r in results if r.cpu_ms_per_request is not None]
