"""``specgate bench soak``: many paced streams for a long time through ``specgate serve``; is memory flat?

One run starts the lean fake upstream (:mod:`gateway.bench.lean_upstream`) and drives N paced streams (each
worker: one keep-alive connection, a stream of ``chunks`` events ``pace_s`` apart, a random 0..pace_s pause,
again) first straight at the upstream (``direct``, for ``direct_s``), then through a ``specgate serve``
process (for ``duration_s``). Every ``sample_s`` it samples the gateway process: RSS (``/proc/PID/status``),
open file descriptors (``/proc/PID/fd``), event-loop lag (the gateway's own ``specgate_event_loop_lag_seconds``
gauge: the largest lateness of a 100 ms timer over the last 5 s, scraped from ``/metrics``, along with its
5xx count) and, client side, completed requests and errors. It prints a table of the samples and a summary
(steady throughput vs direct, latency, errors, RSS growth after the warm-up and the RSS trend), and plots
the samples. Targets: 0 errors, 1.00x direct throughput, RSS growth < 5 % after the first minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import orjson
import uvloop
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from gateway.bench.cpu import cpu_seconds, cpu_ticks, proxy_split
from gateway.bench.lean_client import LeanClient, Measurement
from gateway.bench.loadgen import percentile, wait_http
from gateway.bench.overhead import STARTUP_TIMEOUT_S, process, proxy_command
from gateway.looplag import cpu_wait_s
from gateway.servers import free_port

RSS_TARGET = 0.05  # growth after the warm-up
RATIO_TARGET = 0.995  # shown as 1.00x


@dataclass(frozen=True)
class SoakConfig:
    streams: int = 1000
    duration_s: float = 600.0
    direct_s: float = 120.0
    chunks: int = 64
    pace_s: float = 0.05
    sample_s: float = 5.0
    warmup_s: float = 60.0  # RSS growth is measured from the first sample at or after this
    request_timeout_s: float = 60.0
    pin: bool = True  # the gateway on the first CPU, the load generator and the upstream on the others
    rev: str | None = None  # soak this commit's gateway (git archive) instead of this tree's

    @property
    def ramp_s(self) -> float:
        """Until every worker has finished its first stream: throughput samples before this are ramp-up."""
        return 2 * self.chunks * self.pace_s + self.pace_s


@dataclass
class Sample:
    t_s: float
    completed: int
    errors: int
    rps: float
    rss_mb: float | None = None
    fds: int | None = None
    loop_lag_ms: float | None = None
    own_lag_ms: float | None = None  # the lag less the loop thread's waits for a CPU (the gateway's own stalls)
    gateway_5xx: float | None = None
    gateway_5xx_by: dict[str, float] = field(default_factory=dict)  # "status reason" -> count so far
    scrape_ms: float | None = None
    gateway_cpu: float | None = None  # the gateway process's CPU time over the interval, as a share of one core
    apparatus_cpu: float | None = None  # the busier of the load generator and the lean upstream, share of a core
    machine_busy: float | None = None  # every CPU of the machine, whoever used them, share of all of them
    # how long the gateway's event-loop thread was runnable but waited for a CPU over the interval (the kernel's
    # /proc/PID/schedstat): other processes on its core, a stall that is not the gateway's own work
    cpu_wait_ms: float | None = None


@dataclass
class StallSource:
    """What one source of event-loop holds (a collector generation, a periodic job) did over a run, from the
    gateway's ``specgate_gc_pause_seconds`` / ``specgate_background_seconds`` histograms."""

    source: str
    count: float
    total_ms: float
    over_10ms: float  # holds longer than 10 ms (the loop-lag target)
    worst_le_ms: float | None  # the smallest bucket bound every hold fits under (None: one was above the last)


@dataclass
class Phase:
    target: str
    duration_s: float
    completed: int
    errors: int
    steady_rps: float
    p50_ms: float
    p99_ms: float
    ttfb_p50_ms: float
    ttfb_p99_ms: float
    samples: list[Sample] = field(default_factory=list)
    probe_errors: list[str] = field(default_factory=list)  # /metrics scrapes that failed (the sample kept RSS, fds)
    stalls: list[StallSource] = field(default_factory=list)  # as of the last /metrics page


