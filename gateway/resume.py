"""Resuming a chat stream that its replica cut off mid-answer (opt-in: the rules file's ``resume:``).

When a replica dies (or stops sending) after part of a streamed answer reached the client, the gateway can
ask another replica of either pool (same model) to continue that answer instead of ending the stream with an
error event. The continuation request is the original one plus the text relayed so far as a final assistant
message, with vLLM's ``continue_final_message: true`` / ``add_generation_prompt: false`` (the chat template
then ends the prompt inside that message, so the model carries on from the last relayed token), and
``max_tokens`` lowered by what was already sent. Its events are spliced into the same client stream: the
original ``id``/``created``/``model``, no second role announcement, usage summed, one ``data: [DONE]``.

A stream ends as complete only where an engine said the answer ended (a ``finish_reason`` relayed): cut after
that, the gateway adds what the cut took (the usage event the client asked for, counted by another replica's
``/tokenize``, and ``data: [DONE]``). Otherwise it is continued, or it ends with the error event: never short
and silent.

Eligibility is decided once per request (:func:`plan`): ``/v1/chat/completions``, ``stream: true``, ``n`` 1,
no logprobs, no tools that may be called, no structured output (a grammar would restart at the splice), and
the rule on. Only an eligible stream gets a :class:`StreamTap`; an ineligible one costs the relay one
attribute test per chunk. The tap relays the original stream's bytes unchanged but holds back an incomplete
trailing event until its end arrives (the client never sees half an event before a cut), and notes the text
of the content deltas. Events are parsed only on this path (one ``orjson.loads`` per event).

Limits (docs/operating.md): what was sent is counted by the continuing replica's ``/tokenize``; where that
cannot answer, in content events (one token per event on a plain replica, several on a speculative one, so
``max_tokens`` and the summed usage may undercount there) and, for a usage event the cut took, the gateway's
prompt estimate. A sampled continuation is a new draw, not what the dead replica would have said; the splice
re-tokenises the relayed text, which can differ from the tokens the dead replica generated.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson
from starlette.types import Send

from gateway.errors import NoHealthyBackend, UpstreamConnectError, UpstreamError
from gateway.features import RequestFeatures
from gateway.rules import ResumeConfig

if TYPE_CHECKING:
    from gateway.pools import Replica
    from gateway.proxy import _Relay

_DONE = b"data: [DONE]"
# Request fields that make a continuation wrong or impossible to splice (a truthy value disqualifies).
_INELIGIBLE = ("logprobs", "top_logprobs", "prompt_logprobs", "echo", "functions", "use_beam_search",
               "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")  # fmt: skip


def plan(kind: str, features: RequestFeatures, body: bytes, config: ResumeConfig) -> StreamTap | None:
    """A tap for a stream that may be resumed, or None (the request is relayed exactly as without the rule).

    ``body`` is what the gateway forwards (a key's max_tokens cap applied); it parses as a JSON object
    (the route parsed it). Parsing it again costs microseconds, only for chat streams with the rule on.
    """
    if not config.streams or kind != "chat" or not features.stream or features.n != 1:
        return None
    payload = orjson.loads(body)
    return StreamTap(payload, config.max_attempts) if eligible(payload) else None


def eligible(payload: dict[str, Any]) -> bool:
    """Whether a chat stream's answer can be continued from its text alone."""
    if any(payload.get(name) for name in _INELIGIBLE):
        return False
    if payload.get("tools") and payload.get("tool_choice", "auto") != "none":
        return False  # the answer may be (or contain) a tool call: text cannot continue it
    response_format = payload.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type", "text") != "text":
        return False  # json_object / json_schema: the grammar would start over at the splice
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("continuous_usage_stats"):
        return False  # usage on every event would need rewriting per event
    messages = payload.get("messages")
    if payload.get("continue_final_message"):
        last = messages[-1] if isinstance(messages, list) and messages else None
        return isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), str)
    return payload.get("add_generation_prompt", True) is not False


