"""Per-key limits (gateway/limits.py): buckets, 429s in OpenAI's shape, token correction, slots released once."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from gateway.errors import RateLimited
from gateway.limits import Admission, Bucket, KeyLimits, Limiter, duration, reserve_for_others
from gateway.signals.store import MemorySharedState
from tests.conftest import Gateway, dead_url, wait_for

StartGateway = Callable[..., Gateway]


def chat(content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], **extra}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0ms"), (0.0201, "21ms"), (0.999, "999ms"), (1.0, "1s"), (1.23, "1.3s"), (59.9, "59.9s"), (60, "1m0s"),
     (361.2, "6m2s")],
)  # fmt: skip
def test_duration_is_openais_reset_format(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_bucket_refills_at_limit_per_minute_and_never_past_it() -> None:
    bucket = Bucket(limit=60, level=60, updated=1000.0)
    assert all(bucket.take(1, 1000.0) for _ in range(60))
    assert not bucket.take(1, 1000.0)
    assert bucket.wait_s(1) == pytest.approx(1.0)
    assert bucket.take(1, 1001.0) and not bucket.take(1, 1001.0)  # one per second comes back
    bucket.refill(5000.0)
    assert bucket.level == 60 and bucket.reset_s() == 0
    bucket.give_back(10)
    assert bucket.level == 60  # never above the limit


def limits(rpm: int | None = None, tpm: int | None = None, concurrency: int | None = None) -> KeyLimits:
    key = Limiter("me").configure([("k", rpm, tpm, concurrency)])["k"]
    return key


def test_each_limit_refuses_with_openai_headers_and_takes_nothing() -> None:
    key, now = limits(rpm=2, tpm=100, concurrency=5), 0.0
    key.requests.updated = key.tokens.updated = now  # type: ignore[union-attr]
    first = key.admit(40, now)
    assert dict(first.headers)[b"x-ratelimit-remaining-requests"] == b"1"
    assert dict(first.headers)[b"x-ratelimit-remaining-tokens"] == b"60"
    with pytest.raises(RateLimited) as too_many_tokens:
        key.admit(70, now)
    assert too_many_tokens.value.error_type == "tokens" and too_many_tokens.value.status_code == 429
    assert key.requests.level == 1  # type: ignore[union-attr]  # the refused request took no request either
    key.admit(10, now)
    with pytest.raises(RateLimited) as too_many_requests:
        key.admit(1, now)
    error = too_many_requests.value
    headers = dict(error.headers)
    assert error.error_type == "requests" and error.code == "rate_limit_exceeded"
    assert headers[b"retry-after"] == b"30" and headers[b"x-ratelimit-limit-requests"] == b"2"
    assert headers[b"x-ratelimit-reset-requests"] == b"1m0s" and headers[b"x-ratelimit-limit-tokens"] == b"100"
    assert key.inflight == 2


def test_a_request_larger_than_the_token_limit_says_so() -> None:
    key = limits(tpm=100)
    with pytest.raises(RateLimited, match="Request too large"):
        key.admit(101, key.tokens.updated)  # type: ignore[union-attr]


def test_concurrency_counts_this_and_the_other_replicas() -> None:
    key = limits(concurrency=2)
    a = key.admit(1, 0.0)
    key.others_inflight = 1
    with pytest.raises(RateLimited, match="concurrent requests"):
        key.admit(1, 0.0)
    a.finish(1)
    key.admit(1, 0.0)


def test_finish_releases_once_and_gives_back_unused_tokens() -> None:
    key = limits(tpm=1000, concurrency=3)
    start = key.tokens.updated  # type: ignore[union-attr]
    admission: Admission = key.admit(500, start)
    assert key.tokens.level == 500  # type: ignore[union-attr]
    admission.finish(120)
    admission.finish(0)  # a second finish (another path) changes nothing
    assert key.inflight == 0 and key.tokens.level == pytest.approx(880, abs=1)  # type: ignore[union-attr]


async def test_two_replicas_share_one_bucket_through_the_store() -> None:
    """Two limiters on one store: what one spends, the other cannot (local buckets, synced)."""
    store = MemorySharedState()
    a, b = Limiter("a"), Limiter("b")
    ka, kb = (x.configure([("k", 10, None, 3)])["k"] for x in (a, b))
    now = ka.requests.updated  # type: ignore[union-attr]
    held = [ka.admit(1, now) for _ in range(2)]
    for _ in range(6):
        ka.admit(1, now).finish(1)
    kb.last_used = now
    assert await a.sync(store, now) and await b.sync(store, now)
    assert kb.requests.level == pytest.approx(2) and kb.others_inflight == 2  # type: ignore[union-attr]
    third = kb.admit(1, now)
    with pytest.raises(RateLimited, match="concurrent"):
        kb.admit(1, now)  # 2 on replica a + 1 here = the limit of 3
    for admission in (*held, third):
        admission.finish(1)
    await a.sync(store, now)
    await b.sync(store, now)
    assert kb.others_inflight == 0
    kb.admit(1, now).finish(1)
    with pytest.raises(RateLimited, match="RPM"):
        kb.admit(1, now)  # 10 per minute: 8 on a, 2 here


@pytest.mark.parametrize(
    ("others", "reserved"),
    [
        ({}, 0),
        ({"b": 0}, 0),  # idle: nothing reserved, "a" may use the whole limit
        ({"b": 1}, 4),  # in use: its share at least
        ({"b": 6}, 6),  # or what it holds
        ({"b": -1}, 4),  # refused with nothing in flight: its share
        ({"b": 1, "c": 0}, 3),  # 8 over three: a 3, b 3, c 2
        ({"b": 0, "c": 1}, 2),
        ({"b": 2, "c": 5}, 8),
    ],
)
def test_each_replica_using_the_key_is_reserved_its_share_or_its_count(others: dict[str, int], reserved: int) -> None:
    assert reserve_for_others(8, "a", others) == reserved


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_shares_add_up_to_the_limit_and_nobody_deadlocks(limit: int) -> None:
    """Every replica refused with nothing in flight (-1 each): the slots left to each add up to the limit, and
    whenever the limit allows it, each may take one."""
    owners = ["a", "b", "c"]
    left = [limit - reserve_for_others(limit, o, {x: -1 for x in owners if x != o}) for o in owners]
    assert sum(left) == limit
    assert sum(n > 0 for n in left) == min(limit, len(owners))


async def test_replicas_under_load_settle_at_their_shares_and_never_exceed_the_limit() -> None:
    """Concurrency 4 over two replicas: one alone may use all of it; once the other is refused, it publishes
    that demand, and the first leaves it half as its slots come back. Counted as the store saw them, the two
    never hold more than 4 together."""
    store = MemorySharedState()
    a, b = Limiter("a"), Limiter("b")
    ka, kb = (x.configure([("k", None, None, 4)])["k"] for x in (a, b))
    held = [ka.admit(1, 0.0) for _ in range(4)]  # b idle: a uses the whole limit
    kb.last_used = 0.0
    await a.sync(store, 0.0)
    await b.sync(store, 0.0)
    assert kb.others_inflight == 4
    with pytest.raises(RateLimited, match="concurrent"):
        kb.admit(1, 0.0)
    await b.sync(store, 0.0)  # publishes its demand (1), though nothing is in flight there
    await a.sync(store, 0.0)
    assert ka.others_inflight == 2  # b's share, not its count
    for admission in held[:3]:
        admission.finish(1)
    ka.admit(1, 0.0)  # 2 in flight here + 2 reserved = the limit
    with pytest.raises(RateLimited, match="concurrent"):
        ka.admit(1, 0.0)
    await a.sync(store, 0.0)
    await b.sync(store, 0.0)
    assert kb.others_inflight == 2
    kb.admit(1, 0.0)
    kb.admit(1, 0.0)
    with pytest.raises(RateLimited, match="concurrent"):
        kb.admit(1, 0.0)
    assert ka.inflight + kb.inflight == 4


async def test_a_keys_first_use_wakes_the_sync_at_once() -> None:
    store = MemorySharedState()
    limiter = Limiter("a")
    key = limiter.configure([("k", 10, None, None)])["k"]
    task = asyncio.create_task(limiter.run(store, 60.0))  # the interval alone would not sync within the test
    try:
        await asyncio.sleep(0.01)
        assert limiter.syncs == 0
        key.admit(1, time.time()).finish(1)
        for _ in range(100):
            if limiter.syncs:
                break
            await asyncio.sleep(0.01)
        assert limiter.syncs == 1
        key.admit(1, time.time()).finish(1)  # in use: the next sync waits for the interval
        await asyncio.sleep(0.05)
        assert limiter.syncs == 1
    finally:
        task.cancel()


async def test_limits_fall_back_to_local_buckets_when_the_store_fails() -> None:
    class Down(MemorySharedState):
        async def sync_limits(self, *args: Any) -> Any:
            from gateway.signals.store import SharedStateUnavailable

            raise SharedStateUnavailable("down")

    limiter = Limiter("a")
    key = limiter.configure([("k", 3, None, 1)])["k"]
    key.others_inflight = 1
    now = key.requests.updated  # type: ignore[union-attr]
    key.last_used = now
    assert not await limiter.sync(Down(), now)
    assert key.others_inflight == 0 and not limiter.store_up  # per-replica limits from now on
    for _ in range(3):
        key.admit(1, now).finish(1)
    with pytest.raises(RateLimited):
        key.admit(1, now)


KEYS = """
keys:
  - {name: rpm, key: sk-rpm, rpm: 3}
  - {name: tpm, key: sk-tpm, tpm: 2000}
  - {name: conc, key: sk-conc, concurrency: 2}
