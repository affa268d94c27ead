"""An approximate index of the prompt prefixes each replica was recently sent: where a prompt is likely cached.

vLLM's automatic prefix caching keeps the KV blocks of prompts it has seen and skips their prefill when a
new prompt starts the same way (a conversation's next turn, a shared system prompt or tool list). The gateway
does not see the engines' caches; it remembers what it sent where, in the same shape:

- **Blocks of text, chained.** A request's text (the chat's messages in order, each as its role and its
  content's text parts; or a completion's prompt) is encoded as UTF-8 and cut into :data:`BLOCK_BYTES`-byte
  blocks. A block is known by a CRC-32 running over every byte up to its end (so equal values mean equal
  prefixes) with that end's offset in the high bits. No tokenizer: 512 bytes are ~128 tokens of English or code
  and ~120-170 of CJK (3 bytes a character), so a block is about eight of vLLM's 16-token blocks in any script,
  which a character count is not (512 CJK characters are ~400+ tokens). Why not smaller: the cost is per block
  (~0.3 us each here) and the prefill a coarser block leaves unmatched (under 128 tokens a prompt) is small.
  A trailing partial block has no value, as in vLLM. A message's serialization does not change when more
  messages follow it, so a conversation's next turn starts with the previous turn's blocks.
- **The first turn's mark.** A chat's values also hold one for its first turn (everything up to the end of the
  first user message), in its place among the blocks: a later turn of the same conversation matches it even when
  the first turn was shorter than a block (a short opening question), and a conversation that only shares the
  system prompt does not. It is also the session key's source.
- **Why CRC-32.** It is a standard, unkeyed function (the same value in every process and on every machine,
  unlike Python's salted ``hash()`` of str/bytes), and zlib computes it incrementally, so chaining costs one call
  a block: a 3 KiB prompt takes ~2 us where a chained 8-byte blake2b takes 5-10 us (measured; ``hash()`` of a
  tuple of ints is stable but needs a stable hash of each block's bytes first, ~10 us). 32 bits are enough for a
  routing hint: with the block's offset beside it, a false match needs two different prefixes of the same length
  to collide (about 1 in 4 billion per lookup per value held).
- **Bounded reading.** Only the first ``read_bytes`` bytes (default 16 KiB, 32 blocks) are read: the work is
  linear in them and bounded however long the prompt. A prompt's first 16 KiB already tells which replica
  holds its conversation; its expected hit is a share of what was read.
- **Per replica, an LRU of values** with a capacity (``prefix_index_blocks_per_replica``), evicted oldest first
  as the engine evicts free blocks. A prompt's values are refreshed tail first, so its head is the most recent
  and is evicted last (vLLM frees a finished request's blocks last block first). Memory is bounded by replicas x
  capacity whatever the number of sessions (``specgate bench prefix-index`` measures it).

A **session key** comes with the values (:func:`session_key`): a digest of the client's ``x-session-id`` header
where it sends one; else the first turn's mark (its length and CRC-32) with the OpenAI ``user`` field run into
the CRC, so that two users who open with the same words are two sessions (a completion prompt's: its first
:data:`SESSION_BYTES` characters, or 256 token ids). It is the same on every turn and on every gateway replica.
Two sessions share a key only if their first turns have the same length and CRC (about 1 in 4 billion a pair).

Pure: no clock, no I/O. Nothing is shared between gateway replicas: each keeps the index of what it sent.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from zlib import crc32

Blocks = tuple[int, ...]
# a request's chained values, its session key and the bytes of text they were read from (a tuple: cheap)
PromptPrefix = tuple[Blocks, str | None, int]

BLOCK_BYTES = 512  # ~128 tokens of English or code, ~120-170 of CJK: about eight of vLLM's 16-token KV blocks
READ_BYTES = 16 * 1024  # default bound on the text read per request (32 blocks)
# Default capacity: 2,048 blocks x ~128 tokens = ~262k tokens, about 60 % of the KV cache of an 8B model on one
# 80 GB H100 (the emulator's h100-8b profile holds 430k tokens); the rest is the running requests' own.
BLOCKS_PER_REPLICA = 2048
SESSION_BYTES = 1024  # a completion prompt's session key: its first KiB (a chat's: its first turn)
SESSION_HEADER = "x-session-id"
_MARK = 1 << 62  # tags the first turn's value (a block's value is its end offset << 32 | its CRC: below 2^52)
_MAX_USER = 256  # characters of the `user` field or the header read into the session key
_ROLE_END, _MESSAGE_END = "\x1f", "\x1e"


class PrefixReader:
    """Reads a request's values and session key (stateless; one per rule set)."""

    def __init__(self, read_bytes: int = READ_BYTES) -> None:
        self.read_bytes = read_bytes

    def chat(self, messages: Sequence[Mapping[str, Any]], user: Any, headers: Mapping[str, str]) -> PromptPrefix:
        """A validated chat's messages (``extract_features`` checked them) and its ``user`` field."""
        text, first_turn = chat_text(messages, self.read_bytes)
        if text.isascii():
            data = text.encode("ascii")
        else:
            data = text.encode("utf-8", "surrogatepass")
            if first_turn < len(text):  # the first turn's end in bytes (no second encoding when it is all)
                first_turn = len(text[:first_turn].encode("utf-8", "surrogatepass"))
            else:
                first_turn = len(data)
        data = data[: self.read_bytes]
        blocks = chain(data)
        end = min(first_turn, len(data))
        mark = _MARK | end << 32 | _crc_at(data, blocks, end)
        full = end // BLOCK_BYTES
        return (*blocks[:full], mark, *blocks[full:]), session_key(headers, user, mark), len(data)

    def completion(self, prompt: Any, user: Any, headers: Mapping[str, str]) -> PromptPrefix:
        """A validated completion prompt: a string, strings (the first is read), token ids, or lists of them."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            data = prompt[: self.read_bytes].encode("utf-8", "surrogatepass")[: self.read_bytes]
        else:
            try:
                data = array("I", prompt).tobytes()[: self.read_bytes]  # 4 bytes a token: a block is 128 tokens
            except (OverflowError, TypeError):
                return (), session_key(headers, user, None), 0
        blocks = chain(data)
        end = min(SESSION_BYTES, len(data))
        return blocks, session_key(headers, user, end << 32 | _crc_at(data, blocks, end)), len(data)


def chat_text(messages: Sequence[Mapping[str, Any]], limit: int) -> tuple[str, int]:
    """The messages serialized in order (role, content's text), at most ``limit`` characters (every character
    is at least one byte: enough for ``limit`` bytes), and where the first user message ends in it."""
    parts: list[str] = []
    size, first_turn = 0, -1
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(
                p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text" and isinstance(
                    p.get("text"), str)
            )  # fmt: skip
        elif not isinstance(content, str):
            content = ""
        role = message["role"]
        piece = f"{role}{_ROLE_END}{content[: limit - size]}{_MESSAGE_END}"
        parts.append(piece)
        size += len(piece)
        if first_turn < 0 and role == "user":
            first_turn = size
        if size >= limit:
            break
    text = "".join(parts)
    return text, first_turn if 0 <= first_turn <= len(text) else len(text)


def chain(data: bytes) -> Blocks:
    """The chained values of ``data``'s full blocks: each block's CRC-32 over ``data`` up to its end, with the end
    offset above bit 32."""
    if len(data) < BLOCK_BYTES:  # most prompts of one short question: no range, list and tuple to build
        return ()
    crc, values = 0, []
    for end in range(BLOCK_BYTES, len(data) + 1, BLOCK_BYTES):
        crc = crc32(data[end - BLOCK_BYTES : end], crc)
        values.append(end << 32 | crc)
    return tuple(values)


def _crc_at(data: bytes, blocks: Blocks, end: int) -> int:
    """The CRC-32 of ``data[:end]``: continued from the last full block before ``end`` (one short call)."""
    full = end // BLOCK_BYTES
    crc = blocks[full - 1] & 0xFFFFFFFF if full else 0
    return crc32(data[full * BLOCK_BYTES : end], crc)


def cached_tokens(blocks: Sequence[int], hit: int, read_bytes: int, prompt_tokens: int) -> int:
    """The prompt tokens expected cached when its first ``hit`` values are held: the share of the text read
    (``read_bytes``) up to the last held value's end, of the request's ``prompt_tokens`` (its estimate). A prompt
    longer than what was read counts as what was read: its unread tail is judged by its head (a conversation's
    history is read first)."""
    if hit <= 0 or read_bytes <= 0:
        return 0
    end = (blocks[hit - 1] & (_MARK - 1)) >> 32  # the offset above bit 32 (a first turn's mark: its end)
    return min(prompt_tokens, prompt_tokens * end // read_bytes)


def session_key(headers: Mapping[str, str], user: Any, mark: int | None) -> str | None:
    """The client's ``x-session-id`` (a digest of it), else the first turn's ``mark`` (its end and CRC-32, the
    ``user`` field's bytes run into the CRC): ``"h:<16 hex>"`` or ``"p:<end hex>.<8 hex>"``."""
    header = headers.get(SESSION_HEADER)
    if header:
        digest = hashlib.blake2b(header[:_MAX_USER].encode("utf-8", "replace"), digest_size=8).hexdigest()
        return "h:" + digest
    if mark is None:
        return None
    crc = mark & 0xFFFFFFFF
    if isinstance(user, str) and user:
        crc = crc32(user[:_MAX_USER].encode("utf-8", "replace"), crc)
    # %-formatting, not an f-string: compiled, the f-string took 0.34 us more (a third of the key)
    return "p:%x.%08x" % ((mark & (_MARK - 1)) >> 32, crc)  # noqa: UP031


class PrefixIndex:
    """Per replica (by URL: one engine, one cache), the block values recently sent there, LRU-bounded."""

    def __init__(self, blocks_per_replica: int = BLOCKS_PER_REPLICA) -> None:
        if blocks_per_replica < 1:
            raise ValueError("blocks_per_replica must be at least 1")
        self.capacity = blocks_per_replica
        self._replicas: dict[str, OrderedDict[int, None]] = {}

    def expected_hit(self, replica: str, blocks: Sequence[int]) -> int:
        """How many leading blocks of the prompt the replica is expected to hold (the lookup stops at the first
        block it does not hold, as the engine's does). Reading does not refresh them: only sending does."""
        held = self._replicas.get(replica)
        if held is None:
            return 0
        found = 0
        for block in blocks:
            if block not in held:
                break
            found += 1
        return found

    def record(self, replica: str, blocks: Sequence[int]) -> int:
        """The prompt was sent to the replica: its blocks become the most recent there, the head last (so that it
        is evicted after the tail), and the oldest past the capacity go. Returns the expected hit it had."""
        held = self._replicas.get(replica)
        if held is None:
            held = self._replicas[replica] = OrderedDict()
        hit = self.expected_hit(replica, blocks)
        for block in reversed(blocks):
            if block in held:
                held.move_to_end(block)
            else:
                held[block] = None
        while len(held) > self.capacity:
            held.popitem(last=False)
        return hit

    def held(self, replica: str) -> int:
        """Blocks held for the replica."""
        held = self._replicas.get(replica)
        return len(held) if held is not None else 0

    def keep(self, replicas: Iterable[str]) -> None:
        """Forget the replicas not in ``replicas`` (a reload removed them)."""
        wanted = set(replicas)
        for url in [u for u in self._replicas if u not in wanted]:
            del self._replicas[url]
