"""Response id -> (replica, owner): reading the id from bodies and streams, the bounded map with its TTL and its
fair eviction, owners (a response is found only for the key that made it), the shared store."""

from __future__ import annotations

import hashlib

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.auth import ApiKey
from gateway.errors import NoHealthyBackend
from gateway.metrics import GatewayMetrics, KeyMetrics
from gateway.response_ids import (
    ANONYMOUS_OWNER,
    SCAN_LIMIT,
    ResponseOwners,
    StreamIdScanner,
    body_response_id,
    valid_id,
)
from gateway.signals.store import MemorySharedState, SharedStateUnavailable

CREATED = (
    b'event: response.created\ndata: {"response":{"id":"resp_abc","status":"in_progress","usage":null},'
    b'"sequence_number":0,"type":"response.created"}\n\n'
)


@pytest.mark.parametrize(
    ("body", "rid"),
    [
        (b'{"id":"resp_1","object":"response"}', "resp_1"),
        (b'{"object":"response"}', None),
        (b'{"id":"../x"}', None),
        (b'{"id":5}', None),
        (b"[1]", None),
        (b"not json", None),
    ],
)
def test_body_response_id(body: bytes, rid: str | None) -> None:
    assert body_response_id(body) == rid


@pytest.mark.parametrize("cut", [0, 5, 30, 60, len(CREATED) - 3, len(CREATED)])
def test_stream_id_found_however_the_first_event_is_split(cut: int) -> None:
    scanner = StreamIdScanner()
    found = [scanner.feed(part) for part in (CREATED[:cut], CREATED[cut:], b"event: response.in_progress\n")]
    assert [f for f in found if f] == ["resp_abc"] and scanner.done


