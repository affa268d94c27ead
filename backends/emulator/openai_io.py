"""OpenAI request parsing and response shapes, as vLLM's OpenAI server reads and writes them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from backends.emulator.prompt_blocks import chat_blocks, completion_blocks
from backends.workloads.loader import content_text, count_prompt_tokens, count_tokens, prompt_key

CHAT = "chat"
COMPLETION = "completion"
_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed", 413: "RequestTooLarge"}


class RequestError(Exception):
    """A request the emulator rejects, with the status and message vLLM would give."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        error_type = _ERROR_TYPES.get(self.status, "BadRequestError")
        return orjson.dumps(
            {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.status}}
        )


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    kind: str  # CHAT or COMPLETION
    model: str
    key: str  # prompt_key of the messages / prompt: looks up the workload's ground truth
    prompt_text: str
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    include_usage: bool
    # vLLM's extension: generate exactly max_tokens, whatever the natural length (vllm bench serve's random
    # dataset sets it so that every request produces the output length it asked for).
    ignore_eos: bool = False
    # A chat that continues its final assistant message (``continue_final_message``): the tokens that message
    # holds. The answer goes on from there, as a model carries on from the last token of its prompt.
    continued: int = 0
    # The prompt's KV block hashes (prompt_blocks.py) when the engine caches prefixes; None when it does not.
    block_hashes: tuple[int, ...] | None = None


def parse_request(
    kind: str, raw: bytes, served_model: str, max_model_len: int, prefix_blocks: bool = False
) -> ParsedRequest:
    """Validate a chat or completion body; ``prefix_blocks``: also hash the prompt's KV blocks."""
    body = json_object(raw)
    model = body.get("model", served_model)
    if model != served_model:
        raise RequestError(404, f"The model `{model}` does not exist.", "model")
    hashes = None
    if kind == CHAT:
        key, text, prompt_tokens, continued = _chat_prompt(body)
        if prefix_blocks:
            hashes = chat_blocks(_messages(body), _flag(body, "continue_final_message", False))
    else:
        prompt = _prompt(body)
        key, text, prompt_tokens, continued = prompt_key(prompt), prompt, count_tokens(prompt) + 1, 0
        hashes = completion_blocks(prompt) if prefix_blocks else None
    max_tokens = _max_tokens(body)
    if prompt_tokens + (max_tokens or 1) > max_model_len:
        raise RequestError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + (max_tokens or 0)} tokens ({prompt_tokens} in the "
            f"messages, {max_tokens or 0} in the completion). Please reduce the length.",
            "max_tokens",
        )
    stream, include_usage = _stream_options(body)
    if body.get("n", 1) not in (1, None):
        raise RequestError(400, "the emulator serves n=1 only", "n")
    ignore_eos = _flag(body, "ignore_eos", False)
    return ParsedRequest(
        kind, str(model), key, text, prompt_tokens, max_tokens, stream, include_usage, ignore_eos, continued, hashes
    )


def _chat_prompt(body: Mapping[str, Any]) -> tuple[str, str, int, int]:
    """A chat's key, text, prompt tokens and, when it continues its final message, that message's tokens."""
    messages = _messages(body)
    key, text, prompt_tokens = prompt_key(messages), _joined(messages), count_prompt_tokens(messages)
    if not _flag(body, "continue_final_message", False):
        return key, text, prompt_tokens, 0
    if _flag(body, "add_generation_prompt", False):  # vLLM refuses both set (an absent one is not)
        raise RequestError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                           "continue_final_message")  # fmt: skip
    continued = count_tokens(content_text(messages[-1].get("content")))
    # that message stays open: its tokens follow the 2 that open an answer, with no end-of-turn tokens
    return key, text, count_prompt_tokens(messages[:-1]) + continued, continued


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise RequestError(400, f"'{name}' must be a boolean", name)
    return value


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    return body


def _messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list", "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(400, f"messages[{index}] must be an object with a string 'role'", "messages")
        if not isinstance(message.get("content"), str | list | None):
            raise RequestError(400, f"messages[{index}].content must be a string or a list of parts", "messages")
    return messages


def _prompt(body: Mapping[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise RequestError(400, "'prompt' must be a non-empty string", "prompt")
    return prompt


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RequestError(400, f"'{name}' must be a positive integer", name)
        return value
    return None


def _stream_options(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be a boolean", "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise RequestError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    if not isinstance(options, dict):
        raise RequestError(400, "'stream_options' must be an object", "stream_options")
    return stream, bool(options.get("include_usage", False))


def _joined(messages: list[Mapping[str, Any]]) -> str:
    return "\n".join(content_text(message.get("content")) for message in messages)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def spec_decode_metrics(k: int, accepted_per_step: list[int], drafted: int | None = None) -> dict[str, Any]:
    """vLLM 0.32's per-request ``metrics.speculative_decoding`` (``--per-request-spec-decode-metrics summary``).
    ``drafted``: the draft tokens of those steps when they are not ``k`` each (a dynamic schedule)."""
    steps = len(accepted_per_step)
    accepted = sum(accepted_per_step)
    drafted = steps * k if drafted is None else drafted
    histogram = [0] * (k + 1)
    for count in accepted_per_step:
        histogram[count] += 1
    return {
        "speculative_decoding": {
            "mean_acceptance_length": round(1 + accepted / steps, 4) if steps else 1.0,
            "draft_acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
            "acceptance_histogram": histogram,
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": drafted,
            "num_spec_tokens": k,
        }
    }


def full_response(
    request: ParsedRequest, rid: str, created: int, text: str, finish: str, completion_tokens: int,
    metrics: Mapping[str, Any] | None = None,
) -> bytes:  # fmt: skip
    if request.kind == CHAT:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return orjson.dumps(
        {
            "id": rid,
            "object": obj,
            "created": created,
            "model": request.model,
            "choices": [choice],
            "usage": usage(request.prompt_tokens, completion_tokens),
            **({"metrics": metrics} if metrics is not None else {}),
        }
    )


def stream_chunk(
    request: ParsedRequest,
    rid: str,
    created: int,
    text: str | None,
    finish: str | None,
    *,
    role: bool = False,
) -> bytes:
    """One SSE event with ``text`` (a chat delta or completion text); ``role`` opens a chat stream."""
    if request.kind == CHAT:
        delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {"content": text or ""}
        if finish is not None and not text:
            delta = {}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return _sse({"id": rid, "object": obj, "created": created, "model": request.model, "choices": [choice]})


def usage_chunk(
    request: ParsedRequest, rid: str, created: int, completion_tokens: int, metrics: Mapping[str, Any] | None = None
) -> bytes:
    obj = "chat.completion.chunk" if request.kind == CHAT else "text_completion"
    return _sse(
        {
            "id": rid,
            "object": obj,
            "created": created,
            "model": request.model,
            "choices": [],
            "usage": usage(request.prompt_tokens, completion_tokens),
            **({"metrics": metrics} if metrics is not None else {}),
        }
    )


DONE = b"data: [DONE]\n\n"


def _sse(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"
