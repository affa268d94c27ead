"""``specgate bench kv-events``: what consuming vLLM's KV-cache events would cost the gateway, and what it would
know that the approximate prefix index (``gateway/prefix_index.py``) does not (issue 29: "if vLLM's KV-cache
events can be consumed cheaply, a precise mode may follow; say what you measured").

One real CPU engine (the standard CPU manifest) runs with ``--kv-events-config`` (ZMQ) and
``--enable-prompt-tokens-details`` (each answer's usage then says how many prompt tokens the engine found
cached). For an endpoint that is not a wildcard, vLLM's publisher *connects*: this process binds the SUB
socket on 127.0.0.1 and the engine connects to it (so nothing listens beyond loopback). Conversations from the
shipped session files run turn by turn, each next turn resending the engine's own answers, ``concurrency`` at
a time. Before each request is sent, both indexes predict its cached prompt tokens:

- **precise** (:class:`EventIndex`): the engine's stored blocks as its events told them (each ``BlockStored``
  carries the block's token ids and its parent's hash; ``BlockRemoved`` and ``AllBlocksCleared`` take them
  away), keyed by a chain over token ids; the request is tokenized as the engine renders it
  (:class:`ChatTokenizer`: the model's chat template and ``tokenizer.json``) and its full blocks looked up in
  order, as vLLM's prefix cache does (never the prompt's last token);
- **approximate**: the gateway's index of the text it sent (``PrefixReader.chat``, ``PrefixIndex``), given the
  true prompt length so that only the index is judged.

Measured: the event stream (batches, events, bytes a second), the consumer's CPU per event (decoding with
msgspec, applying to the index; a thread, off the request path), each index's CPU per request (the precise one
includes the tokenizer, which the request path does not run today), and each index's error against the
engine's own count of cached tokens.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jinja2
import msgspec
import zmq
from jinja2.sandbox import ImmutableSandboxedEnvironment
from rich.console import Console
from rich.table import Table
from tokenizers import Tokenizer

from gateway.bench.sessions import Conversation
from gateway.prefix_index import PrefixIndex, PrefixReader, cached_tokens

TOPIC = b"kv"
REPLICA = "engine"


class ChatTokenizer:
    """A chat's prompt token ids as the engine renders them: the model's chat template (``chat_template.jinja``
    or ``tokenizer_config.json``'s) with the generation prompt, then its ``tokenizer.json`` without special
    tokens added (the template writes them), as vLLM does for a chat completion."""

    def __init__(self, model_dir: Path) -> None:
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        template_file = model_dir / "chat_template.jinja"
        source = template_file.read_text(encoding="utf-8") if template_file.exists() else config.get("chat_template")
        if not isinstance(source, str):
            raise ValueError(f"{model_dir}: no chat template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders it
        self._template = env.from_string(source)
        self._specials = {k: config.get(k) for k in ("bos_token", "eos_token") if isinstance(config.get(k), str)}
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def encode(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        try:
            text = self._template.render(messages=messages, add_generation_prompt=True, **self._specials)
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template: {exc}") from exc
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)


@dataclass
class EventIndex:
    """One engine's cached blocks, as its KV-cache events tell them. A block is known by a chain over token ids
    (its parent's key and its own tokens), so a prompt's blocks can be looked up from its token ids alone."""

    block_size: int = 0  # from the first BlockStored
    _key_of: dict[Any, int] = field(default_factory=dict)  # the engine's block hash -> our chained key
    _held: dict[int, int] = field(default_factory=dict)  # our key -> how many engine blocks hold it
    events: int = 0
    stored: int = 0
    removed: int = 0
    cleared: int = 0

    def apply(self, batch: Sequence[Any]) -> None:
        """One decoded ``KVEventBatch`` (``[ts, events, data_parallel_rank]``; each event a map with its ``type``)."""
        for event in batch[1]:
            self.events += 1
            kind = event.get("type")
            if kind == "BlockStored":
                self._store(event)
            elif kind == "BlockRemoved":
                for engine_hash in event.get("block_hashes") or ():
                    key = self._key_of.pop(engine_hash, None)
                    if key is not None:
                        self.removed += 1
                        left = self._held.get(key, 0) - 1
                        if left > 0:
                            self._held[key] = left
                        else:
                            self._held.pop(key, None)
            elif kind == "AllBlocksCleared":
                self.cleared += 1
                self._key_of.clear()
                self._held.clear()

    def _store(self, event: Mapping[str, Any]) -> None:
        size = int(event.get("block_size") or 0)
        tokens = event.get("token_ids") or []
        if size <= 0:
            return
        self.block_size = self.block_size or size
        parent = event.get("parent_block_hash")
        key = 0 if parent is None else self._key_of.get(parent, -1)
        for index, engine_hash in enumerate(event.get("block_hashes") or ()):
            block = tokens[index * size : (index + 1) * size]
            if len(block) < size:
                break
            key = hash((key, tuple(block)))
            self._key_of[engine_hash] = key
            self._held[key] = self._held.get(key, 0) + 1
            self.stored += 1

    def cached(self, tokens: Sequence[int]) -> int:
        """The prompt tokens the engine would find cached: its full blocks held in order from the first, never
        the last prompt token (the engine computes at least one)."""
        size = self.block_size
        if size <= 0:
            return 0
        key, found = 0, 0
        for start in range(0, len(tokens) - 1 - size + 1, size):
            key = hash((key, tuple(tokens[start : start + size])))
            if key not in self._held:
                break
            found += size
        return found

    @property
    def blocks(self) -> int:
        return len(self._held)


class Subscriber:
    """A thread that binds a SUB socket on 127.0.0.1 and applies every event batch to an :class:`EventIndex`
    (under a lock), timing its own CPU."""

    def __init__(self, port: int) -> None:
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.index = EventIndex()
        self.lock = threading.Lock()
        self.batches = 0
        self.bytes = 0
        self.decode_s = 0.0  # thread CPU decoding
        self.apply_s = 0.0  # thread CPU applying to the index
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(self.endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._decoder = msgspec.msgpack.Decoder()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()
        self._context.term()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._socket.poll(50):
                continue
            parts = self._socket.recv_multipart()
            if len(parts) != 3:
                continue
            payload = parts[2]
            start = time.thread_time()
            batch = self._decoder.decode(payload)
            decoded = time.thread_time()
            with self.lock:
                self.index.apply(batch)
            self.apply_s += time.thread_time() - decoded
            self.decode_s += decoded - start
            self.batches += 1
            self.bytes += len(payload)


@dataclass(frozen=True)
class TurnRecord:
    conversation: str
    turn: int
    prompt_tokens: int  # the engine's
    tokenized: int  # ours (ChatTokenizer): equal when the rendering matches the engine's
    cached: int | None  # the engine's count (None: not reported)
    precise: int
    approximate: int
    precise_s: float  # CPU of the precise lookup (tokenizing included)
    approximate_s: float  # CPU of the approximate one (reading the text's blocks included)


@dataclass
class KvEventsResult:
    turns: list[TurnRecord] = field(default_factory=list)
    seconds: float = 0.0
    batches: int = 0
    events: int = 0
    stored: int = 0
    removed: int = 0
    bytes: int = 0
    decode_s: float = 0.0
    apply_s: float = 0.0
    block_size: int = 0
    blocks_held: int = 0


async def drive(
    url: str, model: str, conversations: Sequence[Conversation], subscriber: Subscriber, tokenizer: ChatTokenizer,
    concurrency: int = 3, max_tokens: int = 48, timeout_s: float = 300.0,
) -> list[TurnRecord]:  # fmt: skip
    """Every conversation turn by turn (``concurrency`` at once), each request predicted by both indexes first."""
    reader, approximate = PrefixReader(), PrefixIndex()
    records: list[TurnRecord] = []
    slots = asyncio.Semaphore(concurrency)

    async def converse(client: httpx.AsyncClient, conversation: Conversation) -> None:
        messages: list[dict[str, Any]] = []
        if conversation.system:
            messages.append({"role": "system", "content": conversation.system})
        async with slots:
            for number, (role, content) in enumerate(conversation.turns, start=1):
                messages.append({"role": role, "content": content})
                start = time.thread_time()
                tokens = tokenizer.encode(messages)
                with subscriber.lock:
                    precise = subscriber.index.cached(tokens)
                precise_s = time.thread_time() - start
                start = time.thread_time()
                blocks, _, read = reader.chat(messages, None, {})
                hit = approximate.expected_hit(REPLICA, blocks)
                guess = cached_tokens(blocks, hit, read, len(tokens))
                approximate_s = time.thread_time() - start
                approximate.record(REPLICA, blocks)
                body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
                response = await client.post(f"{url}/v1/chat/completions", json=body)
                response.raise_for_status()
                data = response.json()
                usage = data.get("usage") or {}
                details = usage.get("prompt_tokens_details") or {}
                records.append(TurnRecord(
                    conversation.id, number, int(usage.get("prompt_tokens") or 0), len(tokens),
                    details.get("cached_tokens"), precise, guess, precise_s, approximate_s,
                ))  # fmt: skip
                messages.append({"role": "assistant", "content": data["choices"][0]["message"]["content"] or ""})

    async with httpx.AsyncClient(timeout=timeout_s) as client:
        await asyncio.gather(*(converse(client, c) for c in conversations))
    return records


def summarize(result: KvEventsResult, subscriber: Subscriber) -> None:
    index = subscriber.index
    result.batches, result.bytes = subscriber.batches, subscriber.bytes
    result.decode_s, result.apply_s = subscriber.decode_s, subscriber.apply_s
    result.events, result.stored, result.removed = index.events, index.stored, index.removed
    result.block_size, result.blocks_held = index.block_size, index.blocks


def _error(records: Sequence[TurnRecord], pick: str) -> tuple[float, float]:
    """Mean absolute error in tokens against the engine's count, and the share predicted exactly."""
    known = [r for r in records if r.cached is not None]
    if not known:
        return float("nan"), float("nan")
    errors = [abs(getattr(r, pick) - (r.cached or 0)) for r in known]
    return statistics.fmean(errors), sum(e == 0 for e in errors) / len(errors)


def report(result: KvEventsResult, console: Console) -> None:
    seconds = max(result.seconds, 1e-9)
    console.print(
        f"kv events over {result.seconds:.1f} s: {result.batches} batches, {result.events} events "
        f"({result.stored} blocks stored, {result.removed} removed), {result.bytes / 1024:.1f} KiB: "
        f"{result.events / seconds:.1f} events/s, {result.bytes / seconds / 1024:.2f} KiB/s; block size "
        f"{result.block_size}, {result.blocks_held} blocks held at the end"
    )
    if result.events:
        console.print(
            f"consumer CPU (a thread, off the request path): decode {result.decode_s / result.events * 1e6:.1f} us "
            f"+ index {result.apply_s / result.events * 1e6:.1f} us per event "
            f"({(result.decode_s + result.apply_s) / seconds * 100:.3f} % of a core)"
        )
    turns = result.turns
    table = Table(title="cached prompt tokens predicted before each request, against the engine's own count")
    for name in ("index", "turns", "mean abs error (tokens)", "exact", "CPU per request p50 (us)", "p99 (us)"):
        table.add_column(name, justify="left" if name == "index" else "right")
    for label, pick, cost in (("precise (events)", "precise", "precise_s"),
                              ("approximate (text)", "approximate", "approximate_s")):  # fmt: skip
        for which, subset in (("all", turns), (">= 2", [t for t in turns if t.turn >= 2])):
            if not subset:
                continue
            mae, exact = _error(subset, pick)
            costs = sorted(getattr(t, cost) * 1e6 for t in subset)
            p99 = costs[min(len(costs) - 1, int(len(costs) * 0.99))]
            table.add_row(f"{label}, turns {which}", str(len(subset)), f"{mae:.1f}", f"{exact:.0%}",
                          f"{statistics.median(costs):.0f}", f"{p99:.0f}")  # fmt: skip
    console.print(table)
    mismatched = sum(t.tokenized != t.prompt_tokens for t in turns)
    console.print(f"tokenized as the engine did: {len(turns) - mismatched} of {len(turns)} prompts "
                  "(the precise lookup needs the engine's exact tokens)")  # fmt: skip


@dataclass(frozen=True)
class KvEventsConfig:
    conversations: Sequence[Conversation]
    concurrency: int = 3
    max_tokens: int = 48
    cpus: Sequence[int] = ()  # the engine's compute threads (empty: vLLM's choice)
    startup_timeout_s: float = 300.0


def bench_kv_events(config: KvEventsConfig, log_dir: Path) -> KvEventsResult:
    """Start the CPU engine with KV-cache events to a SUB socket this process binds, run the conversations, stop."""
    from backends.cpu_engine import CpuEngine, CpuServer, default_cache_dir
    from backends.manifest import load_manifest, pool_path
    from gateway.servers import free_port

    engine = CpuEngine(default_cache_dir())
    manifest = load_manifest(pool_path("standard", cpu=True))
    tokenizer = ChatTokenizer(engine.model_dir(manifest))  # before the socket: a missing model leaves nothing bound
    subscriber = Subscriber(free_port())
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": subscriber.endpoint,
              "topic": TOPIC.decode()}  # fmt: skip
    extra = [*manifest.extra_args, "--kv-events-config", json.dumps(events), "--enable-prompt-tokens-details"]
    server = CpuServer(engine, manifest.model_copy(update={"extra_args": extra}), free_port(),
                       log_dir / "kv-events-engine.log", cpus=config.cpus)  # fmt: skip
    result = KvEventsResult()
    subscriber.start()
    try:
        server.start()
        server.wait_healthy(config.startup_timeout_s)
        start = time.monotonic()
        result.turns = asyncio.run(drive(
            server.url, manifest.served_model_name, config.conversations, subscriber, tokenizer,
            config.concurrency, config.max_tokens,
        ))  # fmt: skip
        time.sleep(0.2)  # the last answers' events
        result.seconds = time.monotonic() - start
    finally:
        server.stop()
        subscriber.stop()
    summarize(result, subscriber)
    return result


def to_json(result: KvEventsResult) -> dict[str, Any]:
    out = asdict(result)
    out["events_per_s"] = result.events / result.seconds if result.seconds else None
    return out