class StreamTap:
    """What one eligible stream needs to be resumed: the text relayed, counts, the stream's identity."""

    __slots__ = ("attempts_left", "base", "created", "done", "finished", "id", "model", "parts", "payload",
                 "pending", "role_sent", "sent", "usage", "usage_sent", "wants_usage")  # fmt: skip

    def __init__(self, payload: dict[str, Any], attempts: int) -> None:
        self.payload = payload
        self.attempts_left = attempts
        self.pending = b""  # an incomplete trailing event, held back until its end arrives
        self.parts: list[str] = []  # the content deltas relayed
        self.sent = 0  # content events relayed (the tokens already sent, on a plain replica)
        self.base = 0  # ``sent`` when the current continuation started (what its usage lacks)
        self.usage: int | None = None  # completion tokens, summed, once a continuation reported usage
        self.id: Any = None
        self.created: Any = None
        self.model: Any = None
        self.role_sent = False
        self.finished = False  # a finish_reason was relayed: the engine said the answer is complete
        self.done = False  # data: [DONE] was relayed
        options = payload.get("stream_options")
        self.wants_usage = isinstance(options, dict) and options.get("include_usage") is True
        self.usage_sent = False  # a usage event was relayed

    # -- the original stream: relayed unchanged ------------------------------------------------------
    def take(self, chunk: bytes) -> bytes:
        """The whole events in what arrived (with any held-back part), to relay now; keeps the rest."""
        ready = self._whole(chunk)
        if ready:
            for event in ready.split(b"\n\n"):
                if event:
                    self._note(event)
        return ready

    def end(self, tail: bytes) -> bytes:
        """The stream ended normally: whatever is held back goes out with its last bytes."""
        rest, self.pending = self.pending + tail, b""
        return rest

    def _whole(self, chunk: bytes) -> bytes:
        data = self.pending + chunk if self.pending else chunk
        cut = data.rfind(b"\n\n") + 2
        if cut < 2:
            self.pending = data
            return b""
        self.pending = data[cut:]
        return data[:cut]

    def _note(self, event: bytes) -> None:
        obj = _parse(event)
        if obj is None:
            self.done = self.done or event.startswith(_DONE)
            return
        if self.id is None and "id" in obj:
            self.id, self.created, self.model = obj.get("id"), obj.get("created"), obj.get("model")
        self.usage_sent = self.usage_sent or isinstance(obj.get("usage"), dict)
        for choice in _choices(obj):
            self._note_choice(choice)

    def _note_choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if delta.get("role"):
                self.role_sent = True
            content = delta.get("content")
            if isinstance(content, str) and content:
                self.parts.append(content)
                self.sent += 1
        if choice.get("finish_reason"):
            self.finished = True

    # -- the continuation ----------------------------------------------------------------------------
    def remaining(self) -> int | None:
        """Tokens the client still allows (None: it set no limit, the replica decides)."""
        for key in ("max_completion_tokens", "max_tokens"):
            value = self.payload.get(key)
            if isinstance(value, int):
                return value - self.sent
        return None

    def continuation(self, remaining: int | None) -> bytes:
        """The request that continues the answer from the text relayed so far."""
        payload = dict(self.payload)
        text = "".join(self.parts)
        if text:
            messages = list(payload["messages"])
            if payload.get("continue_final_message"):  # the client was continuing a message already
                messages[-1] = {**messages[-1], "content": messages[-1]["content"] + text}
            else:
                messages.append({"role": "assistant", "content": text})
            payload.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
        for key in ("max_completion_tokens", "max_tokens"):
            if payload.get(key) is not None:
                payload[key] = remaining
        if isinstance(payload.get("min_tokens"), int):
            payload["min_tokens"] = max(payload["min_tokens"] - self.sent, 0)
        self.base = self.sent
        return orjson.dumps(payload)

    def splice(self, chunk: bytes) -> bytes:
        """A continuation's whole events, rewritten into the original stream (incomplete ones held back)."""
        ready = self._whole(chunk)
        if not ready:
            return b""
        out = []
        for event in ready.split(b"\n\n"):
            if event:
                rewritten = self._rewrite(event)
                if rewritten is not None:
                    out.append(rewritten + b"\n\n")
        return b"".join(out)

    def _rewrite(self, event: bytes) -> bytes | None:
        obj = _parse(event)
        if obj is None:
            if event.startswith(_DONE):
                if self.done:
                    return None
                self.done = True
            return event
        if "error" in obj:
            return event  # the continuation's own in-band error reaches the client as it is
        if self.id is None:  # nothing whole was relayed before the cut: the continuation's identity it is
            self.id, self.created, self.model = obj.get("id"), obj.get("created"), obj.get("model")
        obj.update(id=self.id, created=self.created, model=self.model)
        dropped_role = False
        for choice in _choices(obj):
            delta = choice.get("delta")
            if isinstance(delta, dict) and "role" in delta and self.role_sent:
                del delta["role"]
                dropped_role = True
            self._note_choice(choice)
        if dropped_role and _empty(obj):
            return None  # the continuation's role announcement: the client had one already
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            completion = self.base + usage["completion_tokens"]
            prompt = usage.get("prompt_tokens")
            if isinstance(prompt, int):
                usage["prompt_tokens"] = prompt - self.base  # its prompt held the relayed text's tokens
                usage["total_tokens"] = usage["prompt_tokens"] + completion
            usage["completion_tokens"] = self.usage = completion
            self.usage_sent = True
        return b"data: " + orjson.dumps(obj)

    def ended(self) -> bool:
        """An engine said the answer is complete (a finish_reason, or ``data: [DONE]``, was relayed)."""
        return self.finished or self.done

    def owes_usage(self) -> bool:
        """The answer ended but the usage event the client asked for was not relayed (the cut took it)."""
        return self.wants_usage and not self.usage_sent and not self.done

    def ending(self, prompt: int | None, completion: int | None) -> bytes:
        """What ends a stream whose answer the engine said was complete: the usage event it owes (``prompt``
        and ``completion`` given), then ``data: [DONE]``, unless already relayed."""
        if self.done:
            return b""
        out = b""
        if prompt is not None and completion is not None and self.owes_usage():
            usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
            event = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                     "choices": [], "usage": usage}  # fmt: skip
            out = b"data: " + orjson.dumps(event) + b"\n\n"
            self.usage, self.usage_sent = completion, True
        self.done = True
        return out + _DONE + b"\n\n"


