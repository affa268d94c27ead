"""Response owners in the shared store (issue #27, item 4): an id is set only if absent, memory and Redis alike,
so no gateway replaces another's mapping; two gateways on one real Redis answer another key 404 alike."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.response_ids import ResponseOwners
from gateway.signals.store import SharedState
from tests.signals.servers import RedisServer
from tests.test_response_owner_keys import MODEL, Setup, client, create, created_id, not_found, serve_replicas


async def test_a_value_is_set_only_if_absent(store: SharedState) -> None:
    assert await store.put_value_if_absent("resp:a", "alice http://r1", ttl_s=60)
    assert not await store.put_value_if_absent("resp:a", "mallory http://r2", ttl_s=60)
    assert await store.get_value("resp:a") == "alice http://r1"
    assert await store.put_value_if_absent("resp:b", "mallory http://r2", ttl_s=60)


async def test_no_gateway_replaces_another_gateways_mapping(store: SharedState) -> None:
    one = ResponseOwners(ttl_s=60, max_ids=10, shared=store)
    other = ResponseOwners(ttl_s=60, max_ids=10, shared=store)
    for owners, url, owner in ((one, "http://r1", "alice"), (other, "http://r2", "mallory")):
        write = owners.remember("resp_x", url, owner)
        assert write is not None
        await write
    assert await store.get_value("resp:resp_x") == "alice http://r1"
    assert await other.replica_url("resp_x", "mallory") is None
    assert await other.replica_url("resp_x", "alice") == "http://r1"
    fresh = ResponseOwners(ttl_s=60, max_ids=10, shared=store)  # a third gateway reads it from the store
    assert await fresh.replica_url("resp_x", "mallory") is None
    assert await fresh.replica_url("resp_x", "alice") == "http://r1"


@pytest.fixture
def setup() -> Iterator[Setup]:
    yield from serve_replicas()


@pytest.mark.redis
def test_through_another_gateway_another_key_still_gets_404(setup: Setup, private_redis: RedisServer) -> None:
    (one, _), (two, _) = setup.start(redis_url=private_redis.url), setup.start(redis_url=private_redis.url)
    rid = created_id(create(one, "alice", "alice's secret"))  # written to Redis before the body went out
    before = setup.reached(rid)
    with client(two, "bob") as bob:
        for method, path in (("GET", f"/v1/responses/{rid}"), ("POST", f"/v1/responses/{rid}/cancel")):
            answer = bob.request(method, path)
            assert answer.status_code == 404 and answer.json()["error"] == not_found(rid), (method, answer.text)
        body = {"model": MODEL, "input": "and then?", "previous_response_id": rid}
        assert bob.post("/v1/responses", json=body).status_code == 404
    taken = create(two, "mallory", "mallory's text", request_id=rid)
    assert taken.status_code == 400 and taken.json()["error"]["param"] == "request_id"
    assert setup.reached(rid) == before
    with client(two, "alice") as alice:
        assert alice.get(f"/v1/responses/{rid}").json()["output_text"] == "alice's secret"
