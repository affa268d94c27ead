"""Real redis-server and prometheus processes on 127.0.0.1 (free ports, their own directories), for the
signals benchmark (``specgate bench signals``) and the tests, which add a CI-aware skip when a binary is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gateway.servers import free_port


class MissingBinary(FileNotFoundError):
    """A server binary that is not on PATH."""


def find_binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise MissingBinary(f"`{name}` is not installed (scripts/setup/10-services.sh installs it)")
    return found


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not ready within {timeout_s} s")


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
        return True
    return False


@dataclass
class ManagedProcess:
    """A server process that tests may stop, restart (same port) and pause (SIGSTOP)."""

    argv: list[str]
    port: int
    log: Path
    ready_timeout_s: float = 10.0
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(self.ready, self.ready_timeout_s, f"{self.argv[0]} on port {self.port}")
        except TimeoutError:
            self.stop()
            raise

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.argv[0]} exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        return _port_open(self.port)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.resume()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def pause(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)


class RedisServer(ManagedProcess):
    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def redis_server(workdir: Path, binary: str | None = None) -> RedisServer:
    binary = binary or find_binary("redis-server")
    port = free_port()
    argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(workdir), "--daemonize", "no", "--protected-mode", "no"]
    return RedisServer(argv=argv, port=port, log=workdir / "redis.log")


class PrometheusServer(ManagedProcess):
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def configure(self, config: str) -> None:
        """Replace prometheus.yml (before start: the port is known before the config has to be)."""
        (self.log.parent / "prometheus.yml").write_text(config)

    def ready(self) -> bool:
        if not super().ready():
            return False
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/-/ready", timeout=0.5).status_code == 200
        return False


def prometheus_server(
    workdir: Path, config: str, rules: dict[str, str] | None = None, binary: str | None = None
) -> PrometheusServer:
    """``config`` is the prometheus.yml text; ``rules`` (file name -> text) are written beside it."""
    binary = binary or find_binary("prometheus")
    for name, text in (rules or {}).items():
        (workdir / name).write_text(text)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(config)
    port = free_port()
    argv = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        "--scrape.discovery-reload-interval=100ms",  # hidden flag; the default 5 s delays the first scrape
        "--log.level=warn",
    ]
    return PrometheusServer(argv=argv, port=port, log=workdir / "prometheus.log", ready_timeout_s=20.0)


@contextlib.contextmanager
def running(server: ManagedProcess) -> Iterator[ManagedProcess]:
    server.start()
    try:
        yield server
    finally:
        server.stop()