@dataclass
class SoakResult:
    config: SoakConfig
    direct: Phase
    gateway: Phase

    @property
    def errors(self) -> int:
        last_5xx = next((s.gateway_5xx for s in reversed(self.gateway.samples) if s.gateway_5xx is not None), 0.0)
        return self.gateway.errors + self.direct.errors + int(last_5xx or 0)

    @property
    def ratio(self) -> float:
        return self.gateway.steady_rps / self.direct.steady_rps if self.direct.steady_rps else float("nan")

    def warm(self) -> list[Sample]:
        return [s for s in self.gateway.samples if s.t_s >= self.config.warmup_s and s.rss_mb is not None]

    def rss_growth(self) -> float | None:
        """(last RSS - first RSS after the warm-up) / first RSS after the warm-up."""
        warm = self.warm()
        if len(warm) < 2:
            return None
        first, last = warm[0].rss_mb or 0.0, warm[-1].rss_mb or 0.0
        return (last - first) / first

    def rss_slope_mb_per_min(self) -> float | None:
        """Least-squares slope of RSS over the samples after the warm-up."""
        points = [(s.t_s, s.rss_mb or 0.0) for s in self.warm()]
        if len(points) < 3:
            return None
        mean_t = sum(t for t, _ in points) / len(points)
        mean_r = sum(r for _, r in points) / len(points)
        var = sum((t - mean_t) ** 2 for t, _ in points)
        return 60 * sum((t - mean_t) * (r - mean_r) for t, r in points) / var if var else None


def raise_fd_limit() -> None:
    """Two sockets per stream in the gateway: lift the soft open-files limit to the hard one (children inherit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


def runqueue_wait_s(pid: int) -> float | None:
    """Seconds the main thread of ``pid`` (the event loop's) has spent runnable but waiting for a CPU."""
    return cpu_wait_s(Path(f"/proc/{pid}/schedstat"))


def process_stats(pid: int) -> tuple[float, int]:
    """RSS in MiB and open file descriptors of ``pid``."""
    rss_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd"))


STALL_FAMILIES = {"specgate_gc_pause_seconds": ("gc", "generation"), "specgate_background_seconds": ("job", "job")}


def stall_sources(text: str) -> list[StallSource]:
    """Each collector generation's pauses and each periodic job's holds, from a /metrics page."""
    out: dict[str, StallSource] = {}
    buckets: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(text):
        kind = STALL_FAMILIES.get(family.name)
        if kind is None:
            continue
        for s in family.samples:
            name = f"{kind[0]} {s.labels.get(kind[1], '?')}"
            source = out.setdefault(name, StallSource(name, 0.0, 0.0, 0.0, None))
            if s.name.endswith("_count"):
                source.count = s.value
            elif s.name.endswith("_sum"):
                source.total_ms = s.value * 1e3
            elif s.name.endswith("_bucket"):
                buckets.setdefault(name, []).append((float(s.labels["le"]), s.value))
    for name, cumulative in buckets.items():
        cumulative.sort()
        source = out[name]
        within_10ms = max((n for le, n in cumulative if le <= 0.01), default=0.0)
        source.over_10ms = source.count - within_10ms
        worst = next((le for le, n in cumulative if n >= source.count), None)
        source.worst_le_ms = None if worst is None or worst == float("inf") else worst * 1e3
    return [s for s in out.values() if s.count]


def gateway_gauges(text: str) -> tuple[float | None, float | None, dict[str, float]]:
    """The loop-lag gauges (seconds: all of it, and the gateway's own, without waits for a CPU) and the 5xx
    answers by status and reason, from a /metrics page."""
    lag: float | None = None
    own: float | None = None
    errors: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "specgate_event_loop_lag_seconds":
            lag = family.samples[0].value if family.samples else None
        elif family.name == "specgate_event_loop_own_lag_seconds":
            own = family.samples[0].value if family.samples else None
        elif family.name == "specgate_requests":
            for s in family.samples:
                if s.name.endswith("_total") and s.labels["status"][0] == "5":
                    key = f"{s.labels['status']} {s.labels['reason']}"
                    errors[key] = errors.get(key, 0.0) + s.value
    return lag, own, errors


class CpuSampler:
    """CPU shares since the last reading: the gateway's and the apparatus's (the busier of this process, the
    load generator, and the upstream; each is one thread) as shares of one core, and the whole machine's busy
    share (other processes included)."""

    def __init__(self, upstream_pid: int, gateway_pid: int | None, cpus: set[int] | None = None) -> None:
        self.upstream_pid, self.gateway_pid = upstream_pid, gateway_pid
        self.cpus = cpus if cpus is not None else os.sched_getaffinity(0)
        self._last = self._read()
        self._wait = runqueue_wait_s(gateway_pid) if gateway_pid is not None else None

    def _read(self) -> tuple[float, float, tuple[float, float], tuple[int, int]]:
        gateway = cpu_seconds(self.gateway_pid) if self.gateway_pid is not None else 0.0
        apparatus = (time.process_time(), cpu_seconds(self.upstream_pid))
        return time.perf_counter(), gateway, apparatus, cpu_ticks(self.cpus)

    def sample(self, sample: Sample) -> None:
        (t0, gw0, app0, (busy0, total0)), now = self._last, self._read()
        t1, gw1, app1, (busy1, total1) = now
        self._last = now
        window = t1 - t0
        if window <= 0:
            return
        sample.apparatus_cpu = max(after - before for before, after in zip(app0, app1, strict=True)) / window
        sample.gateway_cpu = (gw1 - gw0) / window if self.gateway_pid is not None else None
        sample.machine_busy = (busy1 - busy0) / (total1 - total0) if total1 > total0 else None
        if self.gateway_pid is not None:
            wait, self._wait = self._wait, runqueue_wait_s(self.gateway_pid)
            if wait is not None and self._wait is not None:
                sample.cpu_wait_ms = (self._wait - wait) * 1e3


class Sampler:
    """Every ``sample_s``: the load's progress, CPU shares and, with a gateway pid, the gateway's RSS, fds and
    gauges."""

    def __init__(self, config: SoakConfig, result: Measurement, url: str, pid: int | None, cpu: CpuSampler) -> None:
        self.config, self.result, self.url, self.pid, self.cpu = config, result, url, pid, cpu
        self.samples: list[Sample] = []
        self.probe_errors: list[str] = []
        self.stalls: list[StallSource] = []

    async def run(self, started: float, console: Console) -> None:
        # a fresh connection per probe: a kept-alive one would race uvicorn's 5 s keep-alive timeout (ReadError)
        no_keepalive = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=self.url, timeout=30.0, limits=no_keepalive) as http:
            previous, previous_t, due = 0, 0.0, 0.0
            while True:
                # the next boundary after the last one (a timer that wakes a hair early must not sample twice)
                elapsed = time.perf_counter() - started
                due = max(due + self.config.sample_s, elapsed - elapsed % self.config.sample_s)
                await asyncio.sleep(due - elapsed)
                t = time.perf_counter() - started
                completed = len(self.result.latencies)
                sample = Sample(round(t, 1), completed, self.result.errors, (completed - previous) / (t - previous_t))
                previous, previous_t = completed, t
                self.cpu.sample(sample)
                if self.pid is not None:
                    try:
                        await self._probe(http, sample)
                    except Exception as exc:  # a missed probe, not a missed sample (named in the output)
                        self.probe_errors.append(f"t={sample.t_s}s: {type(exc).__name__}: {exc}")
                        console.print(f"  probe failed: {self.probe_errors[-1]}", highlight=False)
                self.samples.append(sample)
                console.print(f"  t={sample.t_s:>6.1f}s  {_line(sample)}", highlight=False)

    async def _probe(self, http: httpx.AsyncClient, sample: Sample) -> None:
        assert self.pid is not None
        sample.rss_mb, sample.fds = process_stats(self.pid)
        scrape = time.perf_counter()
        page = await http.get("/metrics")
        sample.scrape_ms = (time.perf_counter() - scrape) * 1e3
        lag, own, sample.gateway_5xx_by = gateway_gauges(page.text)
        sample.own_lag_ms = None if own is None else own * 1e3
        self.stalls = stall_sources(page.text)
        sample.gateway_5xx = sum(sample.gateway_5xx_by.values())
        sample.loop_lag_ms = None if lag is None else lag * 1e3