def _parse(event: bytes) -> dict[str, Any] | None:
    if not event.startswith(b"data: ") or event.startswith(_DONE):
        return None
    try:
        obj = orjson.loads(event[6:])
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _choices(obj: dict[str, Any]) -> list[dict[str, Any]]:
    choices = obj.get("choices")
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


def _empty(obj: dict[str, Any]) -> bool:
    """An event that says nothing: every choice's delta empty (or empty content), no finish, no usage."""
    if obj.get("usage"):
        return False
    for choice in _choices(obj):
        delta = choice.get("delta")
        if choice.get("finish_reason") or (isinstance(delta, dict) and any(delta.values())):
            return False
    return True


async def resume_stream(relay: _Relay, send: Send) -> bool:
    """Continue ``relay``'s cut stream on another replica; True when the client's response was ended here
    (a complete answer, or a client gone meanwhile), False to end it with the error event as before."""
    tap, guard = relay.resume, relay._guard
    assert tap is not None and guard is not None and relay.booking is not None
    metrics = relay.state.metrics
    tried = {relay.booking.replica}
    while not tap.ended() and tap.attempts_left > 0:
        tap.attempts_left -= 1
        replica = _book(relay, tap, tried)
        if replica is None:
            break
        try:
            counted = await _count_tokens(relay, replica, _text_fields(tap))
            if counted is not None:  # a speculative replica sends several tokens per event
                tap.sent = counted
            remaining = tap.remaining()
            if remaining is not None and remaining <= 0:
                break  # the limit is used up by this count, yet no engine said the answer ended: not complete
            if await _continue(relay, tap, send, remaining):
                _credit(relay, replica, tap)
                metrics.resumes.labels("ok").inc()
                return True
        except asyncio.CancelledError:
            if not guard.absorb_cancel():
                raise
            if guard.reason == "disconnect":
                relay.status, relay.tokens = 499, tap.sent  # what reached the client, continuation included
                return True
            if guard.reason == "shutdown":
                break
            relay._count_error("timeout")
            replica.breaker.failure()
        except UpstreamError as exc:
            connect = isinstance(exc, UpstreamConnectError)
            relay._count_error("connect" if connect else "upstream")
            if connect:
                replica.set_healthy(False)  # as before a first byte: skipped until its health check passes
            replica.breaker.failure()
        if tap.ended():  # the continuation's answer ended before it was cut
            _credit(relay, replica, tap)
    if tap.ended():  # an engine said the answer ended: the cut took only what follows
        await _end(relay, tap, send, tried)
        return True
    relay.tokens = tap.usage or tap.sent  # what reached the client, continuations included
    metrics.resumes.labels("failed").inc()
    return False


def _book(relay: _Relay, tap: StreamTap, tried: set[Replica]) -> Replica | None:
    """Move the request's booking to a replica not tried yet (None: there is none); arms the deadline."""
    assert relay.booking is not None and relay._guard is not None
    relay.resumed = True
    relay.booking.release()
    remaining = tap.remaining()
    tokens = relay.features.prompt_tokens + (relay.features.max_tokens if remaining is None else max(remaining, 0))
    try:
        relay.booking = relay.state.pools.acquire_retry(
            relay.pool, tokens, frozenset(tried), relay.allowed, relay.features.blocks
        )  # the continuation starts with the request's prompt: a replica holding its prefix is the cheapest
    except NoHealthyBackend:
        return None
    tried.add(relay.booking.replica)
    relay._guard.rearm(relay.state.settings.first_byte_timeout_s)
    return relay.booking.replica


def _credit(relay: _Relay, replica: Replica, tap: StreamTap) -> None:
    """The answer was finished by ``replica``: the request's pool, reason and tokens say so."""
    relay.pool, relay.reason = replica.pool, f"{relay.reason}; resumed: {replica.pool}"
    relay.tokens = tap.usage or tap.sent
    relay.usage = tap.usage