def test_stream_scan_stops_past_its_limit() -> None:
    scanner = StreamIdScanner()
    filler = b"data: " + orjson.dumps({"type": "x", "pad": "p" * 1000}) + b"\n\n"
    fed = 0
    while not scanner.done:
        assert scanner.feed(filler) is None
        fed += len(filler)
        assert fed <= SCAN_LIMIT + len(filler)
    unfinished = StreamIdScanner()  # one endless line (no newline) is given up on too
    for _ in range(SCAN_LIMIT // 1000 + 1):
        unfinished.feed(b"x" * 1000)
    assert unfinished.done


def test_valid_ids() -> None:
    assert valid_id("resp_0a9f") and valid_id("a.b:c-d_e")
    assert not any(valid_id(v) for v in ("", ".", "..", "../a", "a/b", "a b", "x" * 300, 5, None))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def evictions() -> tuple[Counter, CollectorRegistry]:
    registry = CollectorRegistry()
    return GatewayMetrics(registry).response_ids_evicted, registry


def evicted(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("specgate_response_ids_evicted_total")


async def test_local_map_has_a_ttl_and_a_bound() -> None:
    clock = Clock()
    owners = ResponseOwners(ttl_s=10, max_ids=2, clock=clock)
    assert owners.remember("a", "http://r1", "alice") is None  # no shared store: nothing to write
    owners.remember("b", "http://r2", "alice")
    assert await owners.replica_url("a", "alice") == "http://r1"
    owners.remember("c", "http://r3", "alice")  # over the bound: the oldest goes
    assert await owners.replica_url("a", "alice") is None and len(owners) == 2
    clock.now += 11
    assert await owners.replica_url("b", "alice") is None and await owners.replica_url("c", "alice") is None
    assert len(owners) == 0 and owners.held("alice") == 0


async def test_a_response_is_found_only_for_the_owner_that_made_it() -> None:
    owners = ResponseOwners(ttl_s=60, max_ids=10)
    owners.remember("resp_a", "http://r1", "alice")
    assert await owners.replica_url("resp_a", "alice") == "http://r1"
    assert await owners.replica_url("resp_a", "bob") is None  # as if it did not exist
    assert await owners.replica_url("resp_a", ANONYMOUS_OWNER) is None
    assert await owners.known("resp_a") and not await owners.known("resp_b")


@pytest.mark.parametrize(("owner", "url"), [("bob", "http://r2"), ("bob", "http://r1"), ("alice", "http://r2")])
async def test_a_mapping_is_never_replaced(owner: str, url: str) -> None:
    owners = ResponseOwners(ttl_s=60, max_ids=10)
    owners.remember("resp_a", "http://r1", "alice")
    assert owners.remember("resp_a", url, owner) is None  # a client chose an id already in use
    assert await owners.replica_url("resp_a", "alice") == "http://r1"
    if owner != "alice":
        assert await owners.replica_url("resp_a", owner) is None
    assert len(owners) == 1 and owners.held("alice") == 1 and owners.held("bob") == 0


async def test_an_expired_mapping_may_be_made_again() -> None:
    clock = Clock()
    owners = ResponseOwners(ttl_s=10, max_ids=10, clock=clock)
    owners.remember("resp_a", "http://r1", "alice")
    clock.now += 10
    owners.remember("resp_a", "http://r2", "bob")
    assert await owners.replica_url("resp_a", "bob") == "http://r2" and owners.held("alice") == 0


def test_owners_are_a_hash_of_the_keys_hash_never_the_key() -> None:
    def key(secret: str) -> ApiKey:
        return ApiKey(secret, hashlib.sha256(secret.encode()).digest(), None, None, False, None, KeyMetrics())

    alice, bob = key("sk-alice"), key("sk-bob")
    tag = ResponseOwners.owner_of(alice)
    assert tag == ResponseOwners.owner_of(key("sk-alice")) != ResponseOwners.owner_of(bob)
    assert len(tag) == 24 and int(tag, 16) >= 0 and " " not in tag
    assert "sk-alice" not in tag and tag not in alice.digest.hex()  # not a prefix of the keys file's sha256
    assert ResponseOwners.owner_of(None) == ANONYMOUS_OWNER


async def test_a_flood_from_one_owner_evicts_its_own_ids_first() -> None:
    counter, registry = evictions()
    owners = ResponseOwners(ttl_s=60, max_ids=6, evicted=counter)
    for owner in ("alice", "bob"):
        owners.remember(f"resp_{owner}_1", "http://r1", owner)
        owners.remember(f"resp_{owner}_2", "http://r1", owner)
    for i in range(100):
        owners.remember(f"resp_mallory_{i}", "http://r2", "mallory")
    for owner in ("alice", "bob"):  # the oldest ids of all, kept: mallory held the most each time
        assert await owners.replica_url(f"resp_{owner}_1", owner) == "http://r1"
        assert owners.held(owner) == 2
    assert owners.held("mallory") == 2 and len(owners) == 6
    assert await owners.replica_url("resp_mallory_99", "mallory") == "http://r2"  # its newest stay
    assert await owners.replica_url("resp_mallory_97", "mallory") is None
    assert evicted(registry) == 98


async def test_past_the_bound_expired_ids_go_before_live_ones_and_are_not_counted() -> None:
    counter, registry = evictions()
    clock = Clock()
    owners = ResponseOwners(ttl_s=10, max_ids=3, clock=clock, evicted=counter)
    owners.remember("old_1", "http://r1", "mallory")
    owners.remember("old_2", "http://r1", "mallory")
    clock.now += 10
    owners.remember("new_1", "http://r1", "alice")
    owners.remember("new_2", "http://r1", "alice")
    owners.remember("new_3", "http://r1", "alice")  # alice holds the most, but mallory's are expired
    assert evicted(registry) == 0 and owners.held("mallory") == 0 and owners.held("alice") == 3
    owners.remember("new_4", "http://r1", "bob")
    assert evicted(registry) == 1 and await owners.replica_url("new_1", "alice") is None


async def test_shared_store_is_written_and_read_back() -> None:
    shared = MemorySharedState()
    one = ResponseOwners(ttl_s=60, max_ids=10, shared=shared)
    other = ResponseOwners(ttl_s=60, max_ids=10, shared=shared)
    task = one.remember("resp_x", "http://r1", "alice")
    assert task is not None
    await task
    assert await shared.get_value("resp:resp_x") == "alice http://r1"
    assert await other.replica_url("resp_x", "alice") == "http://r1"  # another gateway replica finds it
    assert await other.replica_url("resp_x", "bob") is None  # ... for its owner only
    assert await other.replica_url("resp_y", "alice") is None


async def test_a_gateway_never_replaces_another_gateways_mapping_in_the_shared_store() -> None:
    shared = MemorySharedState()
    one = ResponseOwners(ttl_s=60, max_ids=10, shared=shared)
    other = ResponseOwners(ttl_s=60, max_ids=10, shared=shared)
    first = one.remember("resp_x", "http://r1", "alice")
    assert first is not None
    await first
    second = other.remember("resp_x", "http://r2", "mallory")  # the same id, chosen by another client
    assert second is not None
    await second
    assert await shared.get_value("resp:resp_x") == "alice http://r1"
    assert await other.replica_url("resp_x", "mallory") is None  # its local guess gave way to the shared one
    assert await other.replica_url("resp_x", "alice") == "http://r1"


async def test_a_shared_value_without_an_owner_is_nobodys() -> None:
    shared = MemorySharedState()
    await shared.put_value("resp:resp_old", "http://r1", 60)  # as written before owners were recorded
    owners = ResponseOwners(ttl_s=60, max_ids=10, shared=shared)
    assert await owners.replica_url("resp_old", ANONYMOUS_OWNER) is None and len(owners) == 0


class DownStore(MemorySharedState):
    async def put_value(self, key: str, value: str, ttl_s: float) -> None:
        raise SharedStateUnavailable("down")

    async def put_value_if_absent(self, key: str, value: str, ttl_s: float) -> bool:
        raise SharedStateUnavailable("down")

    async def get_value(self, key: str) -> str | None:
        raise SharedStateUnavailable("down")


async def test_a_down_store_degrades_clearly() -> None:
    owners = ResponseOwners(ttl_s=60, max_ids=10, shared=DownStore())
    task = owners.remember("resp_x", "http://r1", "alice")
    assert task is not None
    await task  # logged, not raised
    assert await owners.replica_url("resp_x", "alice") == "http://r1"  # the local map still answers
    with pytest.raises(NoHealthyBackend, match="shared store is unavailable"):
        await owners.replica_url("resp_unknown", "alice")
