"""Small helpers the benchmarks share: free ports, waiting for a server, percentiles."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import httpx


def wait_http(url: str, timeout_s: float = 30.0, method: str = "GET") -> None:
    """Wait until something answers HTTP at ``url`` (any status)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.request(method, url, timeout=1.0, json={})
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing answered at {url} within {timeout_s}s") from None
            time.sleep(0.05)


def percentile(values: Sequence[float], pct: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))
    return ordered[rank]
