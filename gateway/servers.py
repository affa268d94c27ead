"""Run a server on loopback in a background thread with its own event loop.

Used by the tests, the benchmarks and the demo: ``with ThreadServer(app) as server: server.url``.
``app`` is an ASGI application (served by uvicorn, lifespan included) or an ``aiohttp.web.Application``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from types import TracebackType
from typing import Any

import uvicorn
from aiohttp import web

from gateway.intake import IntakeProtocol


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (for servers started as other processes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class ThreadServer:
    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout_s: float = 20.0,
        protocol: type[IntakeProtocol] = IntakeProtocol,
    ) -> None:
        self.app = app
        self.protocol = protocol
        self.host = host
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when the listening
        # socket's proto is IPPROTO_TCP; with proto 0, Nagle + delayed ACK add ~40 ms to every response.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port: int = self._sock.getsockname()[1]
        self._timeout = startup_timeout_s
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name=f"server-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ThreadServer:
        self._thread.start()
        if not self._started.wait(self._timeout):
            raise TimeoutError(f"server on {self.url} did not start in {self._timeout}s")
        if self._error is not None:
            raise RuntimeError(f"server on {self.url} failed to start") from self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=self._timeout)

    def __enter__(self) -> ThreadServer:
        return self.start()

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._started.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if isinstance(self.app, web.Application):
            await self._serve_aiohttp()
        else:
            await self._serve_asgi()

    async def _serve_aiohttp(self) -> None:
        assert self._stop is not None
        runner = web.AppRunner(
            self.app, handle_signals=False, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await runner.setup()
        await web.SockSite(runner, self._sock).start()
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    async def _serve_asgi(self) -> None:
        assert self._stop is not None
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="on", http=self.protocol
        )  # what `specgate serve` runs
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[self._sock]))
        while not server.started:
            if serving.done():
                await serving
                raise RuntimeError("uvicorn exited during start-up")
            await asyncio.sleep(0.01)
        self._started.set()
        await self._stop.wait()
        server.should_exit = True
        await serving
