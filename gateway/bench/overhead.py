"""``specgate bench overhead``: what the gateway costs on the request path, measured side by side.

One run starts a lean fake upstream (:mod:`gateway.bench.lean_upstream`), then for each target (the upstream
called directly, a minimal aiohttp proxy, and the gateway with each upstream client) drives the same scenarios
through it with a lean load generator (:mod:`gateway.bench.lean_client`): non-streaming and streaming requests
at several concurrencies, unpaced and paced (the upstream's shared ticker sends each stream's next event every
interval, as an engine's decode step does). It reports requests/s, latency and time-to-first-byte percentiles,
what each adds over calling the upstream directly, and the CPU the proxy process spent per request (its
process CPU-time clock, nanoseconds, so noise from other processes does not count). Proxies are pinned to
CPU 0, the load generator and the upstream to the others; when those were more than 80 % busy, a warning
under the table says the figures are apparatus-bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson
import uvloop
from rich.console import Console
from rich.table import Table

from gateway.bench.compiled_build import compiled_tree
from gateway.bench.cpu import CpuMeter, Layout, proxy_split
from gateway.bench.lean_client import LeanClient, Measurement
from gateway.bench.loadgen import percentile, wait_http
from gateway.rules import reference_rules_path
from gateway.servers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Scenario:
    name: str
    stream: bool
    concurrency: int
    chunks: int
    interval_s: float
    requests: int


@dataclass
class Result:
    target: str
    scenario: str
    requests: int
    errors: int
    rps: float
    p50_ms: float
    p99_ms: float
    ttfb_p50_ms: float
    ttfb_p99_ms: float
    cpu_ms_per_request: float | None
    # the CPU the load generator + fake upstream used, as a share of the CPUs they had, and the largest share of
    # a benchmark CPU that other processes took (None: the run was too short to tell)
    apparatus_busy: float | None
    others_busy: float | None


MIN_REQUESTS = 300  # so even a quick run gives a proxy ~0.1 s of CPU to average (a GC pass is a few ms)


def scenarios(scale: float, concurrency: Sequence[int], pace_s: float = 0.02) -> list[Scenario]:
    def n(count: int) -> int:
        return max(MIN_REQUESTS, int(count * scale))

    out: list[Scenario] = []
    for c in concurrency:
        out.append(Scenario(f"non-stream c{c}", False, c, 16, 0.0, n(600 if c == 1 else 3000)))
        out.append(Scenario(f"stream 64 chunks c{c}", True, c, 64, 0.0, n(300 if c == 1 else 1500)))
        if c > 1:
            name = f"paced stream 64x{pace_s * 1e3:g}ms c{c}"
            out.append(Scenario(name, True, c, 64, pace_s, max(2 * c, n(c * 4))))
    return out


BUSY_WARNING = 0.8  # apparatus CPU share above which a scenario's figures are apparatus-bound
OTHERS_WARNING = 0.2  # share of a benchmark CPU other processes took above which the figures are noisy
REQUEST_TIMEOUT_S = 120.0
STARTUP_TIMEOUT_S = 90.0  # generous: a loaded 2-core machine can take long to start Python processes
TARGETS = (
    "direct", "minimal-aiohttp-proxy", "specgate", "specgate/aiohttp", "specgate/httpx", "specgate/httpx-aiohttp"
)  # fmt: skip
# On request only (--targets): the default gateway with JSON request logs (to /dev/null), or with OpenTelemetry
# tracing on (spans exported over OTLP/HTTP to the fake upstream's /v1/traces, which discards them).
# "specgate/keys": the default gateway with an API key that has every per-key limit (high enough never to refuse),
# so the difference to "specgate" is what authentication and limits cost. Every target gets the same header.
# "specgate/reference-rules": the default gateway routing by gateway/rules-reference.yaml (no learned model), so
# the difference to "specgate" is what the adaptive policy costs (predictions, learning, fresh in-flight counts).
# "specgate@REV": the default gateway of another commit (git archive), in the same run as this tree's targets.
# "vllm-router": vLLM Router (PyPI vllm-router, the Rust router of the vLLM project) over the same upstream listed
# twice (its power-of-two policy needs two workers), as a peer: what a compiled router costs on the same path.
EXTRA_TARGETS = ("specgate+json-logs", "specgate+otel", "specgate/keys", "specgate/reference-rules", "vllm-router")
# --compare-to compiled: this tree's compiled build (gateway/bench/compiled_build.py) against its source
COMPILED = "compiled"
BENCH_KEY = "sk-bench-overhead"
BENCH_KEYS = f"keys: [{{name: bench, key: {BENCH_KEY}, rpm: 1000000000, tpm: 1000000000, concurrency: 100000}}]"


@contextmanager
def process(
    args: list[str], cpu: set[int] | None, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    child_env = {**os.environ, **env} if env else None
    # pinned before it runs, so threads it starts (vLLM Router's runtime spawns one per CPU it may use) are too
    pin = (lambda: os.sched_setaffinity(0, cpu)) if cpu else None
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env, cwd=cwd, preexec_fn=pin
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def proxy_command(target: str, port: int, upstream: str) -> list[str]:
    py = sys.executable
    if target == "minimal-aiohttp-proxy":
        return [py, "-m", "gateway.bench.minimal_proxy", "--port", str(port), "--upstream", upstream]
    if target == "vllm-router":
        return vllm_router_command(port, upstream)
    client = {"specgate": "auto", "specgate/aiohttp": "aiohttp", "specgate/httpx": "httpx",
              "specgate/httpx-aiohttp": "httpx-aiohttp", "specgate+json-logs": "auto",
              "specgate+otel": "auto", "specgate/keys": "auto", "specgate/reference-rules": "auto"}[target]  # fmt: skip
    extra = ["--log-format", "json"] if target == "specgate+json-logs" else []
    return [py, "-m", "gateway.cli", "serve", "--standard", upstream, "--speculative", upstream,
            "--port", str(port), "--upstream-client", client, *extra]  # fmt: skip


def vllm_router_command(port: int, upstream: str) -> list[str]:
    """vLLM Router in front of ``upstream``: power of two choices (specgate's replica choice) over the upstream
    given twice, no queue limit below the benchmark's concurrency, no retries, metrics on a port of its own."""
    binary = Path(sys.executable).with_name("vllm-router")
    if not binary.exists():
        found = shutil.which("vllm-router")
        if found is None:
            raise SystemExit("the vllm-router target needs vLLM Router: pip install vllm-router (in the dev extras)")
        binary = Path(found)
    return [str(binary), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", upstream, upstream,
            "--policy", "power_of_two", "--max-concurrent-requests", "65536", "--disable-retries",
            "--prometheus-port", str(free_port()), "--log-level", "warning",
            "--request-timeout-secs", str(int(REQUEST_TIMEOUT_S))]  # fmt: skip


def proxy_env(target: str, upstream: str) -> dict[str, str]:
    if target == "specgate/keys":
        return {"SPECGATE_KEYS": BENCH_KEYS}
    if target == "specgate/reference-rules":
        return {"SPECGATE_RULES_FILE": str(reference_rules_path())}
    if target != "specgate+otel":
        return {}
    return {"SPECGATE_TRACING": "otel", "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{upstream}/v1/traces"}  # fmt: skip


def scenario_request(scenario: Scenario) -> tuple[str, bytes, dict[str, str]]:
    """The path, body and headers every request of ``scenario`` sends."""
    body = orjson.dumps(
        {"model": "fake-model", "stream": scenario.stream, "max_tokens": scenario.chunks,
         "messages": [{"role": "user", "content": "Tell me about the sea."}]}
    )  # fmt: skip
    headers = {"content-type": "application/json", "authorization": f"Bearer {BENCH_KEY}",
               "x-fake-chunks": str(scenario.chunks), "x-fake-interval": str(scenario.interval_s)}  # fmt: skip
    return "/v1/chat/completions", body, headers


async def drive(client: LeanClient, scenario: Scenario) -> Measurement:
    """Send ``scenario.requests`` requests with ``concurrency`` workers (one keep-alive connection each)."""
    request = client.request(*scenario_request(scenario))
    # Paced streams all end on a tick of the upstream's shared clock: without a stagger and a random pause the
    # workers would send their next requests in lockstep, at the very moment a proxy relays a tick's events.
    stagger = scenario.chunks * scenario.interval_s
    return await client.run(request, scenario.requests, scenario.concurrency, stagger, scenario.interval_s)


def warmup_of(scenario: Scenario) -> Scenario:
    """A few unpaced requests of ``scenario``'s shape before it is measured; they also open every connection
    the scenario will use."""
    return Scenario(scenario.name, scenario.stream, scenario.concurrency, scenario.chunks, 0.0,
                    max(40, scenario.concurrency))  # fmt: skip


def result_of(
    target: str, scenario: Scenario, run: Measurement, proxy_s: float | None, apparatus_busy: float | None = None,
    others_busy: float | None = None,
) -> Result:  # fmt: skip
    """One measured run as a :class:`Result`; ``proxy_s``: the proxy's CPU seconds over it (None: no proxy)."""
    done = len(run.latencies)
    return Result(
        target=target, scenario=scenario.name, requests=done + run.errors, errors=run.errors,
        rps=done / run.wall_s, p50_ms=percentile(run.latencies, 50) * 1e3, p99_ms=percentile(run.latencies, 99) * 1e3,
        ttfb_p50_ms=percentile(run.ttfbs, 50) * 1e3, ttfb_p99_ms=percentile(run.ttfbs, 99) * 1e3,
        cpu_ms_per_request=None if proxy_s is None else proxy_s * 1e3 / max(1, done),
        apparatus_busy=apparatus_busy, others_busy=others_busy,
    )  # fmt: skip


async def _measure(target: str, url: str, meter: CpuMeter, scenario: Scenario) -> Result:
    client = LeanClient(url, timeout_s=REQUEST_TIMEOUT_S)
    try:
        await drive(client, warmup_of(scenario))
        meter.start()
        run = await drive(client, scenario)
        cpu = meter.stop()
    finally:
        client.close()
    return result_of(target, scenario, run, cpu.proxy_s, cpu.apparatus_busy, cpu.others_busy)


def measure(target: str, url: str, meter: CpuMeter, scenario: Scenario) -> Result:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_measure(target, url, meter, scenario))