def _line(s: Sample) -> str:
    lag = "" if s.loop_lag_ms is None else f"  loop lag {s.loop_lag_ms:.1f} ms"
    gateway = "" if s.rss_mb is None else f"  RSS {s.rss_mb:.1f} MiB  fds {s.fds}{lag}"
    cpu = "" if s.apparatus_cpu is None else f"  CPU apparatus {s.apparatus_cpu:.0%}"
    if s.gateway_cpu is not None:
        cpu += f" gateway {s.gateway_cpu:.0%}"
    if s.machine_busy is not None:
        cpu += f" machine {s.machine_busy:.0%}"
    return f"{s.rps:>7.1f} req/s  done {s.completed}  errors {s.errors}{gateway}{cpu}"


async def _phase(target: str, url: str, duration_s: float, config: SoakConfig, pid: int | None,
                 upstream_pid: int, console: Console, cpus: set[int] | None = None) -> Phase:  # fmt: skip
    body = orjson.dumps({"model": "fake-model", "stream": True, "max_tokens": config.chunks,
                         "messages": [{"role": "user", "content": "Tell me about the sea."}]})  # fmt: skip
    headers = {"content-type": "application/json", "x-fake-chunks": str(config.chunks),
               "x-fake-interval": str(config.pace_s)}  # fmt: skip
    client = LeanClient(url, timeout_s=config.request_timeout_s)
    request = client.request("/v1/chat/completions", body, headers)
    result = Measurement()
    sampler = Sampler(config, result, url, pid, CpuSampler(upstream_pid, pid, cpus))
    started = time.perf_counter()
    sampling = asyncio.create_task(sampler.run(started, console))
    try:
        stagger = config.chunks * config.pace_s  # spread the first requests over one stream's length
        await client.run_for(request, duration_s, config.streams, result, stagger, config.pace_s)
    finally:
        sampling.cancel()
        client.close()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling  # re-raises what stopped the sampler early, if anything did
    steady = [s for s in sampler.samples if config.ramp_s <= s.t_s <= duration_s]
    span = steady[-1].t_s - steady[0].t_s if len(steady) > 1 else 0.0
    rps = (steady[-1].completed - steady[0].completed) / span if span else len(result.latencies) / result.wall_s
    return Phase(
        target=target, duration_s=duration_s, completed=len(result.latencies), errors=result.errors,
        steady_rps=rps, p50_ms=percentile(result.latencies, 50) * 1e3, p99_ms=percentile(result.latencies, 99) * 1e3,
        ttfb_p50_ms=percentile(result.ttfbs, 50) * 1e3, ttfb_p99_ms=percentile(result.ttfbs, 99) * 1e3,
        samples=sampler.samples, probe_errors=sampler.probe_errors, stalls=sampler.stalls,
    )  # fmt: skip


