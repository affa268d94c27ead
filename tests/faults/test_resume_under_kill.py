"""Resumed streams under load when replicas die: every stream complete, or visibly failed; never short and silent.

Two emulated replicas per pool (``specgate emulate``, separate processes, EMULATED), ``specgate serve`` in front
with the shipped rules plus ``resume: {streams: true}``, 16 closed-loop streaming clients (half pinned to each
pool; ``max_tokens`` 60, ``ignore_eos``, ``stream_options.include_usage``: each stream a few hundred ms), one
replica of each pool SIGKILLed while it relays streams. A stream the client reads to its end is either
complete (one finish_reason, ``data: [DONE]``, a usage event whose completion tokens are the tokens of the
answer's text, all ``max_tokens`` of them, and whose prompt tokens are the request's) or it ends with the error
event. Run with ``-s`` for the figures.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from backends.workloads.loader import count_prompt_tokens, count_tokens
from gateway.rules import default_rules_path
from tests.faults.procs import MODEL, Proc, emulator_replica, gateway_proc, metric, replica_state, running, wait_ready
from tests.signals.servers import wait_until

pytestmark = pytest.mark.slow

MAX_TOKENS = 60
MESSAGES = [{"role": "user", "content": " the answer is a simple way to think about it."}]  # the emulator's words
PROMPT_TOKENS = count_prompt_tokens(MESSAGES)
SPEED = 8.0  # 60 tokens of the a100-70b-draft profile: about 0.23 s on a standard replica
CLIENTS = 16


@dataclass
class Stream:
    pool: str
    status: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False  # `data: [DONE]` arrived
    after_done: int = 0  # events after it
    broken: list[bytes] = field(default_factory=list)  # `data:` lines that are not JSON
    exception: str | None = None

    @property
    def text(self) -> str:
        return "".join(c["delta"].get("content") or "" for e in self.events for c in e.get("choices", []))

    def verdict(self) -> str:
        """Complete, failed (the error event ends it), or what is wrong with it."""
        if self.exception is not None or self.status != 200 or self.broken or self.after_done:
            return f"status {self.status}, {self.exception}, broken {self.broken[:1]}, after [DONE] {self.after_done}"
        if self.events and "error" in self.events[-1] and not self.done:
            error = self.events[-1]["error"]
            return "failed" if error.get("message") and error.get("type") else f"error event {error}"
        finishes = [c["finish_reason"] for e in self.events for c in e.get("choices", []) if c.get("finish_reason")]
        usage = [e["usage"] for e in self.events if e.get("usage")]
        tokens = count_tokens(self.text)  # the emulator's tokens: one per word or punctuation mark
        whole = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": tokens, "total_tokens": PROMPT_TOKENS + tokens}
        if self.done and len(finishes) == 1 and usage == [whole] and tokens == MAX_TOKENS:
            return "complete"
        return f"short and silent? done {self.done}, finishes {finishes}, usage {usage}, {tokens} tokens"


async def read_stream(session: aiohttp.ClientSession, url: str, stream: Stream) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with session.post(url, json=body, headers={"x-specgate-pool": stream.pool}) as response:
        stream.status = response.status
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            if stream.done:
                stream.after_done += 1
            elif line == b"data: [DONE]":
                stream.done = True
            else:
                try:
                    stream.events.append(orjson.loads(line[6:]))
                except orjson.JSONDecodeError:
                    stream.broken.append(line)


async def clients(url: str, stop: asyncio.Event, streams: list[Stream]) -> None:
    """``CLIENTS`` closed-loop streaming clients, half pinned to each pool, until ``stop`` is set."""

    async def client(pool: str) -> None:
        while not stop.is_set():
            stream = Stream(pool)
            streams.append(stream)
            try:
                await read_stream(session, f"{url}/v1/chat/completions", stream)
            except (TimeoutError, aiohttp.ClientError) as exc:
                stream.exception = f"{type(exc).__name__}: {exc}"

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        await asyncio.gather(*(client("standard" if i % 2 else "speculative") for i in range(CLIENTS)))


async def run_and_kill(gw: Proc, victims: list[Proc], after_s: float) -> list[Stream]:
    """Load the gateway; SIGKILL the victims once each relays streams; go on ``after_s``; every stream read."""
    streams: list[Stream] = []
    stop = asyncio.Event()
    task = asyncio.create_task(clients(gw.url, stop, streams))

    def relaying() -> bool:
        return all(replica_state(gw, victim.url)["inflight"] >= 2 for victim in victims)

    try:
        await asyncio.to_thread(wait_until, relaying, 20, "streams in flight on both victims", 0.02)
        for victim in victims:
            victim.kill()
        await asyncio.sleep(after_s)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=60)  # a hang fails the test here instead of stalling CI
    return streams


def resume_rules(workdir: Path) -> Path:
    rules = yaml.safe_load(default_rules_path().read_text(encoding="utf-8"))
    rules["resume"] = {"streams": True}
    path = workdir / "rules.yaml"
    path.write_text(yaml.safe_dump(rules, allow_unicode=True), encoding="utf-8")
    return path


def test_streams_cut_by_sigkill_are_resumed_complete_or_fail_visibly(tmp_path: Path) -> None:
    std = [emulator_replica(tmp_path, f"standard-{i}", False, SPEED) for i in range(2)]
    spec = [emulator_replica(tmp_path, f"speculative-{i}", True, SPEED) for i in range(2)]
    # every client sends the same prompt: the prefix index would keep them all on the replica that holds it (by
    # design, within its load slack), and this test needs streams on both victims
    gw = gateway_proc(tmp_path, [p.url for p in std], [p.url for p in spec], rules_file=resume_rules(tmp_path),
                      idle_timeout_s=5, first_byte_timeout_s=10, breaker_cooldown_s=30,
                      prefix_index="off")  # fmt: skip
    with running(*std, *spec, gw):
        wait_ready(gw)
        started = time.monotonic()
        streams = asyncio.run(run_and_kill(gw, [std[0], spec[0]], after_s=2.0))
        elapsed = time.monotonic() - started
        verdicts: dict[str, int] = {}
        for stream in streams:
            verdict = stream.verdict()
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
        resumed = {o: metric(gw, "specgate_stream_resumes_total", outcome=o) for o in ("ok", "ended", "failed")}
        print(f"\n{len(streams)} streams in {elapsed:.1f} s, one replica of each pool SIGKILLed: {verdicts}")
        print(f"  resumes: {resumed}")
        bad = {v: n for v, n in verdicts.items() if v not in ("complete", "failed")}
        assert not bad, bad
        assert resumed["ok"] + resumed["ended"] >= 1, "the kills should have cut streams that were then resumed"
        assert verdicts.get("complete", 0) >= len(streams) - resumed["failed"]
