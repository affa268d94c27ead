"""A prompt's KV block hashes, from its text, without a tokenizer: what the emulator's prefix cache looks up.

The prompt is cut into the tokens the emulator already counts for ``usage.prompt_tokens``
(``reading.count_tokens``: a word, a CJK character or a punctuation mark) plus the chat template's tokens,
so the token list is exactly ``prompt_tokens`` long: per message ``<|im_start|>``, the role, a newline, its
text and ``<|im_end|>`` (the 4 template tokens ``count_prompt_tokens`` adds), then ``<|im_start|> assistant``
(the 2 that open the answer); a completion prompt is a begin-of-text token and its text. The list is cut into
16-token blocks and chain-hashed (``prefix_cache.chain_hashes``). A message rendered this way does not change
when more messages follow it, so a conversation's next turn starts with the previous turn's blocks, and
requests that share a system prompt share its blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from backends.emulator.prefix_cache import chain_hashes
from backends.emulator.reading import split_tokens
from backends.workloads.loader import content_text

_START, _END, _BEGIN = "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"


def chat_tokens(
    messages: Sequence[Mapping[str, Any]], continue_final: bool = False, salt: str | None = None
) -> list[str]:
    """The chat's prompt as tokens; ``continue_final``: the last message stays open after the answer's opening.
    ``salt`` marks the role token of the first message after the system prompt, so that everything from there
    on hashes apart from another chat with the same text (the simulator's repeated sessions are other users)."""
    closed = messages[:-1] if continue_final else messages
    tokens: list[str] = []
    for message in closed:
        role = str(message.get("role", ""))
        if salt is not None and role not in ("system", "developer"):
            role, salt = f"{role}\x1f{salt}", None
        tokens += [_START, role, "\n"]
        tokens += split_tokens(content_text(message.get("content")))
        tokens.append(_END)
    tokens += [_START, "assistant"]
    if continue_final:
        tokens += split_tokens(content_text(messages[-1].get("content")))
    return tokens


def chat_blocks(
    messages: Sequence[Mapping[str, Any]], continue_final: bool = False, salt: str | None = None
) -> tuple[int, ...]:
    return chain_hashes(chat_tokens(messages, continue_final, salt))


def completion_blocks(prompt: str) -> tuple[int, ...]:
    return chain_hashes([_BEGIN, *split_tokens(prompt)])