async def _end(relay: _Relay, tap: StreamTap, send: Send, tried: set[Replica]) -> None:
    """End a stream whose answer an engine said was complete (its finish_reason relayed) with what the cut
    took: the usage event the client asked for, and ``data: [DONE]``."""
    prompt = completion = None
    if tap.owes_usage():
        counted = await _usage(relay, tap, tried)
        if counted is None:
            return  # the client went away meanwhile
        prompt, completion = counted
    assert relay._guard is not None
    relay._guard.settle()
    await send({"type": "http.response.body", "body": tap.ending(prompt, completion), "more_body": False})
    relay.tokens = tap.usage or tap.sent
    relay.state.metrics.resumes.labels("ended").inc()


async def _usage(relay: _Relay, tap: StreamTap, tried: set[Replica]) -> tuple[int, int] | None:
    """Prompt and completion tokens of an answer whose usage event was cut, as another replica's ``/tokenize``
    counts the request's messages (its chat template applied) and the relayed text; where it cannot say, the
    gateway's prompt estimate and the tokens counted while relaying. None: the client went away."""
    prompt, completion = relay.features.prompt_tokens, tap.sent
    guard = relay._guard
    assert guard is not None
    try:
        booking = relay.state.pools.acquire_retry(relay.pool, 0, frozenset(tried), relay.allowed)
    except NoHealthyBackend:
        return prompt, completion
    guard.rearm(relay.state.settings.first_byte_timeout_s)
    try:
        counted = await _count_tokens(relay, booking.replica, _text_fields(tap))
        completion = completion if counted is None else counted
        counted = await _count_tokens(relay, booking.replica, _chat_fields(tap.payload))
        prompt = prompt if counted is None else counted
    except asyncio.CancelledError:
        if not guard.absorb_cancel():
            raise
        if guard.reason == "disconnect":
            relay.status, relay.tokens = 499, completion
            return None
    finally:
        booking.release()
    return prompt, completion


def _text_fields(tap: StreamTap) -> dict[str, Any] | None:
    """A ``/tokenize`` body for the text relayed so far (None: nothing relayed, nothing to count)."""
    text = "".join(tap.parts)
    return {"model": tap.payload.get("model"), "prompt": text, "add_special_tokens": False} if text else None


def _chat_fields(payload: dict[str, Any]) -> dict[str, Any]:
    """A ``/tokenize`` body that renders the request's prompt as the chat endpoint does (vLLM's fields)."""
    fields = {"model": payload.get("model"), "messages": payload.get("messages"),
              "add_generation_prompt": payload.get("add_generation_prompt", True),
              "continue_final_message": payload.get("continue_final_message", False)}  # fmt: skip
    for name in ("tools", "chat_template", "chat_template_kwargs", "add_special_tokens"):
        if name in payload:
            fields[name] = payload[name]
    return fields


async def _count_tokens(relay: _Relay, replica: Replica, fields: dict[str, Any] | None) -> int | None:
    """How many tokens a text (``prompt``) or chat (``messages``) is, by the replica's own tokenizer (vLLM's
    ``/tokenize``, the same model on both pools); None when it cannot say (or ``fields`` is None)."""
    if fields is None:
        return None
    body = orjson.dumps(fields)
    headers = {"content-type": "application/json", **relay.state.upstream_auth.get(replica.pool, {})}
    try:
        response = await relay.state.upstream.send(replica.url + "/tokenize", body, headers, "POST")
    except UpstreamError:
        return None
    try:
        data = await response.read() if response.status == 200 else b""
    except response.read_errors:
        return None
    finally:
        await response.close()
    try:
        count = orjson.loads(data).get("count") if data else None
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return count if isinstance(count, int) and count >= 0 else None


async def _continue(relay: _Relay, tap: StreamTap, send: Send, remaining: int | None) -> bool:
    """One continuation: True when it ran to its end and the client's response was ended."""
    assert relay.booking is not None and relay._guard is not None
    replica, guard = relay.booking.replica, relay._guard
    response, chunk, reader = await relay._attempt(replica, tap.continuation(remaining))
    try:
        if response.status != 200 or reader is None:
            if response.status >= 500:
                replica.breaker.failure()
            return False  # a refusal (vLLM's 400) is relayed by no one: the original error event ends it
        replica.breaker.success()
        tap.pending = b""  # the original's incomplete event was never relayed
        loop, idle = guard.loop, relay.state.settings.idle_timeout_s
        while chunk:
            guard.deadline = loop.time() + idle
            out = tap.splice(chunk)
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
            chunk = await reader()
    except response.read_errors as exc:
        raise UpstreamError(f"the continuation broke off too: {exc}") from exc
    finally:
        await response.close()
    if not tap.done:
        return False
    guard.settle()
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return True
