"""Reading an OpenAI-style event stream in tests: its events, their JSON, the text of the content deltas."""

from __future__ import annotations

from typing import Any

import httpx
import orjson


def events(response: httpx.Response) -> list[bytes]:
    """The stream's events (each ``data: ...``), after checking it answered 200 and ended on an event boundary."""
    assert response.status_code == 200, response.text
    assert response.content.endswith(b"\n\n")
    return [event for event in response.content.split(b"\n\n") if event]


def parsed(raw: list[bytes]) -> list[dict[str, Any]]:
    """The JSON of every event before ``[DONE]`` (each must be a whole ``data:`` line)."""
    assert all(event.startswith(b"data: ") for event in raw), raw
    return [orjson.loads(event[6:]) for event in raw if event != b"data: [DONE]"]


def text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["delta"].get("content") or "" for e in chunks for c in e.get("choices", []))
