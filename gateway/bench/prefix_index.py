"""``specgate bench prefix-index``: what the prefix index costs, in memory and per request.

Memory: synthetic multi-turn chats (a few shared system prompts, a distinct opening question per session, each
later turn resending the history with an answer and a question more) are read by :class:`PrefixReader` and
recorded in a :class:`PrefixIndex` over a number of replicas, each session on its own replica; the index's
memory is measured with ``tracemalloc`` (what the index's module allocated and still holds once every session
was recorded; other threads' allocations are left out).
It is bounded by replicas x capacity, whatever the number of sessions. Time: the read (blocks and session key)
of a typical chat prompt, a short one, and one past the read bound, and a lookup and a record.
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from gateway import prefix_index as prefix_index_module
from gateway.prefix_index import BLOCKS_PER_REPLICA, READ_BYTES, PrefixIndex, PrefixReader

_WORDS = ("soil", "garden", "river", "budget", "kernel", "thread", "poem", "lemma", "invoice", "orbit", "tariff")


def _system(template: int) -> str:
    return f"You are assistant #{template} of a support desk. " + "Answer politely, cite the manual. " * 40


def session_messages(session: int, turns: int, templates: int = 8) -> list[list[dict[str, Any]]]:
    """The requests of one synthetic session, turn by turn (each one resends the history)."""
    words = " ".join(_WORDS[(session * 7 + i) % len(_WORDS)] for i in range(40))
    history: list[dict[str, Any]] = [
        {"role": "system", "content": _system(session % templates)},
        {"role": "user", "content": f"Session {session}: a question about {words}?"},
    ]
    requests = [list(history)]
    for turn in range(1, turns):
        history += [
            {"role": "assistant", "content": f"Answer {turn} for session {session}. " + words * 2},
            {"role": "user", "content": f"Follow-up {turn}: and what about {_WORDS[turn % len(_WORDS)]}?"},
        ]
        requests.append(list(history))
    return requests


@dataclass(frozen=True)
class MemoryResult:
    sessions: int
    replicas: int
    capacity: int
    values_held: int
    bytes_held: int
    later_turn_hit_share: float  # expected hit share of turns >= 2 on their session's replica

    @property
    def bytes_per_value(self) -> float:
        return self.bytes_held / self.values_held if self.values_held else 0.0


def measure_memory(
    sessions: int, replicas: int = 4, turns: int = 3, capacity: int = BLOCKS_PER_REPLICA
) -> MemoryResult:
    reader = PrefixReader()
    tracemalloc.start()
    try:
        index = PrefixIndex(capacity)
        hits = queried = 0
        for session in range(sessions):
            replica = f"http://replica-{session % replicas}:8000"
            for turn, messages in enumerate(session_messages(session, turns)):
                blocks = reader.chat(messages, None, {})[0]
                hit = index.record(replica, blocks)
                if turn:
                    hits, queried = hits + hit, queried + len(blocks)
        # what was allocated in the index's module and is still held: not the process's total, which any other
        # thread (a test's server, a timer) moves while the sessions are recorded
        own = tracemalloc.Filter(True, prefix_index_module.__file__)
        held = sum(stat.size for stat in tracemalloc.take_snapshot().filter_traces([own]).statistics("filename"))
    finally:
        tracemalloc.stop()
    values = sum(index.held(f"http://replica-{r}:8000") for r in range(replicas))
    return MemoryResult(sessions, replicas, capacity, values, held, hits / queried if queried else 0.0)


def _median_us(call: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - started) / 1000)
    return statistics.median(samples)


def measure_time(rounds: int = 20_000) -> dict[str, float]:
    """Median microseconds of each step on this machine."""
    reader, index = PrefixReader(), PrefixIndex()
    typical = session_messages(1, 2)[1]  # a system prompt, a question, an answer and a follow-up
    size = sum(len(m["content"]) for m in typical)
    short = [{"role": "user", "content": "What is the capital of France?"}]
    long = [{"role": "user", "content": "x" * (4 * READ_BYTES)}]
    blocks = reader.chat(typical, None, {})[0]
    index.record("a", blocks)
    return {
        f"read a typical chat ({size:,} characters, {len(blocks)} values)": _median_us(
            lambda: reader.chat(typical, None, {}), rounds
        ),
        "read a short chat (one question)": _median_us(lambda: reader.chat(short, None, {}), rounds),
        f"read a {4 * READ_BYTES // 1024} KiB prompt (read bound {READ_BYTES // 1024} KiB)": _median_us(
            lambda: reader.chat(long, None, {}), rounds
        ),
        "expected_hit on one replica (typical chat, all held)": _median_us(
            lambda: index.expected_hit("a", blocks), rounds
        ),
        "record on one replica (typical chat)": _median_us(lambda: index.record("a", blocks), rounds),
    }


def main(sessions: int, replicas: int, turns: int, capacity: int, rounds: int) -> int:
    console = Console(width=120)
    timing = Table(title=f"specgate bench prefix-index: microseconds per call, median of {rounds} (this machine)")
    timing.add_column("what")
    timing.add_column("median us", justify="right")
    for name, value in measure_time(rounds).items():
        timing.add_row(name, f"{value:.2f}")
    console.print(timing)
    result = measure_memory(sessions, replicas, turns, capacity)
    memory = Table(title="prefix index memory (tracemalloc: held after every session was recorded)")
    for column in ("sessions", "turns each", "replicas", "capacity / replica", "values held", "bytes", "bytes / value",
                   "later turns' expected hit"):  # fmt: skip
        memory.add_column(column, justify="right")
    memory.add_row(
        f"{result.sessions:,}", str(turns), str(result.replicas), f"{result.capacity:,}", f"{result.values_held:,}",
        f"{result.bytes_held:,}", f"{result.bytes_per_value:.0f}", f"{result.later_turn_hit_share:.1%}",
    )  # fmt: skip
    console.print(memory)
    return 0
