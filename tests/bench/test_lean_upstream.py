"""The lean fake upstream answers like fake_upstream.py, paces streams with one ticker, survives disconnects."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.bench.lean_upstream import LeanUpstream, ServerConnection

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "fake-model", "prompt": "hi"}


@pytest.fixture
async def lean() -> AsyncIterator[tuple[LeanUpstream, httpx.AsyncClient]]:
    upstream = LeanUpstream()
    server = await upstream.start()
    port = server.sockets[0].getsockname()[1]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        yield upstream, client
    upstream.stop()
    server.close()
    await server.wait_closed()


def sse_events(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]


@pytest.mark.parametrize(
    ("path", "body", "kind"),
    [("/v1/chat/completions", CHAT, "chat.completion"), ("/v1/completions", COMPLETION, "text_completion")],
    ids=["chat", "completions"],
)
async def test_non_stream_answers_the_openai_shape_with_usage(
    lean: tuple[LeanUpstream, httpx.AsyncClient], path: str, body: dict[str, Any], kind: str
) -> None:
    _, client = lean
    for _ in range(2):  # the second answer comes from the cache, on the same keep-alive connection
        resp = await client.post(path, json=body, headers={"x-fake-chunks": "5"})
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "application/json"
        data = resp.json()
        assert data["object"] == kind
        assert data["usage"] == {"prompt_tokens": 8, "completion_tokens": 5, "total_tokens": 13}
        choice = data["choices"][0]
        assert (choice["message"]["content"] if kind == "chat.completion" else choice["text"]) == "tok tok tok tok tok"


@pytest.mark.parametrize(
    ("body", "usage", "chunk_object"),
    [
        ({**CHAT, "stream": True}, False, "chat.completion.chunk"),
        ({**CHAT, "stream": True, "stream_options": {"include_usage": True}}, True, "chat.completion.chunk"),
        ({**COMPLETION, "stream": True, "max_tokens": 7}, False, "text_completion"),
    ],
    ids=["chat", "chat-usage", "completions-max-tokens"],
)
async def test_stream_sends_every_event_then_done(
    lean: tuple[LeanUpstream, httpx.AsyncClient], body: dict[str, Any], usage: bool, chunk_object: str
) -> None:
    _, client = lean
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    headers = {"x-fake-chunks": "7"} if "messages" in body else {}
    resp = await client.post(path, json=body, headers=headers)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    if usage:
        assert chunks.pop()["usage"]["completion_tokens"] == 7
    assert len(chunks) == 7
    assert {c["object"] for c in chunks} == {chunk_object}
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 6 + ["length"]


async def test_paced_stream_spreads_events_over_count_times_interval(
    lean: tuple[LeanUpstream, httpx.AsyncClient],
) -> None:
    _, client = lean
    headers = {"x-fake-chunks": "6", "x-fake-interval": "0.05"}

    async def arrivals() -> list[float]:
        times = []
        async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=headers) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    times.append(time.perf_counter())
        return times

    both = await asyncio.gather(arrivals(), arrivals())  # two streams share one ticker
    for times in both:
        assert len(times) == 6
        # the first event comes at once, the other five on ticks 50 ms apart (the first tick within 50 ms);
        # a tick that runs late on a loaded machine is followed by one at once, so judge the typical gap
        assert 0.19 <= times[-1] - times[0] <= 0.6
        assert statistics.median(b - a for a, b in itertools.pairwise(times[1:])) >= 0.03


async def test_disconnect_mid_stream_leaves_the_server_serving(lean: tuple[LeanUpstream, httpx.AsyncClient]) -> None:
    upstream, client = lean
    headers = {"x-fake-chunks": "100", "x-fake-interval": "0.01"}
    async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=headers) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                break  # leaving the block closes the unfinished response's connection
    for _ in range(100):
        if upstream.cancelled:
            break
        await asyncio.sleep(0.01)
    assert upstream.cancelled == 1
    resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers={"x-fake-chunks": "100"})
    assert sse_events(resp.text)[-1] == "[DONE]"
    assert upstream.requests == 2


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/health", None, 200),
        ("GET", "/v1/models", None, 200),
        ("GET", "/nope", None, 404),
        ("POST", "/v1/embeddings", b"{}", 404),
        ("POST", "/v1/chat/completions", b"not json", 400),
    ],
    ids=["health", "models", "unknown-get", "unknown-post", "bad-json"],
)
async def test_other_routes_and_bad_requests(
    lean: tuple[LeanUpstream, httpx.AsyncClient], method: str, path: str, body: bytes | None, status: int
) -> None:
    _, client = lean
    resp = await client.request(method, path, content=body)
    assert resp.status_code == status
    if path == "/v1/models":
        assert resp.json()["data"][0]["id"] == "fake-model"
    if status >= 400:
        assert "message" in resp.json()["error"]


class RecordingTransport:
    """Stands in for a socket transport: records writes, and asks for a pause after ``pause_after`` writes."""

    def __init__(self, protocol: ServerConnection, pause_after: int) -> None:
        self.protocol = protocol
        self.pause_after = pause_after
        self.writes: list[bytes] = []

    def get_extra_info(self, name: str) -> None:
        return None

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        if len(self.writes) == self.pause_after:
            self.protocol.pause_writing()

    def close(self) -> None:
        raise AssertionError("a keep-alive connection must stay open")


async def test_unpaced_stream_writes_each_event_separately_and_honours_pause_writing() -> None:
    conn = ServerConnection(LeanUpstream())
    transport = RecordingTransport(conn, pause_after=4)
    conn.connection_made(transport)  # type: ignore[arg-type]
    body = orjson.dumps({**CHAT, "stream": True})
    conn.data_received(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-fake-chunks: 10\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    assert len(transport.writes) == 4  # the head with event 1, then events 2..4; then the transport asked to pause
    conn.resume_writing()
    assert len(transport.writes) == 10 + 1  # one write per event, then the tail
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert all(w.count(b"data: ") == 1 for w in transport.writes[:10])
    assert transport.writes[-1].endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")


@pytest.fixture
async def lean_port() -> AsyncIterator[int]:
    upstream = LeanUpstream()
    server = await upstream.start()
    yield server.sockets[0].getsockname()[1]
    upstream.stop()
    server.close()
    await server.wait_closed()


async def test_pipelined_requests_are_answered_in_order(lean_port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", lean_port)
    stream = orjson.dumps({**CHAT, "stream": True})
    plain = orjson.dumps(CHAT)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-fake-chunks: 3\r\nContent-Length: %d\r\n\r\n%s"
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-fake-chunks: 2\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(stream), stream, len(plain), plain)
    )
    data = await asyncio.wait_for(reader.read(), 5)  # the second response closes the connection
    writer.close()
    first, second = data.split(b"0\r\n\r\n", 1)
    assert first.count(b"data: {") == 3 and b"data: [DONE]" in first
    assert second.startswith(b"HTTP/1.1 200 OK\r\n") and b"connection: close" in second
    assert second.endswith(b'"content":"tok tok"},"finish_reason":"length"}],"usage":{"prompt_tokens":8,'
                           b'"completion_tokens":2,"total_tokens":10},"served_by":"lean"}')  # fmt: skip


async def test_a_malformed_request_gets_400_and_a_closed_connection(lean_port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", lean_port)
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert data.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"malformed HTTP request" in data
