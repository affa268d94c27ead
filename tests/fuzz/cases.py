"""Raw HTTP cases for the socket fuzzer: each a category, the bytes to send and how the client behaves after.

Every generator takes a seeded ``random.Random`` so a run is repeatable; ``plan(rng, scale)`` returns the
batches the fuzzer runs (one per category), with the number of cases each gets at ``scale`` 1.
"""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# Cases each fuzz test ran in this session, by test module: test_zz_case_budget.py checks the sum.
RAN: Counter[str] = Counter()

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
FAKE = [("x-fake-chunks", "2")]  # keeps the fake upstream's answers short


@dataclass(frozen=True)
class Case:
    category: str
    data: bytes
    mode: str = "send"  # send: send, then read | halfclose: send, shut the write side, read | stall: send, wait
    json_level: bool = False  # the bytes are a well-framed HTTP request: the gateway itself must answer it


def request(
    body: bytes,
    path: str = CHAT,
    headers: list[tuple[str, str]] | None = None,
    content_length: int | None = None,
    method: str = "POST",
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close", "Content-Type: application/json"]
    lines.append(f"Content-Length: {len(body) if content_length is None else content_length}")
    lines += [f"{k}: {v}" for k, v in (FAKE if headers is None else headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunked(body_chunks: bytes, path: str = CHAT, extra: list[tuple[str, str]] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close", "Transfer-Encoding: chunked"]
    lines += [f"{k}: {v}" for k, v in FAKE + (extra or [])]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body_chunks


def chat_body(content: Any = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], "max_tokens": 2, **extra}


def completion_body(prompt: Any = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "prompt": prompt, "max_tokens": 2, **extra}


VALID = json.dumps(chat_body()).encode()


def valid_request() -> bytes:
    return request(VALID)


# -- JSON level ---------------------------------------------------------------------------------------------
def _random_body(rng: random.Random) -> tuple[str, dict[str, Any]]:
    stream = rng.random() < 0.4
    if rng.random() < 0.7:
        system = [{"role": "system", "content": rng.choice(["You are a translator.", "You write code.", ""])}]
        body = chat_body(rng.choice(["hi", "Translate: 你好", "```py\nx=1\n```"]), stream=stream)
        body["messages"] = system + body["messages"] if rng.random() < 0.5 else body["messages"]
        return CHAT, body
    return COMPLETIONS, completion_body(rng.choice(["hi", ["a", "b"], [1, 2, 3]]), stream=stream)


_INSERTS = [b"{", b"}", b"[", b"]", b'"', b",", b":", b"\\", b"\x00", b"NaN", b"Infinity", b"'", b"/*", b"\n", b"-"]


def malformed_json(rng: random.Random) -> Case:
    path, raw = mutated_body(rng)
    return Case("malformed json", request(raw, path), json_level=True)


def mutated_body(rng: random.Random) -> tuple[str, bytes]:
    """A valid body (chat or completions) with one random mutation, and the path it was meant for."""
    path, body = _random_body(rng)
    raw = json.dumps(body).encode()
    cut = rng.randrange(len(raw) + 1)
    mutation = rng.randrange(9)
    if mutation == 0:
        raw = raw[:cut]  # truncated (Content-Length says so: a complete request with a broken body)
    elif mutation == 1:
        raw = raw[:cut] + rng.choice(_INSERTS) + raw[cut:]
    elif mutation == 2:
        raw = raw[:cut] + raw[cut + rng.randint(1, 8) :]
    elif mutation == 3:
        raw = raw + rng.choice([b"x", b"}", b" {}", b"\x00", b",", b"[]"])
    elif mutation == 4:
        raw = rng.choice([b"", b" ", b"null", b"true", b"1", b'"s"', b"[]", b"[{}]", b"\xef\xbb\xbf{}", b"{}"])
    elif mutation == 5:
        raw = raw.replace(b'"', b"'")
    elif mutation == 6:
        raw = raw[:cut] + bytes([rng.randrange(256)]) + raw[cut + 1 :]
    elif mutation == 7:
        raw = raw.replace(b":", b"=", 1) if rng.random() < 0.5 else raw.replace(b",", b",,", 1)
    else:
        raw = b'{"model": 1e999, "messages": [NaN]}' if rng.random() < 0.5 else b'{"a":1,"a":2,' * 3 + b"}"
    return path, raw


WRONG_VALUES: list[Any] = [
    None, True, False, 0, -1, 1.5, -0.0, 2**63 - 1, -(2**63), 2**64 - 1, 1e308, -1e308, "", "x", "1", "true",
    [], [1], [None], {}, {"a": 1}, [[[]]], {"role": "user"},
]  # fmt: skip
CHAT_PATHS = [
    ("model",), ("messages",), ("messages", 0), ("messages", 0, "role"), ("messages", 0, "content"),
    ("messages", 0, "content", 0), ("messages", 0, "content", 0, "text"), ("messages", 0, "content", 0, "type"),
    ("max_tokens",), ("max_completion_tokens",), ("n",), ("stream",), ("temperature",), ("stream_options",),
    ("stream_options", "include_usage"), ("top_p",), ("stop",), ("user",),
]  # fmt: skip
COMPLETION_PATHS = [("prompt",), ("prompt", 0), ("prompt", 0, 0), ("model",), ("max_tokens",), ("n",), ("stream",)]


def _set(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    """``body`` with ``value`` at ``path``, creating the containers on the way (lists get one element)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = list(body) if isinstance(body, list) and body else [{"type": "text", "text": "hi"}]
        items[0] = _set(items[0], rest, value)
        return items
    out = dict(body) if isinstance(body, dict) else {}
    out[head] = _set(out.get(head), rest, value)
    return out


def wrong_types() -> Iterator[Case]:
    """Every wrong-type value in every field, chat and completions, plain and streaming (deterministic)."""
    for stream in (False, True):
        for kind, base, paths in (("chat", chat_body(stream=stream), CHAT_PATHS),
                                  ("completions", completion_body(stream=stream), COMPLETION_PATHS)):  # fmt: skip
            if kind == "chat":
                base["messages"][0]["content"] = [{"type": "text", "text": "hi"}]
            for field in paths:
                for value in WRONG_VALUES:
                    body = json.dumps(_set(copy.deepcopy(base), field, value)).encode()
                    yield Case("wrong types", request(body, CHAT if kind == "chat" else COMPLETIONS), json_level=True)


def deep_nesting(rng: random.Random) -> Case:
    depth = rng.choice([64, 512, 1024, 1025, 4096, 50_000])
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
    nested = opener * depth + b"1" + closer * depth
    where = rng.randrange(4)
    if where == 0:
        raw = nested
    elif where == 1:
        raw = b'{"model":"fake-model","max_tokens":2,"messages":[{"role":"user","content":' + nested + b"}]}"
    elif where == 2:
        raw = b'{"model":"fake-model","max_tokens":2,"prompt":"hi","extra":' + nested + b"}"
    else:
        raw = b'{"model":"fake-model","max_tokens":2,"messages":' + nested + b"}"
    return Case("deep nesting", request(raw, COMPLETIONS if where == 2 else CHAT), json_level=True)


def huge(rng: random.Random) -> Case:
    size = rng.choice([10_000, 60_000, 150_000])
    kind = rng.randrange(7)
    if kind == 0:
        body: Any = chat_body(messages=None)
        body["messages"] = [{"role": "user", "content": "x"}] * (size // 30)
    elif kind == 1:
        body = completion_body(list(range(size // 8)))
    elif kind == 2:
        body = chat_body("word " * (size // 5))
    elif kind == 3:
        body = chat_body("hi", model="m" * size)
    elif kind == 4:
        body = {**chat_body(), **{f"k{i}": i for i in range(size // 12)}}
    elif kind == 5:
        body = chat_body("翻译" * (size // 7))
    else:
        body = chat_body("\u0000\\\"" * (size // 12))
    return Case("huge arrays and strings", request(json.dumps(body).encode(), COMPLETIONS if kind == 1 else CHAT),
                json_level=True)  # fmt: skip


_BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe4\xb8", b"\xf4\x90\x80\x80",
             b"\x80", b"\\ud800", b"\\udc00\\ud800", b"\\ud83d", b"\\u0000", b"\xf0\x9f\x98"]  # fmt: skip


def invalid_utf8(rng: random.Random) -> Case:
    bad = rng.choice(_BAD_UTF8)
    where = rng.randrange(6)
    if where == 4:  # in a header value and in the URL (httptools takes bytes; the gateway decodes latin-1)
        raw = request(VALID, headers=[*FAKE, ("x-note", "caf")])[:-len(VALID)].replace(b"caf", b"caf" + bad)
        return Case("invalid utf-8", raw + VALID, json_level=True)
    if where == 5:
        return Case("invalid utf-8", request(VALID, path=CHAT).replace(CHAT.encode(), CHAT.encode() + bad, 1))
    template = [
        b'{"model":"fake-model","max_tokens":2,"messages":[{"role":"user","content":"a@b"}]}',
        b'{"model":"fake@model","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}',
        b'{"model":"fake-model","max_tokens":2,"messages":[{"role":"system","content":"@"},{"role":"user","content":"x"}]}',
        b'{"model":"fake-model","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"k@":1}',
    ][where]
    return Case("invalid utf-8", request(template.replace(b"@", bad)), json_level=True)


# -- framing level ------------------------------------------------------------------------------------------
def truncated(rng: random.Random, mode: str) -> Case:
    """Content-Length promises more than is sent; the client then shuts its write side or stalls."""
    raw = request(VALID, content_length=len(VALID) + rng.randint(1, 5000))
    if rng.random() < 0.3:  # or the head itself stops half way
        head_end = raw.index(b"\r\n\r\n")
        raw = raw[: rng.randrange(1, head_end)]
    else:
        raw = raw[: len(raw) - rng.randrange(0, len(VALID))]
    return Case(f"truncated ({mode})", raw, mode=mode)


def oversized(rng: random.Random, limit: int) -> Case:
    big = json.dumps(chat_body("x" * (limit + rng.randint(1, 40_000)))).encode()
    kind = rng.randrange(3)
    if kind == 0:
        return Case("oversized", request(big))
    if kind == 1:  # declared too large, little sent: the gateway refuses on the header alone
        return Case("oversized", request(b"{}", content_length=limit * 4), mode="halfclose")
    step = rng.choice([4096, 65536])
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(big[i : i + step]), big[i : i + step]) for i in range(0, len(big), step))
    return Case("oversized", chunked(chunks + b"0\r\n\r\n"))


def _chunks(body: bytes, rng: random.Random) -> bytes:
    out, i = b"", 0
    while i < len(body):
        n = rng.randint(1, 40)
        out += b"%x\r\n%s\r\n" % (len(body[i : i + n]), body[i : i + n])
        i += n
    return out


def bad_chunked(rng: random.Random) -> Case:
    good = _chunks(VALID, rng)
    kind = rng.randrange(12)
    tail = b"0\r\n\r\n"
    data = [
        good + tail,  # well formed: must succeed
        b"zz\r\n" + VALID + b"\r\n" + tail,  # size not hex
        b"%x\r\n%s\r\n" % (len(VALID) + 5, VALID) + tail,  # size larger than the data
        b"%x\r\n%s\r\n" % (len(VALID) - 5, VALID) + tail,  # size smaller than the data
        good.replace(b"\r\n", b"\n") + b"0\n\n",  # bare LF
        b"-5\r\n" + VALID + b"\r\n" + tail,
        b"ffffffffffffffffffff\r\n" + VALID + b"\r\n" + tail,  # size overflows
        good.replace(b"\r\n", b";ext=\x01\r\n", 1) + tail,  # chunk extension with a control byte
        good,  # no last chunk (then half-close)
        good + b"0\r\nX-Trailer: \x00\r\n\r\n",  # trailer with NUL
        good + b"0\r\n" + b"X-T: v\r\n" * 3000 + b"\r\n",  # many trailers
        b"%x\r\n%s\r\n" % (len(VALID), VALID[:-3]) + b"\xff\xfe\xfd" + b"\r\n" + tail,
    ][kind]
    extra = [("Content-Length", str(len(data)))] if rng.random() < 0.15 else None  # both CL and TE
    mode = "halfclose" if kind == 8 else "send"
    return Case("bad chunked", chunked(data, rng.choice([CHAT, COMPLETIONS]), extra), mode=mode)


def headers(rng: random.Random) -> Case:
    kind = rng.randrange(12)
    many = [(f"x-h{i}", "v" * 30) for i in range(3000)]
    variants: list[tuple[list[tuple[str, str]], bool]] = [  # (headers, json_level)
        ([("x-big", "a" * rng.choice([70_000, 300_000]))], False),
        (many, False),
        ([(f"x-h{i}", "v") for i in range(400)], True),
        ([("x-mid", "b" * 40_000)], True),
        ([], False),  # a long query string (below)
        ([("x-dup", str(i)) for i in range(500)], True),
        *(([bad], False) for bad in [("x bad", "v"), ("x-nul", "a\x00b"), ("", "v"), ("x-fold", "a\r\n b"),
                                      ("x-ctl", "\x01\x7f")]),
    ]
    name = rng.choice(["x-specgate-pool", "x-specgate-objective", "x-specgate-slo-ttft-ms", "x-specgate-slo-e2e-ms"])
    value = rng.choice(["nan", "inf", "-1", "0", "1e400", "abc", "", "100", "standard", "speculative", "e2e", "\xff"])
    variants.append(([(name, value)], True))  # the gateway's own headers, any value: 2xx or OpenAI-shaped 4xx
    extra, json_level = variants[kind]
    path = CHAT + "?" + "q" * rng.choice([1000, 80_000]) if kind == 4 else CHAT
    return Case("huge and many headers", request(VALID, path, headers=[*FAKE, *extra]), json_level=json_level)


_REQUEST_LINES = [
    b"POST /v1/chat/completions\r\n", b"POST  /v1/chat/completions HTTP/1.1\r\n",
    b"post /v1/chat/completions HTTP/1.1\r\n",
    b"POST /v1/chat/completions HTTP/2.0\r\n", b"POST /v1/chat/completions HTTP/1.0\r\n", b"GET /\r\n",
    b"POST http://evil.example/v1/chat/completions HTTP/1.1\r\n", b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n",
    b"POST /v1/../v1/chat/completions HTTP/1.1\r\n", b"POST /v1/chat/completions%00 HTTP/1.1\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"POST * HTTP/1.1\r\n",
    b"DELETE /v1/chat/completions HTTP/1.1\r\n", b"POST /v1/chat/completions HTTP/1.1 extra\r\n",
    b"POST\t/v1/chat/completions\tHTTP/1.1\r\n", b"X" * 200 + b" / HTTP/1.1\r\n",
]  # fmt: skip


def garbage(rng: random.Random) -> Case:
    kind = rng.randrange(4)
    if kind == 0:
        data = rng.randbytes(rng.randint(1, 3000))
    elif kind == 1:
        data = bytes(rng.choice(b"abcXYZ019 :/\r\n\t{}\"") for _ in range(rng.randint(1, 800)))
    elif kind == 2:
        line = rng.choice(_REQUEST_LINES)
        head = request(VALID).split(b"\r\n", 1)[1]
        data = line + head
    else:  # a valid request with random bytes flipped anywhere
        flipped = bytearray(valid_request())
        for _ in range(rng.randint(1, 6)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        data = bytes(flipped)
    return Case("garbage bytes", data, mode="halfclose" if rng.random() < 0.5 else "send")


@dataclass(frozen=True)
class Batch:
    category: str
    cases: list[Case]
    concurrency: int


def plan(rng: random.Random, scale: float, body_limit: int) -> list[Batch]:
    def n(count: int) -> int:
        return max(1, int(count * scale))

    def make(count: int, fn: Callable[[random.Random], Case]) -> list[Case]:
        return [fn(rng) for _ in range(n(count))]

    types = list(wrong_types())
    return [
        Batch("malformed json", make(1000, malformed_json), 24),
        Batch("wrong types", types[: n(len(types))], 24),
        Batch("deep nesting", make(150, deep_nesting), 16),
        Batch("huge arrays and strings", make(60, huge), 8),
        Batch("invalid utf-8", make(400, invalid_utf8), 24),
        Batch("truncated (halfclose)", make(250, lambda r: truncated(r, "halfclose")), 24),
        Batch("truncated (stall)", make(300, lambda r: truncated(r, "stall")), 300),
        Batch("oversized", make(45, lambda r: oversized(r, body_limit)), 8),
        Batch("bad chunked", make(600, bad_chunked), 24),
        Batch("huge and many headers", make(200, headers), 12),
        Batch("garbage bytes", make(1000, garbage), 24),
    ]
