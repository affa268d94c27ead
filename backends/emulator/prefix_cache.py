"""vLLM's automatic prefix caching, as the emulated engine keeps it: KV blocks by the hash of their prefix.

A request's prompt is cut into blocks of :data:`BLOCK_SIZE` tokens; each full block is known by a hash that
covers every token before its end (a chain: block ``i``'s hash is taken over block ``i - 1``'s hash and block
``i``'s own tokens), so equal hashes mean equal prefixes. The engine asks :meth:`PrefixCache.lookup` how many
leading blocks of a new request are already held, and that part of its prompt is not prefilled again.

A block is *pinned* while a running request uses it (reference counted: requests sharing a system prompt
share its blocks, which then take KV space once) and *free* otherwise. Free blocks stay cached, in LRU order,
in whatever KV space the running requests leave, and are evicted oldest first when running requests need the
room (:meth:`PrefixCache.evict`); pinned blocks are never evicted. As in vLLM, a finished or preempted request
hands its blocks back last block first, so a prompt's tail is evicted before its head.

Pure and clock-free, like the rest of the timing model; the engine (``timing.py``) owns one per engine.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

BLOCK_SIZE = 16  # vLLM's default KV block size (tokens per block) on GPU and CPU


class PrefixCache:
    """Block hashes held by one engine: pinned (with reference counts) and free (LRU, oldest first)."""

    def __init__(self) -> None:
        self._pinned: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    @property
    def pinned_blocks(self) -> int:
        return len(self._pinned)

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def __contains__(self, block: int) -> bool:
        return block in self._pinned or block in self._free

    def lookup(self, hashes: Sequence[int], limit: int) -> int:
        """How many leading blocks of ``hashes`` (at most ``limit``) are held, pinned or free. Like vLLM, the
        search stops at the first block that is not held."""
        found = 0
        for block in hashes[:limit]:
            if block not in self:
                break
            found += 1
        return found

    def pinned_among(self, hashes: Iterable[int]) -> int:
        """How many of ``hashes`` are pinned now (they take no new KV space when another request uses them)."""
        return sum(1 for block in set(hashes) if block in self._pinned)

    def acquire(self, hashes: Iterable[int]) -> None:
        """A request starts to use these blocks: held ones are shared, the others are computed and held."""
        for block in hashes:
            if block in self._pinned:
                self._pinned[block] += 1
            else:
                self._free.pop(block, None)
                self._pinned[block] = 1

    def release(self, hashes: Sequence[int]) -> None:
        """A request stops using these blocks; each one nobody uses any more becomes free, the last block of
        the prompt first (so that it is evicted before the blocks in front of it)."""
        for block in reversed(hashes):
            count = self._pinned.get(block)
            if count is None:
                continue
            if count > 1:
                self._pinned[block] = count - 1
            else:
                del self._pinned[block]
                self._free[block] = None

    def evict(self, blocks: int) -> int:
        """Drop up to ``blocks`` free blocks, least recently freed first; returns how many went."""
        dropped = min(blocks, len(self._free))
        for _ in range(dropped):
            self._free.popitem(last=False)
        self.evictions += dropped
        return dropped


def chain_hashes(tokens: Sequence[str], block_size: int = BLOCK_SIZE) -> tuple[int, ...]:
    """The chained hashes of the full blocks of a token sequence (a stable blake2b, not Python's ``hash``:
    equal in every process). A trailing partial block has no hash, as in vLLM."""
    hashes: list[int] = []
    previous = b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = "\x1f".join(tokens[start : start + block_size]).encode("utf-8", "surrogatepass")
        previous = hashlib.blake2b(previous + b"\x1e" + block, digest_size=8).digest()
        hashes.append(int.from_bytes(previous, "big"))
    return tuple(hashes)