@dataclass(frozen=True)
class Rig:
    """The benchmark's fixed parts: the CPU layout and the running fake upstream."""

    layout: Layout
    proxy_cpu: set[int] | None
    rest: set[int] | None
    upstream: str
    upstream_pid: int


@contextmanager
def rig() -> Iterator[Rig]:
    """Pins this process (the load generator) and the fake upstream away from the proxies' CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    proxy_cpu, rest = proxy_split(cpus)
    if rest:
        os.sched_setaffinity(0, rest)
    everything = frozenset(cpus)
    layout = Layout(frozenset(proxy_cpu or everything), frozenset(rest or everything))
    upstream_port = free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    upstream_cmd = [sys.executable, "-m", "gateway.bench.lean_upstream", "--port", str(upstream_port)]
    try:
        with process(upstream_cmd, rest) as upstream_proc:
            wait_http(upstream + "/health", timeout_s=STARTUP_TIMEOUT_S)
            yield Rig(layout, proxy_cpu, rest, upstream, upstream_proc.pid)
    finally:
        os.sched_setaffinity(0, set(cpus))


def run(targets: Sequence[str], plan: Sequence[Scenario], console: Console, rules: Path | None = None) -> list[Result]:
    results: list[Result] = []
    with rig() as r:
        for target in targets:
            if target == "direct":
                meter = CpuMeter(r.layout, r.upstream_pid, proxy_pid=None)
                results += [measure(target, r.upstream, meter, s) for s in plan]
                console.print(f"  measured {target}")
                continue
            with contextlib.ExitStack() as stack:
                name, tree = target, None
                if target.startswith("specgate@"):  # another commit's default gateway, this tree's apparatus
                    from gateway.bench.overhead_compare import exported

                    name, tree = "specgate", stack.enter_context(exported(target.partition("@")[2]))
                port = free_port()
                env = proxy_env(name, r.upstream)
                if tree is not None:
                    env["PYTHONPATH"] = str(tree)
                if rules is not None and name.startswith("specgate"):  # unless the target names its own
                    env.setdefault("SPECGATE_RULES_FILE", str(rules.resolve()))
                proc = stack.enter_context(process(proxy_command(name, port, r.upstream), r.proxy_cpu, env, tree))
                wait_http(f"http://127.0.0.1:{port}/v1/chat/completions", STARTUP_TIMEOUT_S, method="POST")
                meter = CpuMeter(r.layout, r.upstream_pid, proc.pid)
                results += [measure(target, f"http://127.0.0.1:{port}", meter, s) for s in plan]
            console.print(f"  measured {target}")
    return results


def render(results: Sequence[Result], console: Console) -> None:
    direct = {r.scenario: r for r in results if r.target == "direct"}
    for scenario in dict.fromkeys(r.scenario for r in results):
        base = direct.get(scenario)
        table = Table(title=f"gateway overhead: {scenario} (fake upstream, this machine)")
        for column in ("target", "req/s", "vs direct", "p50 ms", "+p50", "p99 ms", "+p99", "TTFB p50",
                       "+TTFB p50", "+TTFB p99", "CPU ms/req", "errors"):  # fmt: skip
            table.add_column(column, justify="right" if column != "target" else "left")
        for r in (r for r in results if r.scenario == scenario):
            ref = None if r.target == "direct" else base
            table.add_row(
                r.target, f"{r.rps:.0f}", f"{r.rps / base.rps:.2f}x" if base else "",
                f"{r.p50_ms:.2f}", _delta(r, ref, "p50_ms"), f"{r.p99_ms:.2f}", _delta(r, ref, "p99_ms"),
                f"{r.ttfb_p50_ms:.2f}", _delta(r, ref, "ttfb_p50_ms"), _delta(r, ref, "ttfb_p99_ms"),
                "" if r.cpu_ms_per_request is None else f"{r.cpu_ms_per_request:.3f}", str(r.errors),
            )  # fmt: skip
        console.print(table)
        for warning in busy_warnings([r for r in results if r.scenario == scenario]):
            console.print(f"[yellow]{warning}[/]")


def busy_warnings(results: Sequence[Result]) -> list[str]:
    """Lines to print under a table whose figures the apparatus's own CPU limited or other processes disturbed."""
    warnings = []
    bound = [(r.target, r.apparatus_busy) for r in results if r.apparatus_busy and r.apparatus_busy > BUSY_WARNING]
    if bound:
        worst = max(share for _, share in bound)
        names = ", ".join(f"{target} {share:.0%}" for target, share in bound)
        warnings.append(f"warning: load generator + fake upstream kept their CPU up to {worst:.0%} busy ({names}): "
                        "apparatus-bound figures")  # fmt: skip
    noisy = [(r.target, r.others_busy) for r in results if r.others_busy is not None and r.others_busy > OTHERS_WARNING]
    if noisy:
        names = ", ".join(f"{target} {share:.0%}" for target, share in noisy)
        warnings.append(f"warning: other processes took up to {max(s for _, s in noisy):.0%} of a benchmark CPU "
                        f"({names}): noisy figures")  # fmt: skip
    return warnings


