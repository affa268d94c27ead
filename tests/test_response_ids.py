"""Response id -> replica: reading the id from bodies and streams, the bounded map with its TTL, the shared store."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import NoHealthyBackend
from gateway.response_ids import SCAN_LIMIT, ResponseOwners, StreamIdScanner, body_response_id, valid_id
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


async def test_local_map_has_a_ttl_and_a_bound() -> None:
    clock = Clock()
    owners = ResponseOwners(ttl_s=10, max_ids=2, clock=clock)
    assert owners.remember("a", "http://r1") is None  # no shared store: nothing to write
    owners.remember("b", "http://r2")
    assert await owners.owner("a") == "http://r1"
    owners.remember("c", "http://r3")  # over the bound: the oldest goes
    assert await owners.owner("a") is None and len(owners) == 2
    clock.now += 11
    assert await owners.owner("b") is None and await owners.owner("c") is None


async def test_shared_store_is_written_and_read_back() -> None:
    shared = MemorySharedState()
    one = ResponseOwners(ttl_s=60, max_ids=10, shared=shared)
    other = ResponseOwners(ttl_s=60, max_ids=10, shared=shared)
    task = one.remember("resp_x", "http://r1")
    assert task is not None
    await task
    assert await other.owner("resp_x") == "http://r1"  # another gateway replica finds it
    assert await other.owner("resp_y") is None


class DownStore(MemorySharedState):
    async def put_value(self, key: str, value: str, ttl_s: float) -> None:
        raise SharedStateUnavailable("down")

    async def get_value(self, key: str) -> str | None:
        raise SharedStateUnavailable("down")


async def test_a_down_store_degrades_clearly() -> None:
    owners = ResponseOwners(ttl_s=60, max_ids=10, shared=DownStore())
    task = owners.remember("resp_x", "http://r1")
    assert task is not None
    await task  # logged, not raised
    assert await owners.owner("resp_x") == "http://r1"  # the local map still answers
    with pytest.raises(NoHealthyBackend, match="shared store is unavailable"):
        await owners.owner("resp_unknown")
