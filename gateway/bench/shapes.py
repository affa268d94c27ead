"""The OpenAI response shapes both fake upstreams send (``fake_upstream`` for tests, ``lean_upstream`` for
benchmarks), so the gateway's usage counting and the SDK tests see the same bodies from either."""

from __future__ import annotations

import time
from typing import Any


def usage(count: int, prompt: int = 8) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": count, "total_tokens": prompt + count}


def completion(model: str, chat: bool, count: int, served_by: str) -> dict[str, Any]:
    """A whole ``chat.completion`` / ``text_completion`` of ``count`` tokens, with usage."""
    text = " ".join(["tok"] * count)
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {
        "index": 0, "text": text}  # fmt: skip
    choice["finish_reason"] = "length"
    return {
        "id": "cmpl-fake",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(count),
        "served_by": served_by,
    }


def stream_event(model: str, chat: bool, index: int, count: int) -> dict[str, Any]:
    """Event ``index`` of a ``count``-event stream (the last one carries ``finish_reason``)."""
    delta = {"delta": {"content": f"t{index} "}} if chat else {"text": f"t{index} "}
    finish = "length" if index == count - 1 else None
    return {
        "id": "cmpl-fake",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, **delta, "finish_reason": finish}],
    }


def usage_event(count: int, prompt: int = 8) -> dict[str, Any]:
    """The extra event a stream ends with when ``stream_options.include_usage`` is set."""
    return {"choices": [], "usage": usage(count, prompt)}


def role_choice() -> dict[str, Any]:
    """The choice of vLLM's first chat stream event: the role, no content yet."""
    return {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}


def continued(event: dict[str, Any], start: int) -> dict[str, Any]:
    """An event of a continuation (``start`` > 0: a stream that went on from ``start`` earlier tokens) carries
    its own id and created time, as a new request's would."""
    return {**event, "id": "cmpl-fake-continued", "created": 1} if start else event