def _delta(result: Result, ref: Result | None, field: str) -> str:
    if ref is None:
        return ""
    return f"{getattr(result, field) - getattr(ref, field):+.2f}"


def main(
    targets: Sequence[str],
    concurrency: Sequence[int],
    scale: float,
    json_out: Path | None,
    rules: Path | None = None,
    compare_to: str | None = None,
    rounds: int = 3,
    paired: bool = False,
    pace_s: float = 0.02,
    wheel: Path | None = None,
) -> int:
    console = Console(width=160)
    plan = scenarios(scale, concurrency, pace_s)
    if compare_to is not None or paired:
        return compare(targets, plan, rules, compare_to, rounds, json_out, console, paired, scale, wheel)
    console.print(f"[bold]specgate bench overhead[/]: {len(targets)} targets x {len(plan)} scenarios")
    results = run(targets, plan, console, rules)
    render(results, console)
    if json_out is not None:
        json_out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 1 if any(r.errors for r in results) else 0


def compare(
    targets: Sequence[str],
    plan: Sequence[Scenario],
    rules: Path | None,
    rev: str | None,
    rounds: int,
    json_out: Path | None,
    console: Console,
    paired: bool = False,
    scale: float = 1.0,
    wheel: Path | None = None,
) -> int:
    """This tree's gateway target against ``rev``'s (``compiled``: against its compiled build, from ``wheel``
    when given), or (``rev`` None, paired) two proxy targets of this tree against each other (gateway targets,
    or one and vllm-router: ratios to the peer on the same CPU under the same load, which move by a few percent
    where sequential runs on this shared machine move by tens): the first is the base."""
    from gateway.bench import overhead_compare

    gateways = [t for t in targets if t.startswith("specgate") or (rev is None and t == "vllm-router")]
    if rev is not None and len(gateways) != 1:
        raise SystemExit("--compare-to compares one gateway target (e.g. --targets specgate)")
    if rev is None and len(gateways) != 2:
        raise SystemExit("--paired without --compare-to runs two proxy targets of this tree "
                         "(e.g. --targets specgate/reference-rules,specgate or vllm-router,specgate)")  # fmt: skip
    how = "both at once (paired)" if paired else "alternating"
    base_name = rev if rev is not None else gateways[0]
    head_name = "this tree" if rev is not None else gateways[1]
    what = f"{gateways[0]} of this tree vs {rev}" if rev is not None else f"{gateways[1]} vs {gateways[0]}"
    if rev == COMPILED:  # this tree's compiled build (head) against its source, interpreted (base)
        base_name, head_name = "this tree, interpreted", "this tree, compiled"
        what = f"{gateways[0]} of this tree, compiled (a wheel built as pip install . builds it) vs interpreted"
    console.print(f"[bold]specgate bench overhead[/]: {what}, {rounds} rounds x {len(plan)} scenarios each, {how}")
    with contextlib.ExitStack() as stack:
        if rev == COMPILED:
            if wheel is None:
                console.print("building this tree's compiled wheel (mypyc; a minute or a few)")
            tree = stack.enter_context(compiled_tree(wheel))
            sides = {"base": overhead_compare.Side("base", REPO_ROOT), "head": overhead_compare.Side("head", tree)}
        elif rev is not None:
            tree = stack.enter_context(overhead_compare.exported(rev))
            sides = {"base": overhead_compare.Side("base", tree), "head": overhead_compare.Side("head", REPO_ROOT)}
        else:
            sides = {label: overhead_compare.Side(label, REPO_ROOT, name)
                     for label, name in zip(("base", "head"), gateways, strict=True)}  # fmt: skip
        r = stack.enter_context(rig())
        if paired:
            results = overhead_compare.run_paired(gateways[0], plan, sides, rounds, r, rules, console, scale)
        else:
            results = overhead_compare.run_compare(gateways[0], plan, sides, rounds, r, rules, console)
    overhead_compare.render_compare(results, base_name, console, paired, head_name)
    if json_out is not None:
        json_out.write_text(json.dumps({k: [asdict(x) for x in v] for k, v in results.items()}, indent=2))
    return 1 if any(x.errors for v in results.values() for x in v) else 0
