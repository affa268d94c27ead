"""A prefix-aware, load-aware replica choice: the simulator's stand-in for a cache-aware router.

The rule (:func:`prefix_choice`): among the replicas whose in-flight count is at most the least-loaded
replica's plus a slack (:data:`SLACK_REQUESTS` requests or :data:`SLACK_SHARE` of that count, the larger),
the one whose prefix cache holds the most leading blocks of the request wins; ties go to the fewest in
flight, then to the first. So a session's next turn returns to the replica that holds its history unless that
replica is much busier than the least-loaded one, and a request that no cache holds goes to the least loaded.

The simulator reads each replica's cache as it is (``PrefixCache.lookup``), as a router fed by the engines'
KV-cache events would; in-flight counts are the router's own. Pure: no engine, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SLACK_REQUESTS = 8
SLACK_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class Candidate:
    cached_blocks: int  # leading blocks of the request that the replica's prefix cache holds
    inflight: int  # requests the router has in flight there


def load_limit(least: int) -> float:
    """The most in flight a replica may have and still win on its cache, given the least-loaded one's count."""
    return least + max(SLACK_REQUESTS, SLACK_SHARE * least)


def prefix_choice(candidates: Sequence[Candidate]) -> int:
    """The index of the chosen candidate (see the module's rule)."""
    if not candidates:
        raise ValueError("no replica to choose from")
    limit = load_limit(min(c.inflight for c in candidates))
    eligible = [i for i, c in enumerate(candidates) if c.inflight <= limit]
    return min(eligible, key=lambda i: (-candidates[i].cached_blocks, candidates[i].inflight, i))