"""


def test_over_the_limit_gets_openai_429_with_headers(gateway: StartGateway) -> None:
    gw = gateway(keys=KEYS)
    with httpx.Client(base_url=gw.url, headers={"authorization": "Bearer sk-rpm"}) as client:
        ok = [client.post("/v1/chat/completions", json=chat()) for _ in range(3)]
        refused = client.post("/v1/chat/completions", json=chat())
    assert [r.status_code for r in ok] == [200, 200, 200]
    assert [r.headers["x-ratelimit-remaining-requests"] for r in ok] == ["2", "1", "0"]
    assert ok[0].headers["x-ratelimit-limit-requests"] == "3" and "x-ratelimit-limit-tokens" not in ok[0].headers
    assert refused.status_code == 429
    assert refused.json()["error"] == {
        "message": refused.json()["error"]["message"], "type": "requests", "param": None, "code": "rate_limit_exceeded"
    }  # fmt: skip
    assert "requests per min (RPM): Limit 3" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 20
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
    assert refused.headers["x-request-id"]  # joins the client's and the gateway's logs like any response


def test_tokens_are_corrected_when_usage_arrives(gateway: StartGateway) -> None:
    gw = gateway(keys=KEYS)
    bucket = gw.app.state.access.limiter.keys["tpm"].tokens
    assert bucket is not None
    headers = {"x-api-key": "sk-tpm", "x-fake-chunks": "10"}
    with httpx.Client(base_url=gw.url, headers=headers) as client:
        r = client.post("/v1/chat/completions", json=chat(max_tokens=1500))
        assert r.status_code == 200 and int(r.headers["x-ratelimit-remaining-tokens"]) < 500  # booked 1500+
        assert client.post("/v1/chat/completions", json=chat(max_tokens=1500)).status_code == 200  # 1490 back
        stream = chat(max_tokens=1500, stream=True, stream_options={"include_usage": True})
        assert client.post("/v1/chat/completions", json=stream).status_code == 200
    # Each charge is settled just after the response's last byte went out: the client may read it first (a later
    # request cannot: the gateway's event loop settles a request before it reads anything else).
    gw.settled(3)
    spent = bucket.limit - bucket.level  # refill over the test's few seconds only makes this smaller
    assert 0 < spent <= 3 * (10 + 20)  # three requests: ~8 prompt tokens + 10 completion tokens each


def _hold_stream(url: str, key: str) -> socket.socket:
    """A stream that stays open (the fake stalls after one event) until the socket closes."""
    body = b'{"model":"fake-model","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nx-fake-stall-after: 1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.sendall(head.encode() + body)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    return sock


FAILURES: dict[str, tuple[dict[str, Any], dict[str, str], dict[str, Any]]] = {
    # name: (gateway settings, request headers, body extras); "hold": keep one slot busy with a stalled stream
    "upstream 500": ({}, {"x-fake-status": "500"}, {"hold": True}),
    "upstream reset": ({}, {"x-fake-reset": "1"}, {"hold": True}),
    "first-byte timeout": ({"first_byte_timeout_s": 0.3}, {"x-fake-delay": "2"}, {"hold": True}),
    "idle timeout mid-stream": ({"idle_timeout_s": 0.3}, {"x-fake-stall-after": "2"}, {"stream": True}),
    "client gone mid-stream": ({}, {"x-fake-stall-after": "2"}, {"stream": True, "disconnect": True, "hold": True}),
    "no replica": ({"standard_urls": [dead_url()], "speculative_urls": [dead_url()]}, {}, {}),
    "bad body after the key": ({}, {}, {"messages": "not a list", "hold": True}),
}


@pytest.mark.parametrize("failure", FAILURES.values(), ids=list(FAILURES))
def test_a_concurrency_slot_is_released_exactly_once_on_every_path(
    gateway: StartGateway, failure: tuple[dict[str, Any], dict[str, str], dict[str, Any]]
) -> None:
    settings, headers, extra = failure
    extra = dict(extra)
    disconnect, hold = extra.pop("disconnect", False), extra.pop("hold", False)
    gw = gateway(keys=KEYS, **settings)
    key = gw.app.state.access.limiter.keys["conc"]
    auth = {"authorization": "Bearer sk-conc"}
    held = None
    if hold:
        held = _hold_stream(gw.url, "sk-conc")  # one slot held all along: a double release would show
        wait_for(lambda: key.inflight == 1, what="the held stream's slot")
    with httpx.Client(base_url=gw.url, timeout=10, headers={**auth, **headers}) as client:
        for _ in range(3):  # more failures than slots: a leak would turn the last ones into 429s
            if disconnect:
                with client.stream("POST", "/v1/chat/completions", json=chat(**extra)) as r:
                    assert r.status_code == 200
                    next(r.iter_bytes())
                continue  # leaving the block closes the connection mid-stream
            r = client.post("/v1/chat/completions", json=chat(**extra))
            assert r.status_code != 429, r.text
            assert r.status_code >= 400 or b"error" in r.content
    expected = 1 if held is not None else 0
    wait_for(lambda: key.inflight == expected, what=f"{expected} slot(s) in use")
    if held is not None:
        held.close()
        wait_for(lambda: key.inflight == 0, what="the held stream's slot back")
    assert key.inflight == 0


def test_concurrent_requests_over_the_limit_are_refused(gateway: StartGateway) -> None:
    gw = gateway(keys=KEYS)
    holds = [_hold_stream(gw.url, "sk-conc") for _ in range(2)]
    try:
        with httpx.Client(base_url=gw.url) as client:
            r = client.post("/v1/chat/completions", json=chat(), headers={"x-api-key": "sk-conc"})
        assert r.status_code == 429 and "concurrent requests: Limit 2" in r.json()["error"]["message"]
    finally:
        for sock in holds:
            sock.close()
    key = gw.app.state.access.limiter.keys["conc"]
    wait_for(lambda: key.inflight == 0, what="slots back")
