"""The client never chooses the upstream, hop-by-hop headers stop at the gateway, smuggling is refused.

Raw sockets, so that nothing between the test and the gateway normalises what is sent. Each test asserts on
what the fake upstream actually received (``FakeUpstream.seen``: method, raw path, Host).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from tests.conftest import Gateway, Upstreams

StartGateway = Callable[..., Gateway]
BODY = orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
UPSTREAM_PATHS = {"/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions"}


def raw_exchange(url: str, request: bytes, timeout: float = 5.0) -> bytes:
    """Send ``request`` as is and read until the server closes or goes quiet; returns what came back."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(request)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
                if b"\r\n\r\n" in received and _complete(received):
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    return received


def _complete(received: bytes) -> bool:
    head, _, body = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def post(target: str, headers: list[str], body: bytes = BODY) -> bytes:
    lines = [f"POST {target} HTTP/1.1", *headers, "Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def upstream_requests(upstreams: Upstreams) -> list[tuple[str, str, str]]:
    """What reached the upstreams besides the gateway's own health checks and metric scrapes."""
    return [r for up in (upstreams.standard, upstreams.speculative) for r in up.seen if r[0] != "GET"]


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/v1/chat/completions", ["Host: evil.example:6666"]),
        ("/v1/chat/completions", ["Host: 169.254.169.254", "X-Forwarded-Host: evil", "Forwarded: host=evil"]),
        ("http://evil.example:6666/v1/chat/completions", ["Host: evil.example:6666"]),
        ("http://127.0.0.1:1/v1/chat/completions", ["Host: 127.0.0.1:1"]),
        ("/v1/chat/completions?next=http://evil/", ["Host: x"]),
        ("/v1/../v1/chat/completions", ["Host: x"]),
        ("/v1/chat/completions/../../../admin", ["Host: x"]),
        ("/v1/chat%2Fcompletions", ["Host: x"]),
        ("/%2e%2e/v1/chat/completions", ["Host: x"]),
        ("//evil.example/v1/chat/completions", ["Host: x"]),
        ("/v1/chat/completions#@evil", ["Host: x"]),
    ],
)
def test_no_url_host_or_path_from_the_request_reaches_the_upstream(
    gateway: StartGateway, upstreams: Upstreams, target: str, headers: list[str]
) -> None:
    gw = gateway()
    response = raw_exchange(gw.url, post(target, headers))
    assert status_of(response) in {200, 400, 404, 405}, response[:200]
    expected_host = urlsplit(upstreams.standard_url).netloc, urlsplit(upstreams.speculative_url).netloc
    everything = [r for up in (upstreams.standard, upstreams.speculative) for r in up.seen]
    for method, path, host in everything:
        assert path in UPSTREAM_PATHS, path  # only the gateway's own fixed paths, nothing of the request's
        assert host in expected_host, host
        assert method in {"GET", "POST"}
    if status_of(response) == 200:
        assert [r[1] for r in upstream_requests(upstreams)] == ["/v1/chat/completions"]


HOP_REQUEST = [
    "Host: x",
    "Connection: keep-alive, X-Secret-Hop",
    "X-Secret-Hop: 1",
    "Keep-Alive: timeout=5",
    "TE: trailers",
    "Trailer: X-Checksum",
    "Upgrade: h2c",
    "Proxy-Authorization: Basic Zm9vOmJhcg==",
    "Proxy-Connection: keep-alive",
    "X-Kept: yes",
]


def test_hop_by_hop_request_headers_are_dropped(gateway: StartGateway, upstreams: Upstreams) -> None:
    gw = gateway()
    assert status_of(raw_exchange(gw.url, post("/v1/chat/completions", HOP_REQUEST))) == 200
    received = {k.lower(): v for k, v in upstreams.standard.last_headers.items()}
    sent = set(received)
    hop = {"x-secret-hop", "keep-alive", "te", "trailer", "upgrade", "proxy-authorization", "proxy-connection"}
    assert not sent & hop, sent & hop
    assert received["x-kept"] == "yes"
    assert received.get("connection", "keep-alive").lower() == "keep-alive"  # the gateway's own, if any


