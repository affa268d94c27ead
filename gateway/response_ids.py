"""Which replica holds a Responses API object: ``resp_...`` id -> replica URL.

vLLM keeps a response (for ``GET /v1/responses/{id}``, ``/cancel`` and ``previous_response_id``) in the memory
of the server that created it, so those calls must go back to that replica. :class:`ResponseOwners` remembers
the replica of every response the gateway relayed: in a bounded in-process map with a TTL, and, when Redis is
configured, under the same TTL in Redis, so that another gateway replica finds it too.

The id is read once per response, off the per-chunk path: from a non-streamed body's ``id``, or from the first
event carrying a ``response`` object (``response.created``) within the first :data:`SCAN_LIMIT` bytes of a
stream.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeGuard

import orjson

from gateway.errors import NoHealthyBackend
from gateway.signals.store import SharedState, SharedStateUnavailable

log = logging.getLogger("specgate")

# What the gateway accepts as a response id in a path (vLLM's are "resp_" + hex): no "/", no leading ".".
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,255}")
SCAN_LIMIT = 64 * 1024  # stream bytes searched for the response id before giving up
_KEY_PREFIX = "resp:"


def valid_id(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and ID_PATTERN.fullmatch(value) is not None


def body_response_id(body: bytes) -> str | None:
    """The ``id`` of a non-streamed Responses API body."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    rid = payload.get("id") if isinstance(payload, dict) else None
    return rid if valid_id(rid) else None


class StreamIdScanner:
    """Finds the response id in the first events of a Responses API stream (SSE ``data:`` lines)."""

    __slots__ = ("_buffer", "_seen", "done")

    def __init__(self) -> None:
        self._buffer = b""
        self._seen = 0
        self.done = False

    def feed(self, chunk: bytes) -> str | None:
        """The id once a complete event carrying it has arrived; ``done`` when found or past the limit."""
        buffer = self._buffer + chunk if self._buffer else chunk
        self._seen += len(chunk)
        end = buffer.rfind(b"\n")
        for line in buffer[: end + 1].split(b"\n"):
            if line.startswith(b"data:") and b'"response"' in line:
                rid = _event_response_id(line[5:])
                if rid is not None:
                    self.done, self._buffer = True, b""
                    return rid
        self._buffer = buffer[end + 1 :]
        if self._seen > SCAN_LIMIT:
            self.done, self._buffer = True, b""
        return None


def _event_response_id(data: bytes) -> str | None:
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    response = event.get("response") if isinstance(event, dict) else None
    rid = response.get("id") if isinstance(response, dict) else None
    return rid if valid_id(rid) else None


class ResponseOwners:
    """Response id -> URL of the replica that created it, for ``ttl_s``; the oldest ``max_ids`` are kept.

    ``shared`` (Redis) is written in the background when an id is seen and read only when the local map
    misses (the id was created through another gateway replica, or this one restarted).
    """

    def __init__(
        self,
        ttl_s: float,
        max_ids: int,
        shared: SharedState | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_ids = max_ids
        self.shared = shared
        self._clock = clock
        self._local: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._writes: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._local)

    def remember(self, rid: str, url: str) -> asyncio.Task[None] | None:
        """Map ``rid`` to ``url`` here at once and, with Redis, in a background write (returned)."""
        self._put_local(rid, url)
        if self.shared is None:
            return None
        task = asyncio.get_running_loop().create_task(self._publish(rid, url))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def owner(self, rid: str) -> str | None:
        """The replica URL for ``rid``, or None when neither this gateway nor Redis knows it."""
        entry = self._local.get(rid)
        if entry is not None:
            if entry[1] > self._clock():
                return entry[0]
            del self._local[rid]
        if self.shared is None:
            return None
        try:
            url = await self.shared.get_value(_KEY_PREFIX + rid)
        except SharedStateUnavailable as exc:
            raise NoHealthyBackend(
                f"cannot look up response '{rid}': the shared store is unavailable", code="shared_state_unavailable"
            ) from exc
        if url is not None:
            self._put_local(rid, url)
        return url

    async def flush(self) -> None:
        """Wait for the background writes still in flight (tests, shutdown)."""
        if self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    def _put_local(self, rid: str, url: str) -> None:
        local = self._local
        local[rid] = (url, self._clock() + self.ttl_s)
        local.move_to_end(rid)
        while len(local) > self.max_ids:
            local.popitem(last=False)

    async def _publish(self, rid: str, url: str) -> None:
        assert self.shared is not None
        try:
            await self.shared.put_value(_KEY_PREFIX + rid, url, self.ttl_s)
        except SharedStateUnavailable as exc:
            log.warning("response %s: not shared with other gateway replicas: %s", rid, exc)
