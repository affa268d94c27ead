"""How much generation a request body asks for: its length bound and how many sequences it generates.

One place for the fields that bound generation, in every spelling an engine accepts, so that a key's
``max_tokens`` cap and its token limit read the same numbers on every endpoint (routed and pass-through).

- The length bound of one completion: ``max_tokens``, ``max_completion_tokens`` (chat) and
  ``max_output_tokens`` (the Responses API), whichever the endpoint reads. vLLM's request models read one of
  them each (chat: ``max_completion_tokens`` first), and coerce ``"100000"`` or ``100000.0`` to an integer
  (pydantic's lax mode). So every spelling present is checked, the largest counts, and a value that is not a
  JSON integer is refused (400) instead of being read one way here and another way by the engine.
- The number of sequences: ``n`` (and vLLM's ``best_of``, the larger of the two) times the number of prompts of
  a ``/v1/completions`` batch (a list of strings or of token-id lists), or of conversations in
  ``/v1/chat/completions/batch``. The cap is per completion; the token limit is charged
  ``prompt + sequences x max_tokens`` up front.

Pure functions of the parsed body; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import InvalidRequest

LENGTH_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
SEQUENCE_FIELDS = ("n", "best_of")


def _positive(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"'{name}' must be a positive integer", param=name)
    return value


def length_bound(body: Mapping[str, Any]) -> tuple[str, int] | None:
    """The largest length bound the body gives, with its field's name; None when it gives none.
    Any length field present that is not a positive JSON integer is a 400 naming it."""
    best: tuple[str, int] | None = None
    for name in LENGTH_FIELDS:
        value = _positive(body, name)
        if value is not None and (best is None or value > best[1]):
            best = (name, value)
    return best


def sequences(body: Mapping[str, Any]) -> int:
    """Sequences generated per prompt: the larger of ``n`` and ``best_of`` (1 when neither is given)."""
    count = 1
    for name in SEQUENCE_FIELDS:
        value = _positive(body, name)
        if value is not None and value > count:
            count = value
    return count


def prompt_count(prompt: Any) -> int:
    """Prompts in a completions ``prompt``: a list of strings or of token-id lists is a batch, one each."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return len(prompt)
    return 1
