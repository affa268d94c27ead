"""What the gateway learns from a finished request, as a deployment really reports it (the simulator's side).

Two things decide it. **Usage on streams**: a non-streamed reply always carries ``usage``; a stream carries it
only when its request asked (``stream_options.include_usage``), and vLLM puts a request's spec-decode metrics
in that usage chunk. A stream without usage is counted by the gateway as its events (the role event and one
per engine step), each worth the acceptance length the model learned as of its last refresh, else the pool's
mean from the scraped counters, else 1 (``GatewayState.learn``); its acceptance is unknown. **Per-request
spec-decode metrics**: only a speculative engine run with ``--per-request-spec-decode-metrics`` reports a
request's acceptance at all (the scraped counters, pool-wide totals, are there either way).

The default is what the gateway sees once it asks for usage on every stream it forwards, in front of the
shipped manifests (which run the speculative pool with per-request metrics): ``full``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gateway.adaptive.model import LatencyModel


@dataclass(frozen=True, slots=True)
class Telemetry:
    name: str
    spec_metrics: bool  # the speculative engine reports each request's acceptance (in its usage)
    stream_usage: float  # the share of streams that carry usage (a client's choice, or the gateway's ask)


FULL = Telemetry("full", spec_metrics=True, stream_usage=1.0)
TELEMETRY = {
    t.name: t
    for t in (
        FULL,
        Telemetry("no-spec-metrics", spec_metrics=False, stream_usage=1.0),
        Telemetry("no-usage", spec_metrics=True, stream_usage=0.0),  # no stream asks: today's gateway, if none do
        Telemetry("mixed", spec_metrics=True, stream_usage=0.5),  # half the clients ask for usage
        Telemetry("bare", spec_metrics=False, stream_usage=0.0),  # neither
    )
}


def usage_draw(seed: int, index: int) -> float:
    """A uniform number per request, the same in every policy's run of the arrivals: whether its client
    asked for usage (a stream carries it when the draw is under ``stream_usage``). A hash, not the arrivals'
    random stream, so that adding it left the arrivals as they were."""
    digest = hashlib.blake2b(f"{seed}:usage:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def has_usage(telemetry: Telemetry, stream: bool, draw: float) -> bool:
    return not stream or draw < telemetry.stream_usage


def estimated_tokens(
    events: int, model: LatencyModel | None, pool: str, segment: str, scraped_acceptance_length: float | None
) -> int:
    """The gateway's count of a stream that carried no usage (``GatewayState.learn`` with ``counted=False``):
    ``events`` is what it relayed before ``[DONE]`` (the role event, then one per engine step), each step
    worth the acceptance length the model had learned for the segment on the pool, else the pool's scraped
    mean, else 1. It is circular on a speculative pool: the length it counts with is the one it learns."""
    per_event = (
        (model.acceptance_length(pool, segment) if model is not None else None) or scraped_acceptance_length or 1.0
    )
    return round(1 + max(events - 1, 0) * per_event)