def test_a_chunked_request_is_forwarded_with_its_own_framing(gateway: StartGateway, upstreams: Upstreams) -> None:
    """The client's Transfer-Encoding is hop-by-hop too: the pool gets the body the gateway read, framed anew."""
    gw = gateway()
    head = ["POST /v1/chat/completions HTTP/1.1", "Host: x", "Transfer-Encoding: chunked"]
    half = len(BODY) // 2
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(part), part) for part in (BODY[:half], BODY[half:])) + b"0\r\n\r\n"
    assert status_of(raw_exchange(gw.url, ("\r\n".join(head) + "\r\n\r\n").encode() + chunks)) == 200
    received = {k.lower(): v for k, v in upstreams.standard.last_headers.items()}
    assert "transfer-encoding" not in received and received["content-length"] == str(len(BODY))
    assert upstreams.standard.last_body is not None and upstreams.standard.last_body["messages"]


@pytest.mark.parametrize("client", ["auto", "aiohttp", "httpx"])
def test_hop_by_hop_response_headers_are_dropped(gateway: StartGateway, client: str) -> None:
    gw = gateway(upstream_client=client)
    extra = {"Connection": "X-Upstream-Hop", "X-Upstream-Hop": "1", "Keep-Alive": "timeout=9", "Trailer": "X-Sum",
             "Upgrade": "h2c", "Proxy-Authenticate": "Basic", "TE": "trailers",
             "Proxy-Authorization": "Basic Zm9vOmJhcg==", "X-Upstream-Kept": "yes"}  # fmt: skip
    headers = {"x-fake-response-headers": orjson.dumps(extra).decode()}
    with httpx.Client(base_url=gw.url) as http:
        r = http.post("/v1/chat/completions", content=BODY, headers=headers)
    assert r.status_code == 200
    names = {k.lower() for k in r.headers}
    assert not names & {"x-upstream-hop", "trailer", "upgrade", "proxy-authenticate", "te", "proxy-authorization"}
    assert r.headers.get("keep-alive") in (None, "timeout=5")  # uvicorn's own, never the upstream's 9 s
    assert r.headers["x-upstream-kept"] == "yes"


SMUGGLING = {
    "content-length and chunked": ["Content-Length: 4", "Transfer-Encoding: chunked"],
    "chunked and content-length": ["Transfer-Encoding: chunked", "Content-Length: 4"],
    "two different content-lengths": ["Content-Length: 4", "Content-Length: 40"],
    "two equal content-lengths": ["Content-Length: 4", "Content-Length: 4"],
    "content-length list": ["Content-Length: 4, 4"],
    "signed content-length": ["Content-Length: +4"],
    "chunked not last": ["Transfer-Encoding: chunked, identity"],
    "unknown coding": ["Transfer-Encoding: xchunked"],
    "space before colon": ["Transfer-Encoding : chunked"],
    "obs-fold": ["Transfer-Encoding: identity", " chunked"],
    "two transfer-encodings": ["Transfer-Encoding: chunked", "Transfer-Encoding: identity"],
    "bare LF between them": ["Transfer-Encoding: chunked\nContent-Length: 4"],
    "content-length with a tab": ["Content-Length:\t4\t4"],
}


@pytest.mark.parametrize("framing", SMUGGLING.values(), ids=list(SMUGGLING))
def test_request_smuggling_is_refused_with_400(gateway: StartGateway, upstreams: Upstreams, framing: list[str]) -> None:
    gw = gateway()
    smuggled = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY) + smuggled
    head = "\r\n".join(["POST /v1/chat/completions HTTP/1.1", "Host: x", "Content-Type: application/json", *framing])
    response = raw_exchange(gw.url, head.encode() + b"\r\n\r\n" + body)
    assert status_of(response) == 400, response[:300]
    assert response.count(b"HTTP/1.1 ") == 1  # the connection ends: nothing after the refused head is read
    assert upstream_requests(upstreams) == []
    with httpx.Client(base_url=gw.url) as http:  # and the gateway serves the next client as usual
        assert http.post("/v1/chat/completions", content=BODY).status_code == 200
    # refused by the HTTP parser (uvicorn's httptools/llhttp, strict), before the gateway's own code runs. Read
    # after the next request: the gateway counts its own refusals just after sending them, and its event loop
    # finishes that before it serves anyone else.
    assert gw.sample("specgate_requests_total", pool="none", reason="rejected", task="none", status="400") == 0