def phase(target: str, url: str, duration_s: float, config: SoakConfig, pid: int | None, upstream_pid: int,
          console: Console, cpus: set[int] | None = None) -> Phase:  # fmt: skip
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_phase(target, url, duration_s, config, pid, upstream_pid, console, cpus))


def cpu_split(cpus: set[int], pin: bool) -> tuple[set[int] | None, set[int] | None]:
    """(the gateway's CPUs, the apparatus's) when pinning: the first CPU, and the others; (None, None) when
    not pinning or with one CPU (everything shares it)."""
    return proxy_split(cpus) if pin else (None, None)


def run(config: SoakConfig, console: Console) -> SoakResult:
    """Both phases. Pinned (the default), the gateway runs alone on one CPU and the apparatus (this load
    generator and the upstream) on the others, as in ``specgate bench overhead``: unpinned on a small
    machine, the apparatus's bursts (every stream's next event leaves the upstream on the same tick) land
    on the gateway's core at the moment it has a burst of its own to relay. ``config.rev``: that commit's
    gateway (git archive) under this tree's apparatus."""
    from gateway.bench.overhead_compare import exported  # it imports bench.overhead, as this module does

    raise_fd_limit()
    everything = os.sched_getaffinity(0)
    gateway_cpu, rest = cpu_split(everything, config.pin)
    upstream_port = free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    upstream_cmd = [sys.executable, "-m", "gateway.bench.lean_upstream", "--port", str(upstream_port)]
    if gateway_cpu is not None and rest is not None:
        console.print(f"pinned: the gateway on CPU {min(gateway_cpu)}, the load generator and the upstream on CPUs "
                      f"{','.join(map(str, sorted(rest)))} (--no-pin to share them)")  # fmt: skip
    try:
        if rest is not None:
            os.sched_setaffinity(0, rest)
        with contextlib.ExitStack() as stack, process(upstream_cmd, rest) as upstream_proc:
            wait_http(upstream + "/health", timeout_s=STARTUP_TIMEOUT_S)
            console.print(f"[bold]direct[/] ({config.direct_s:.0f} s)")
            direct = phase("direct", upstream, config.direct_s, config, None, upstream_proc.pid, console, everything)
            port = free_port()
            tree = stack.enter_context(exported(config.rev)) if config.rev else None
            env = {"PYTHONPATH": str(tree)} if tree is not None else None
            with process(proxy_command("specgate", port, upstream), gateway_cpu, env, tree) as gateway:
                url = f"http://127.0.0.1:{port}"
                wait_http(url + "/v1/chat/completions", STARTUP_TIMEOUT_S, method="POST")
                console.print(f"[bold]specgate[/] ({config.duration_s:.0f} s, gateway pid {gateway.pid})")
                through = phase("specgate", url, config.duration_s, config, gateway.pid, upstream_proc.pid, console,
                                everything)  # fmt: skip
    finally:
        os.sched_setaffinity(0, everything)
    return SoakResult(config, direct, through)


def write_json(result: SoakResult, path: Path) -> None:
    path.write_text(json.dumps(asdict(result), indent=2, default=str))
