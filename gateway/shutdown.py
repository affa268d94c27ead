"""Graceful shutdown of ``specgate serve``: SIGTERM drains the gateway, then it exits 0.

On the first SIGTERM (or SIGINT) the gateway

1. answers ``/ready`` with 503 at once (``GatewayState.draining``), so a load balancer stops sending;
2. after ``drain_delay_s`` (default 0: in Kubernetes the pod's ``preStop`` sleep already gave the endpoints
   time to drop it) closes its listener: new connections are refused, idle keep-alive connections close,
   busy ones close after their response;
3. lets in-flight requests and streams finish for up to ``shutdown_grace_s``; then ends what is left the
   way a failed replica does (a stream gets an OpenAI-style error event, a request still waiting for its
   head a 503 ``shutting_down``), by firing every request guard; uvicorn's own graceful-shutdown timeout,
   set a little later, is only the backstop that cancels whatever still runs; then the lifespan shutdown;
4. exits 0. uvicorn would re-raise the captured SIGTERM after a clean shutdown, so the process would end
   "killed by SIGTERM" (exit 143); a drain that completed is a normal exit, so it is not re-raised.

A second signal keeps uvicorn's own behaviour (a second Ctrl-C forces the exit).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType

import uvicorn

from gateway.state import GatewayState

log = logging.getLogger("specgate.shutdown")
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
STARTUP_FAILURE = 3  # uvicorn's exit status when the server did not start
BACKSTOP_S = 2.0  # after the grace period, how long ended requests get to finish before uvicorn cancels them


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: GatewayState, drain_delay_s: float, grace_s: float) -> None:
        config.timeout_graceful_shutdown = grace_s + BACKSTOP_S  # type: ignore[assignment]  # a float is fine
        super().__init__(config)
        self._state = state
        self._drain_delay_s = drain_delay_s
        self._grace_s = grace_s
        self._drain_until: float | None = None
        self._announced = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler (main thread, between bytecodes): only flags, no logging, no loop calls."""
        if self._drain_until is None and sig in DRAIN_SIGNALS:
            self._state.draining = True
            self._drain_until = time.monotonic() + self._drain_delay_s
            if self._drain_delay_s <= 0:
                self.should_exit = True
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's main loop calls this every 0.1 s; the drain delay ends here."""
        if self._drain_until is not None:
            self._announce()
            if time.monotonic() >= self._drain_until:
                self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._announce()
        timer = asyncio.get_running_loop().call_later(self._grace_s, self._end_what_is_left)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _end_what_is_left(self) -> None:
        ended = self._state.sweeper.fire_all("shutdown")
        if ended:
            log.warning("grace period over: %d request(s) still in flight end with a shutting_down error", ended)

    def _announce(self) -> None:
        if not self._announced and self._drain_until is not None:
            self._announced = True
            log.info(
                "draining: /ready answers 503; the listener closes after %.1f s; in-flight requests get %.1f s",
                max(0.0, self._drain_delay_s),
                self._grace_s,
            )


def serve(config: uvicorn.Config, state: GatewayState, drain_delay_s: float, grace_s: float) -> int:
    """Run the server until it drained after a signal; the process's exit status."""
    server = GracefulServer(config, state, drain_delay_s, grace_s)
    server.run()
    if not server.started:
        return STARTUP_FAILURE
    log.info("shut down cleanly")
    return 0
