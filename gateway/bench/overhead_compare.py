"""``specgate bench overhead --compare-to REV``: this tree's gateway against another commit's, side by side.

The machine is shared and noisy, so one run alternates the two gateways (A B B A A B ...: a drift in the
neighbours' load hits both sides alike) through the same fake upstream and load generator (this tree's
apparatus for both, so only the gateway differs). The other commit is exported with ``git archive`` into a
temporary directory and its gateway runs with ``PYTHONPATH`` (and the working directory) pointing there; both
use this interpreter and its packages. Each side's figure per scenario is the median over its rounds; the
ratio column is head / base of those medians, and the range is that of the rounds' paired ratios.
"""

from __future__ import annotations

import statistics
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gateway.bench.cpu import CpuMeter
from gateway.bench.loadgen import wait_http
from gateway.bench.overhead import (
    REPO_ROOT,
    STARTUP_TIMEOUT_S,
    Result,
    Rig,
    Scenario,
    busy_warnings,
    measure,
    process,
    proxy_command,
    proxy_env,
)
from gateway.servers import free_port


@dataclass(frozen=True)
class Side:
    label: str  # "base" or "head"
    tree: Path  # the root whose `gateway` package the proxy imports


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
        side = sides[label]
        port = free_port()
        env = {**proxy_env(target, rig.upstream), "PYTHONPATH": str(side.tree)}
        if rules is not None:
            env["SPECGATE_RULES_FILE"] = str(rules.resolve())
        with process(proxy_command(target, port, rig.upstream), rig.proxy_cpu, env, cwd=side.tree) as proc:
            wait_http(f"http://127.0.0.1:{port}/v1/chat/completions", STARTUP_TIMEOUT_S, method="POST")
            meter = CpuMeter(rig.layout, rig.upstream_pid, proc.pid)
            results[label] += [measure(label, f"http://127.0.0.1:{port}", meter, s) for s in plan]
        console.print(f"  run {i + 1}/{2 * rounds}: {label}")
    return results


def render_compare(results: dict[str, list[Result]], base_rev: str, console: Console) -> None:
    table = Table(title=f"gateway CPU per request: this tree (head) vs {base_rev} (base), medians over rounds")
    for column in ("scenario", "base ms/req", "head ms/req", "head/base", "round ratios", "base req/s",
                   "head req/s", "errors"):  # fmt: skip
        table.add_column(column, justify="left" if column == "scenario" else "right")
    base, head = results["base"], results["head"]
    for scenario in dict.fromkeys(r.scenario for r in base):
        b = [r for r in base if r.scenario == scenario]
        h = [r for r in head if r.scenario == scenario]
        b_cpu, h_cpu = _cpu(b), _cpu(h)
        paired = [hc / bc for bc, hc in zip(b_cpu, h_cpu, strict=False) if bc > 0]
        b_med, h_med = statistics.median(b_cpu), statistics.median(h_cpu)
        table.add_row(
            scenario, f"{b_med:.3f}", f"{h_med:.3f}", f"{h_med / b_med:.2f}",
            f"{min(paired):.2f}-{max(paired):.2f}" if paired else "",
            f"{statistics.median(r.rps for r in b):.0f}", f"{statistics.median(r.rps for r in h):.0f}",
            str(sum(r.errors for r in b + h)),
        )  # fmt: skip
    console.print(table)
    for warning in busy_warnings([*base, *head]):
        console.print(f"[yellow]{warning}[/]")


def _cpu(results: Sequence[Result]) -> list[float]:
    return [r.cpu_ms_per_request for r in results if r.cpu_ms_per_request is not None]
