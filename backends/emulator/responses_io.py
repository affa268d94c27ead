"""The Responses API (``/v1/responses``) as vLLM 0.32's OpenAI server reads and writes it, for the emulator.

A request's ``instructions`` and ``input`` become chat messages, so the workload's ground truth (keyed by the
messages) applies to it as to a chat request. Bodies and stream events follow vLLM's shapes
(``ResponsesResponse``; ``event: <type>`` + ``data:`` SSE events from ``response.created`` to
``response.completed``). Responses are kept for ``GET /v1/responses/{id}``, as vLLM does with
``VLLM_ENABLE_RESPONSES_API_STORE=1``.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from backends.emulator import openai_io as io
from backends.emulator.prompt_blocks import chat_blocks
from backends.workloads.loader import content_text, count_prompt_tokens, prompt_key

RESPONSES = "responses"
STORE_LIMIT = 1024  # responses kept for GET /v1/responses/{id}, oldest dropped first


def parse_responses(raw: bytes, served_model: str, max_model_len: int, prefix_blocks: bool = False) -> io.ParsedRequest:
    body = io.json_object(raw)
    model = body.get("model", served_model)
    if model != served_model:
        raise io.RequestError(404, f"The model `{model}` does not exist.", "model")
    messages = _messages(body)
    prompt_tokens = count_prompt_tokens(messages)
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise io.RequestError(400, "'max_output_tokens' must be a positive integer", "max_output_tokens")
    if prompt_tokens + (max_tokens or 1) > max_model_len:
        raise io.RequestError(400, f"This model's maximum context length is {max_model_len} tokens.", "input")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise io.RequestError(400, "'stream' must be a boolean", "stream")
    text = "\n".join(content_text(m.get("content")) for m in messages)
    hashes = chat_blocks(messages) if prefix_blocks else None
    return io.ParsedRequest(
        RESPONSES, str(model), prompt_key(messages), text, prompt_tokens, max_tokens, stream, True, block_hashes=hashes
    )


def _messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise io.RequestError(400, "'instructions' must be a string", "instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    items = body.get("input")
    if isinstance(items, str):
        return [*system, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise io.RequestError(400, "'input' must be a string or a non-empty list of items", "input")
    messages: list[Mapping[str, Any]] = list(system)
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise io.RequestError(400, f"input[{index}] must be an object", "input")
        if isinstance(item.get("role"), str):
            messages.append({"role": item["role"], "content": item.get("content")})
    return messages


class ResponseStore:
    """Finished responses by id (the emulator's stand-in for vLLM's in-memory response store)."""

    def __init__(self, limit: int = STORE_LIMIT) -> None:
        self._limit = limit
        self._bodies: OrderedDict[str, bytes] = OrderedDict()

    def put(self, rid: str, body: bytes) -> None:
        self._bodies[rid] = body
        while len(self._bodies) > self._limit:
            self._bodies.popitem(last=False)

    def __contains__(self, rid: str) -> bool:
        return rid in self._bodies

    def get(self, rid: str) -> bytes:
        body = self._bodies.get(rid)
        if body is None:
            raise io.RequestError(404, f"Response with id '{rid}' not found.", "response_id")
        return body

    def cancel(self, rid: str) -> bytes:
        """vLLM's answer for a response that is not running in the background (every emulated one)."""
        self.get(rid)
        raise io.RequestError(400, "Cannot cancel a synchronous response.", "response_id")


def response_object(
    request: io.ParsedRequest, rid: str, created: int, text: str | None, finish: str | None, completion_tokens: int
) -> dict[str, Any]:
    """vLLM's ``ResponsesResponse``: in progress (``text`` None) or finished."""
    done = text is not None
    output = [_message(rid, text or "", "completed")] if done else []
    status = "in_progress" if not done else "incomplete" if finish == "length" else "completed"
    usage = None
    if done:
        usage = {
            "input_tokens": request.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": request.prompt_tokens + completion_tokens,
        }
    return {
        "id": rid,
        "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": None,
        "metadata": None,
        "model": request.model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "background": False,
        "max_output_tokens": request.max_tokens or 0,
        "previous_response_id": None,
        "reasoning": None,
        "service_tier": "auto",
        "status": status,
        "text": None,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
    }


def _message(rid: str, text: str, status: str) -> dict[str, Any]:
    content = [_text_part(text)] if status == "completed" else []
    return {"id": f"msg_{rid[5:]}", "type": "message", "role": "assistant", "status": status, "content": content}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def new_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


class EventWriter:
    """vLLM's SSE events for one streamed response, numbered in order."""

    def __init__(self, request: io.ParsedRequest, rid: str, created: int) -> None:
        self.request, self.rid, self.created = request, rid, created
        self.sequence = 0
        self.item_id = f"msg_{rid[5:]}"

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {**fields, "sequence_number": self.sequence, "type": kind}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def opening(self) -> Iterator[bytes]:
        started = response_object(self.request, self.rid, self.created, None, None, 0)
        yield self.event("response.created", response=started)
        yield self.event("response.in_progress", response=started)
        yield self.event("response.output_item.added", output_index=0, item=_message(self.rid, "", "in_progress"))
        where = {"output_index": 0, "item_id": self.item_id, "content_index": 0}
        yield self.event("response.content_part.added", **where, part=_text_part(""))

    def delta(self, text: str) -> bytes:
        where = {"content_index": 0, "output_index": 0, "item_id": self.item_id}
        return self.event("response.output_text.delta", **where, delta=text, logprobs=[])

    def closing(self, final: dict[str, Any], text: str) -> Iterator[bytes]:
        where = {"output_index": 0, "item_id": self.item_id, "content_index": 0}
        yield self.event("response.output_text.done", **where, text=text, logprobs=[])
        yield self.event("response.content_part.done", **where, part=_text_part(text))
        yield self.event("response.output_item.done", output_index=0, item=final["output"][0])
        yield self.event("response.completed", response=final)
