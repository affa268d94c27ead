"""Sends raw cases to a server over fresh TCP connections and records what came back, each under a deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field

import httptools
import orjson

from tests.fuzz.cases import Batch, Case


@dataclass
class Outcome:
    case: Case
    status: int | None = None  # None: no complete response head
    content_type: bytes = b""
    pool: bytes | None = None  # x-specgate-pool: the response came from an upstream through the relay
    body: bytes = b""
    complete: bool = False
    hung: bool = False  # the deadline passed with the connection open and no complete response

    def problem(self) -> str | None:
        """Why this outcome breaks the promises, or None."""
        if self.hung:
            return "hang: no answer and no close before the deadline"
        if self.status is None:
            if self.case.json_level or self.case.mode == "stall":
                return "closed without an answer"
            return None
        if self.status >= 500:
            return f"{self.status} made by the gateway: {self.body[:200]!r}"
        if 400 <= self.status < 500 and self.pool is None:  # made by the gateway (an upstream's is relayed as is)
            return _openai_error_problem(self.body)
        if 200 <= self.status < 300 and self.pool is None:
            return "2xx without x-specgate-pool"
        return None


def _openai_error_problem(body: bytes) -> str | None:
    try:
        error = orjson.loads(body)["error"]
        if set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str):
            return None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    return f"4xx not in OpenAI's error shape: {body[:200]!r}"


class _Response:
    """httptools callbacks collecting one response."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.outcome.content_type = value
        elif name == b"x-specgate-pool":
            self.outcome.pool = value

    def on_headers_complete(self) -> None:
        self.outcome.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.outcome.complete = True
        self.outcome.body = b"".join(self.body)


async def send_case(host: str, port: int, case: Case, deadline_s: float) -> Outcome:
    outcome = Outcome(case)
    response = _Response(outcome)
    try:
        async with asyncio.timeout(deadline_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                await _send(writer, case)
                while not outcome.complete:
                    data = await reader.read(65536)
                    if not data:
                        break
                    response.parser.feed_data(data)
            except (ConnectionError, httptools.HttpParserError):
                pass  # the server closed (maybe after answering): what came back is the outcome
            finally:
                writer.transport.abort()
    except TimeoutError:
        outcome.hung = True
    if outcome.status is not None and not outcome.complete:
        outcome.body = b"".join(response.body)
    return outcome


async def _send(writer: asyncio.StreamWriter, case: Case) -> None:
    try:
        writer.write(case.data)
        await writer.drain()
        if case.mode == "halfclose":
            writer.write_eof()
    except ConnectionError:
        pass  # the server answered and closed before taking everything: read the answer


@dataclass
class BatchReport:
    category: str
    cases: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    problems: list[tuple[str, bytes]] = field(default_factory=list)


async def run_batch(host: str, port: int, batch: Batch, deadline_s: float) -> BatchReport:
    report = BatchReport(batch.category)
    queue = list(reversed(batch.cases))

    async def worker() -> None:
        while queue:
            outcome = await send_case(host, port, queue.pop(), deadline_s)
            report.cases += 1
            report.statuses["hang" if outcome.hung else str(outcome.status or "closed")] += 1
            problem = outcome.problem()
            if problem is not None:
                report.problems.append((problem, outcome.case.data[:300]))

    await asyncio.gather(*(worker() for _ in range(batch.concurrency)))
    return report


async def slow_heads(host: str, port: int, count: int) -> list[asyncio.StreamWriter]:
    """``count`` connections that each send half a request head and then say nothing."""
    writers = []
    for index in range(count):
        _, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nx-slow: " + str(index).encode())
        writers.append(writer)
    await asyncio.gather(*(w.drain() for w in writers))
    return writers


def close_all(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        with contextlib.suppress(Exception):
            writer.transport.abort()
