"""Which replica holds a Responses API object, and for whom: ``resp_...`` id -> (replica URL, owner).

vLLM keeps a response (for ``GET /v1/responses/{id}``, ``/cancel`` and ``previous_response_id``) in the memory
of the server that created it, so those calls must go back to that replica. :class:`ResponseOwners` remembers
the replica of every response the gateway relayed, and the key that created it (:meth:`ResponseOwners.owner_of`:
a hash of the key's hash, never the key; one fixed owner while the gateway is open): another key is answered
404, as if the id did not exist. Entries live in a bounded in-process map with a TTL and, when Redis is
configured, under the same TTL in Redis (``owner url``), so that another gateway replica finds them too.

A client may choose a response's id (vLLM's ``request_id`` extension), so a mapping, once made, is never
replaced: a later response with the same id is not remembered (in Redis: ``SET NX``). When the map is full
the owner holding the most ids loses its oldest (counted in ``specgate_response_ids_evicted_total``), so one
key's flood of cheap responses cannot push out another key's.

The id is read once per response, off the per-chunk path: from a non-streamed body's ``id``, or from the first
event carrying a ``response`` object (``response.created``) within the first :data:`SCAN_LIMIT` bytes of a
stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple, TypeGuard

import orjson
from prometheus_client import Counter

from gateway.auth import ApiKey
from gateway.errors import NoHealthyBackend
from gateway.signals.store import SharedState, SharedStateUnavailable

log = logging.getLogger("specgate")

# What the gateway accepts as a response id in a path (vLLM's are "resp_" + hex): no "/", no leading ".".
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,255}")
SCAN_LIMIT = 64 * 1024  # stream bytes searched for the response id before giving up
_KEY_PREFIX = "resp:"
ANONYMOUS_OWNER = "anonymous"  # every caller of an open gateway (no keys configured)
_OWNER_PERSON = b"specgate-resp-id"  # blake2b's personalisation: owner tags are not the keys file's sha256


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


class _Entry(NamedTuple):
    url: str
    owner: str
    expires: float  # on the map's clock


class ResponseOwners:
    """Response id -> (replica URL, owner) for ``ttl_s``; at most ``max_ids`` here, shared through Redis.

    ``shared`` (Redis) is written in the background when an id is seen (only if absent there) and read only when
    the local map misses (the id was created through another gateway replica, or this one restarted). Past
    ``max_ids``, expired ids go first, then the oldest id of the owner holding the most (one pass over the
    owners: their number is the keys that created responses within the TTL).
    """

    def __init__(
        self,
        ttl_s: float,
        max_ids: int,
        shared: SharedState | None = None,
        clock: Callable[[], float] = time.monotonic,
        evicted: Counter | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_ids = max_ids
        self.shared = shared
        self._clock = clock
        self._evicted = evicted
        self._local: OrderedDict[str, _Entry] = OrderedDict()  # oldest first
        self._held: dict[str, OrderedDict[str, None]] = {}  # owner -> its ids, oldest first
        self._writes: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._local)

    @staticmethod
    def owner_of(key: ApiKey | None) -> str:
        """Whom a response belongs to: 24 hex digits of a hash of the key's SHA-256, or :data:`ANONYMOUS_OWNER`."""
        if key is None:
            return ANONYMOUS_OWNER
        return hashlib.blake2b(key.digest, digest_size=12, person=_OWNER_PERSON).hexdigest()

    def held(self, owner: str) -> int:
        """How many ids this gateway holds for ``owner``."""
        return len(self._held.get(owner, ()))

    def remember(self, rid: str, url: str, owner: str) -> asyncio.Task[None] | None:
        """Map ``rid`` to ``url`` for ``owner`` here at once, unless it is mapped already, and, with Redis, in a
        background write (returned) that keeps Redis's mapping when another gateway made one first."""
        if self._live(rid) is not None:
            return None
        self._put_local(rid, _Entry(url, owner, self._clock() + self.ttl_s))
        if self.shared is None:
            return None
        task = asyncio.get_running_loop().create_task(self._publish(rid, url, owner))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def replica_url(self, rid: str, owner: str) -> str | None:
        """The replica URL for ``owner``'s ``rid``; None when it is unknown here and in Redis, or another's."""
        entry = await self._find(rid)
        return entry.url if entry is not None and entry.owner == owner else None

    async def known(self, rid: str) -> bool:
        """Whether ``rid`` is mapped, for any owner."""
        return await self._find(rid) is not None

    async def flush(self) -> None:
        """Wait for the background writes still in flight (tests, shutdown)."""
        if self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    async def _find(self, rid: str) -> _Entry | None:
        entry = self._live(rid)
        if entry is not None or self.shared is None:
            return entry
        try:
            value = await self.shared.get_value(_KEY_PREFIX + rid)
        except SharedStateUnavailable as exc:
            raise NoHealthyBackend(
                f"cannot look up response '{rid}': the shared store is unavailable", code="shared_state_unavailable"
            ) from exc
        return self._adopt(rid, value)

    def _adopt(self, rid: str, value: str | None) -> _Entry | None:
        """Redis's mapping for ``rid``, now also the local one; a value without an owner is nobody's."""
        self._drop(rid)
        owner, _, url = (value or "").partition(" ")
        if not owner or not url:
            return None
        entry = _Entry(url, owner, self._clock() + self.ttl_s)
        self._put_local(rid, entry)
        return entry

    def _live(self, rid: str) -> _Entry | None:
        entry = self._local.get(rid)
        if entry is not None and entry.expires <= self._clock():
            self._drop(rid)
            return None
        return entry

    def _put_local(self, rid: str, entry: _Entry) -> None:
        self._local[rid] = entry
        self._held.setdefault(entry.owner, OrderedDict())[rid] = None
        while len(self._local) > self.max_ids:
            gone, oldest = next(iter(self._local.items()))
            if oldest.expires > self._clock():  # none has expired: the largest holder's oldest goes
                heaviest: OrderedDict[str, None] = max(self._held.values(), key=len)
                gone = next(iter(heaviest))
                if self._evicted is not None:
                    self._evicted.inc()
            self._drop(gone)

    def _drop(self, rid: str) -> None:
        entry = self._local.pop(rid, None)
        if entry is not None:
            held = self._held[entry.owner]
            del held[rid]
            if not held:
                del self._held[entry.owner]

    async def _publish(self, rid: str, url: str, owner: str) -> None:
        assert self.shared is not None
        key = _KEY_PREFIX + rid
        try:
            if await self.shared.put_value_if_absent(key, f"{owner} {url}", self.ttl_s):
                return
            self._adopt(rid, await self.shared.get_value(key))  # another gateway mapped it first: that stands
        except SharedStateUnavailable as exc:
            log.warning("response %s: not shared with other gateway replicas: %s", rid, exc)
