"""The KV-event index and its subscriber, without an engine: synthetic events in vLLM's wire format (a ZMQ
multipart of topic, sequence number and a msgpack ``KVEventBatch``) published to the subscriber's socket."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest
import zmq

from gateway.bench.kv_events import TOPIC, EventIndex, Subscriber
from gateway.servers import free_port

SIZE = 4


def stored(hashes: list[int], tokens: list[int], parent: int | None = None) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": SIZE, "lora_id": None, "medium": "CPU", "lora_name": None}  # fmt: skip


def batch(*events: dict[str, Any]) -> list[Any]:
    return [time.time(), list(events), None]


def test_blocks_chain_over_token_ids_and_a_lookup_stops_at_the_first_missing_one() -> None:
    index = EventIndex()
    index.apply(batch(stored([11, 12], [1, 2, 3, 4, 5, 6, 7, 8]), stored([13], [9, 10, 11, 12], parent=12)))
    prompt = list(range(1, 15))  # 14 tokens: blocks 1-4, 5-8, 9-12 held, and two more tokens
    assert index.block_size == SIZE and index.blocks == 3
    assert index.cached(prompt) == 12
    assert index.cached(prompt[:12]) == 8  # the engine computes the last prompt token: its block is not a hit
    assert index.cached([1, 2, 3, 4, 99, 6, 7, 8, 9]) == 4  # a different second block: the chain breaks there
    assert index.cached([5, 6, 7, 8, 1, 2, 3, 4, 0]) == 0  # the same tokens elsewhere are another block
    index.apply(batch({"type": "BlockRemoved", "block_hashes": [12], "medium": None}))
    assert index.cached(prompt) == 4 and index.removed == 1  # the rest of the chain is unreachable, as in vLLM
    index.apply(batch({"type": "AllBlocksCleared"}))
    assert index.cached(prompt) == 0 and index.blocks == 0 and index.cleared == 1


def test_a_block_whose_parent_was_never_seen_matches_nothing() -> None:
    index = EventIndex()
    index.apply(batch(stored([21], [5, 6, 7, 8], parent=999)))
    assert index.cached([5, 6, 7, 8, 9]) == 0 and index.stored == 1


def test_a_block_two_engine_hashes_share_stays_until_both_go() -> None:
    index = EventIndex()
    index.apply(batch(stored([1], [1, 2, 3, 4]), stored([2], [1, 2, 3, 4])))
    index.apply(batch({"type": "BlockRemoved", "block_hashes": [1, 404]}))
    assert index.cached([1, 2, 3, 4, 5]) == 4
    index.apply(batch({"type": "BlockRemoved", "block_hashes": [2]}))
    assert index.cached([1, 2, 3, 4, 5]) == 0


def test_the_subscriber_binds_on_loopback_and_applies_what_an_engine_publishes() -> None:
    """vLLM's publisher connects to a non-wildcard endpoint; ours binds it (nothing listens beyond loopback)."""
    subscriber = Subscriber(free_port())
    assert subscriber.endpoint.startswith("tcp://127.0.0.1:")
    subscriber.start()
    context = zmq.Context()
    publisher = context.socket(zmq.PUB)
    publisher.setsockopt(zmq.LINGER, 0)
    publisher.connect(subscriber.endpoint)
    try:
        encoder = msgspec.msgpack.Encoder()
        deadline = time.monotonic() + 10
        sequence = 0
        while subscriber.batches == 0 and time.monotonic() < deadline:  # a SUB joins late: publish until heard
            payload = encoder.encode(batch(stored([sequence + 100], [1, 2, 3, 4])))
            publisher.send_multipart((TOPIC, sequence.to_bytes(8, "big"), payload))
            sequence += 1
            time.sleep(0.05)
        publisher.send_multipart((b"other", b"0", b"ignored"))  # another topic: not subscribed
        publisher.send_multipart((TOPIC, b"1"))  # malformed: skipped
        time.sleep(0.2)
    finally:
        publisher.close()
        context.term()
        subscriber.stop()
    assert subscriber.batches >= 1 and subscriber.bytes > 0
    assert subscriber.index.cached([1, 2, 3, 4, 5]) == 4
    assert subscriber.decode_s >= 0 and subscriber.apply_s >= 0


@pytest.mark.parametrize("argv", [["--concurrency", "0"], ["--turns", "0"]])
def test_cli_refuses_bad_numbers(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    assert main(["bench", "kv-events", *argv]) == 2
    assert ">= 1" in capsys.readouterr().out
