"""Logging set-up, request ids, and the per-request JSON line (``--log-format json``).

With ``log_format=json`` every log record is one JSON object per line, and each finished proxied request adds
one record on the ``specgate.requests`` logger: request id, the id the pool got, path, model, pool, reason, task,
status, TTFT, total time, completion tokens, whether it was retried. Never the prompt or the completion text. With
the default ``text`` format no request record is built at all: the relay checks ``state.request_log is None``.

The request id is the client's ``x-request-id`` header, or one made here: 64 random bits from the operating
system, drawn 512 ids at a time (:class:`RequestIds`), so that no client can guess another's id. The relay
returns it to the client and logs it. The pool gets the gateway's own id as ``x-request-id`` (vLLM's OpenAI
server takes that header as its request id, which must be unique among the requests it is running): the same
id when the client sent none, a fresh one when it did; the request log's ``upstream_id`` names it, so that a
line in the engine's log can be found from the gateway's.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

REQUEST_LOGGER = "specgate.requests"
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RequestIds:
    """Unguessable ids, cheaply: 16 hex digits from ``os.urandom``, one read for 512 of them.

    Per id (``python -m timeit``, 2-core development machine): 0.11 us, as the counter it replaced (a random
    prefix and a counter, which let a client guess other clients' ids), against 0.40 us for
    ``secrets.token_hex(8)`` and 1.5 us for ``uuid4().hex``. A Mersenne Twister (``random.getrandbits``) would
    be as cheap but not unguessable: its state follows from 312 of its 64-bit outputs, and a client sees its own.
    """

    BATCH = 512

    def __init__(self) -> None:
        self._ids: list[str] = []

    def make(self) -> str:
        try:
            return self._ids.pop()
        except IndexError:
            raw = os.urandom(8 * self.BATCH).hex()
            self._ids = [raw[i : i + 16] for i in range(0, len(raw), 16)]
            return self._ids.pop()

    def for_upstream(self, request_id: str, headers: Mapping[str, str]) -> str:
        """The id the pool gets: ``request_id`` when the gateway made it, a fresh one when the client chose it
        (two clients, or one client's retries, may send the same id; the engine keys its requests by it)."""
        return self.make() if headers.get("x-request-id") else request_id


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, plus the record's ``fields`` if it has some."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def configure_logging(level: str, log_format: str) -> None:
    """The root logger for ``specgate serve``: text lines, or JSON lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # health checks would log every poll


class _Features(Protocol):
    @property
    def task(self) -> str: ...
    @property
    def model(self) -> str: ...


class FinishedRequest(Protocol):
    """What the relay knows when a request ends (``gateway.proxy._Relay``)."""

    request_id: str
    upstream_id: str
    path: str
    pool: str
    reason: str
    status: int
    ttft: float | None
    tokens: int
    retried: bool
    started: float

    @property
    def features(self) -> _Features: ...


class RequestLog:
    """Writes one record per finished request to the ``specgate.requests`` logger."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger(REQUEST_LOGGER)

    def finished(self, request: FinishedRequest) -> None:
        total = time.perf_counter() - request.started
        ttft = request.ttft
        fields = {
            "request_id": request.request_id,
            "upstream_id": request.upstream_id,
            "path": request.path,
            "model": request.features.model,
            "pool": request.pool,
            "reason": request.reason,
            "task": request.features.task,
            "status": request.status,
            "ttft_s": None if ttft is None else round(ttft, 6),
            "total_s": round(total, 6),
            "tokens": request.tokens,
            "retried": request.retried,
        }
        self._log.info("request", extra={"fields": fields})

    def rejected(self, request_id: str, path: str, status: int, error_type: str, started: float) -> None:
        """A request the gateway answered itself before routing (bad JSON, unknown model, too large...)."""
        fields = {
            "request_id": request_id,
            "path": path,
            "pool": "none",
            "reason": "rejected",
            "status": status,
            "error": error_type,
            "total_s": round(time.perf_counter() - started, 6),
        }
        self._log.info("request", extra={"fields": fields})
