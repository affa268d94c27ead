"""Usage on every stream: the gateway asks the engine for it, and hands it on only where the client asked.

A stream carries ``usage`` only when its request set ``stream_options.include_usage``; vLLM then ends it with
one event whose ``choices`` is empty and whose ``usage`` holds the exact token counts (and, from an engine run
with ``--per-request-spec-decode-metrics``, the request's acceptance). Without it the gateway can only count
events, and a speculative engine's events hold several tokens each, so what it learns is circular (events x the
acceptance length it already believes). So for a stream whose client did not ask, :func:`ask_usage` adds
``include_usage`` to the body the pool gets, and :class:`UsageStrip` removes that one event from what the client
gets: the client sees the stream it asked for, the gateway learns from the exact figures.

The body is spliced, not re-encoded, when it has no ``stream_options`` at all (the common case: a few hundred
nanoseconds); otherwise it is parsed and re-encoded with the option added (``continuous_usage_stats`` off, so
the engine sends usage once, at the end, as the client would have had it).
"""

from __future__ import annotations

import orjson

_OPTIONS = b'"stream_options"'
_SPLICE = b'{"stream_options":{"include_usage":true},'
_EVENT_END = b"\n\n"
_USAGE = b'"usage":{'
_NO_CHOICES = b'"choices":[]'


def ask_usage(body: bytes) -> tuple[bytes, UsageStrip | None]:
    """The body to forward for a stream, and the filter for its events (None: the client asked for usage itself,
    or the body is not a JSON object the gateway can extend: forwarded as it is).

    ``body`` is a JSON object the route has parsed, with ``"stream": true``."""
    if _OPTIONS not in body:
        start = body.find(b"{")
        if start < 0 or body[:start].strip():
            return body, None
        return _SPLICE + body[start + 1 :], UsageStrip()
    payload = orjson.loads(body)
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body, None  # the client asked: its usage events are its own
    if options is not None and not isinstance(options, dict):
        return body, None  # not ours to fix: the engine answers it with a 400 as it would without the gateway
    payload["stream_options"] = {**(options or {}), "include_usage": True, "continuous_usage_stats": False}
    return orjson.dumps(payload), UsageStrip()


class UsageStrip:
    """Removes the usage-only event (empty ``choices``, a ``usage`` object) from a stream, read by read.

    Whole events pass at once; a read that ends inside an event holds that part back until the event's end
    arrives (the next read, as a rule), so an event is judged whole. A read with no usage in it and ending on an
    event boundary goes through untouched, without a copy."""

    __slots__ = ("pending", "stripped")

    def __init__(self) -> None:
        self.pending = b""
        self.stripped = 0  # usage events removed

    def take(self, chunk: bytes) -> bytes:
        """What of ``chunk`` (after anything held back) goes to the client now."""
        if not self.pending and chunk.endswith(_EVENT_END):  # the common read: whole events, nothing held
            return self._drop(chunk) if _USAGE in chunk else chunk
        data = self.pending + chunk if self.pending else chunk
        cut = data.rfind(_EVENT_END) + 2
        if cut < 2:
            self.pending = data
            return b""
        self.pending = data[cut:]
        ready = data[:cut] if self.pending else data
        return self._drop(ready) if _USAGE in ready else ready

    def end(self, tail: bytes) -> bytes:
        """The stream ended: what is left goes out, a last usage event removed (one with no blank line after
        it too)."""
        data, self.pending = self.pending + tail, b""
        if _USAGE not in data:
            return data
        cut = data.rfind(_EVENT_END) + 2
        head, last = (data[:cut], data[cut:]) if cut >= 2 else (b"", data)
        if _USAGE in last and _NO_CHOICES in last:
            self.stripped += 1
            last = b""
        return (self._drop(head) if _USAGE in head else head) + last

    def _drop(self, ready: bytes) -> bytes:
        kept = []
        for event in ready.split(_EVENT_END):
            if _USAGE in event and _NO_CHOICES in event:
                self.stripped += 1
                continue
            kept.append(event)
        return _EVENT_END.join(kept)
