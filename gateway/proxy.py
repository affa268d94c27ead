"""The two proxy endpoints as a lean ASGI route: parse -> decide -> forward -> record.

FastAPI serves everything else; these two paths skip its routing and response machinery because they are
the hot path (see ``specgate bench overhead``). Streams are relayed chunk by chunk as they arrive.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.types import Receive, Scope, Send

from gateway.auth import ApiKey
from gateway.decide import Decision, decide
from gateway.direct import DirectBody, direct_body
from gateway.errors import (
    BodyTooLarge,
    ClientGone,
    GatewayError,
    MalformedJSON,
    ShuttingDown,
    UpstreamConnectError,
    UpstreamError,
    UpstreamTimeout,
    chained,
    error_body,
)
from gateway.features import RequestFeatures, extract_features
from gateway.guard import Guard
from gateway.limits import Admission
from gateway.pools import Booking, Replica
from gateway.resume import StreamTap, plan, resume_stream
from gateway.snapshot import Snapshot
from gateway.state import GatewayState
from gateway.stream_usage import UsageStrip, ask_usage
from gateway.upstream import RawHeaders, UpstreamResponse, forwardable

if TYPE_CHECKING:
    from gateway.tracing import RequestTrace

ChunkReader = Callable[[], Awaitable[bytes]]
_USAGE_KEY = b'"completion_tokens":'
_ACCEPTANCE_KEY = b'"mean_acceptance_length":'
_STREAM_HEADERS: RawHeaders = [(b"x-accel-buffering", b"no"), (b"cache-control", b"no-cache")]


def begin(state: GatewayState, scope: Scope) -> tuple[float, dict[str, str], str]:
    """Every routed request's first step: its start time, its headers (lower-case names, as ASGI gives
    them) and its request id (the client's ``x-request-id``, or a new one)."""
    started = time.perf_counter()
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    return started, headers, headers.get("x-request-id") or state.request_ids.make()


class ProxyRoute:
    """ASGI app for one OpenAI endpoint (``kind`` "chat" or "completions")."""

    def __init__(self, state: GatewayState, kind: str, path: str) -> None:
        self.state = state
        self.kind = kind
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        started, headers, request_id = begin(state, scope)
        admission = None
        try:
            key = state.access.authenticate(headers)  # before the body: no key, no upload
            body = await read_body(receive, headers, state.settings.max_body_bytes)
            if key is None:
                features, decision = self.route(body, headers)
            else:
                body, features, decision, admission = self.route_key(key, body, headers)
        except GatewayError as exc:
            await send_error(send, exc, [(b"x-request-id", request_id.encode("latin-1")), *exc.headers])
            state.metrics.count_request("none", "rejected", "none", exc.status_code)
            if state.request_log is not None:
                state.request_log.rejected(request_id, self.path, exc.status_code, exc.error_type, started)
            return
        relay = None
        try:
            state.metrics.route_step.observe(time.perf_counter() - started)
            state.qps.record(time.monotonic())
            state.signals.record_request(time.time())
            relay = _Relay(state, self.path, features, decision, headers, started, request_id)
            if key is not None:
                relay.allowed, relay.extra_headers = key.pools, list(admission.headers) if admission else []
            if features.stream and state.ruleset.rules.resume.streams:
                relay.resume = plan(self.kind, features, body, state.ruleset.rules.resume)
            if features.stream and state.settings.stream_usage:  # exact tokens from every stream: stream_usage.py
                body, relay.strip = ask_usage(body)
            await relay.run(body, receive, send, direct_body(scope))
        finally:  # the admission back exactly once, whatever ended the request; the key's counters
            used = relay.used_tokens(features.prompt_tokens) if relay is not None else 0
            state.access.finish(key, admission, relay.status if relay is not None else 0, used)

    def route(self, body: bytes, headers: dict[str, str]) -> tuple[RequestFeatures, Decision]:
        return self.route_payload(parse_json_object(body), headers, self.state.current_snapshot())

    def route_key(
        self, key: ApiKey, body: bytes, headers: dict[str, str]
    ) -> tuple[bytes, RequestFeatures, Decision, Admission | None]:
        """Routing for a request with an API key: its limits first (a key over them costs no parse), its
        max_tokens cap, allowed pools, then its admission."""
        self.state.access.check(key, time.time())
        payload = parse_json_object(body)
        body = key.cap(payload, body)
        snapshot = self.state.current_snapshot()
        features, decision = self.route_payload(payload, headers, snapshot)
        decision = key.steer(decision, snapshot)
        cost = features.max_tokens * features.sequences
        return body, features, decision, self.state.access.admit(key, features.prompt_tokens, cost, time.time())

    def route_payload(
        self, payload: dict[str, Any], headers: dict[str, str], snapshot: Snapshot
    ) -> tuple[RequestFeatures, Decision]:
        ruleset = self.state.ruleset
        features = extract_features(payload, self.kind, headers, ruleset.rules, ruleset.classifier)
        self.state.check_model(features.model)
        self.state.see_cache(features)
        return features, decide(features, snapshot, ruleset.rules)


class _Relay:
    """Forwards one routed request, retrying once before the first byte, and records the outcome."""

    method = "POST"
    usage_key = _USAGE_KEY  # completion tokens in the usage object (the Responses API names them differently)
    generation = True  # latency histograms and learning describe generation; pass-through calls set False
    resume: StreamTap | None = None  # set for a stream that may be resumed if cut (gateway/resume.py)
    resumed = False  # a continuation was tried: the outcome is not one request's latency
    strip: UsageStrip | None = None  # set when the gateway asked for usage the client did not: removes it

    def __init__(
        self,
        state: GatewayState,
        path: str,
        features: RequestFeatures,
        decision: Decision,
        headers: dict[str, str],
        started: float,
        request_id: str,
    ) -> None:
        self.state = state
        self.path = path
        self.features = features
        self.decision = decision
        self.forward_headers = forwardable(headers)
        self.request_id = request_id  # the client's x-request-id, or the gateway's own: the response, logs, trace
        self.forward_headers["x-request-id"] = self.upstream_id = state.request_ids.for_upstream(request_id, headers)
        self.allowed: frozenset[str] | None = None  # the pools the caller's key may use (None: any)
        self.extra_headers: RawHeaders = []  # x-ratelimit-* for a limited key
        self.started = started
        self.pool = decision.pool
        self.reason = decision.reason
        self.objective = features.objective or state.ruleset.rules.objective
        self.status = 0
        self.ttft: float | None = None
        self.tokens = 0
        self.booking: Booking | None = None
        self.retried = False
        self.sent = False  # the request went to a pool (a client leaving after that is charged: used_tokens)
        # Per-stream relay state, updated for every chunk (also from the direct sink, outside any task).
        self.events = 0
        self.usage: int | None = None
        self.acceptance: float | None = None  # vLLM's per-request mean acceptance length, when it reports one
        self._guard: Guard | None = None
        self._writer: DirectBody | None = None
        self._trace: RequestTrace | None = None

    async def run(self, body: bytes, receive: Receive, send: Send, writer: DirectBody | None = None) -> None:
        if self.state.tracer is not None:
            self._trace = self.state.tracer.begin(self)
        guard = self._guard = self.state.sweeper.guard(self.state.settings.first_byte_timeout_s)
        self._writer = writer
        guard.watch_disconnect(receive, writer)
        try:
            response, first, chunks = await self._open(body, guard)
            await self._respond(response, first, chunks, send, guard)
        except asyncio.CancelledError:
            if not guard.absorb_cancel():
                raise
            if guard.reason == "disconnect":
                self.status = 499
            elif guard.reason == "shutdown":  # the grace period ran out: end with an error, not a cut
                await self._fail(send, ShuttingDown("the gateway is shutting down; retry the request"))
            else:
                self._count_error("timeout")
                if self.ttft is not None and self.booking is not None:
                    self.booking.replica.breaker.failure()  # idle deadline: the replica stopped mid-stream
                await self._fail(send, UpstreamTimeout("the upstream stopped sending"))
        except GatewayError as exc:
            await self._fail(send, exc)
        finally:
            guard.settle()
            if self.booking is not None:
                self.booking.release()
            self._record()

    async def _open(self, body: bytes, guard: Guard) -> tuple[UpstreamResponse, bytes, ChunkReader | None]:
        """Book a replica and read the response head plus its first chunk; retry once on failure."""
        pools = self.state.pools
        tokens = self.features.prompt_tokens + self.features.max_tokens * self.features.sequences
        blocks = self.features.blocks  # empty unless the prefix index is on
        worth = self.state.replica_worth(self.features, self.decision) if blocks else None
        self.booking = pools.acquire(self.pool, tokens, allowed=self.allowed, blocks=blocks, worth=worth)
        if self.booking.replica.pool != self.pool:  # the decision's snapshot predates a breaker or health change
            self.pool = self.booking.replica.pool
            self.reason = f"{self.reason}; fallback: {self.pool}"
        while True:
            replica = self.booking.replica
            try:
                opened = await self._attempt(replica, body)
                if opened[0].status >= 500:
                    replica.breaker.failure()
                else:
                    replica.breaker.success()
                return opened
            except asyncio.CancelledError:
                if guard.reason != "timeout" or not guard.absorb_cancel():
                    raise
                error: UpstreamError = UpstreamTimeout(f"no response from the {self.pool} pool in time")
                self._count_error("timeout")
            except UpstreamError as exc:
                error = exc
                self._count_error("connect" if isinstance(exc, UpstreamConnectError) else "upstream")
                if isinstance(exc, UpstreamConnectError):
                    replica.set_healthy(False)
            replica.breaker.failure()
            self.booking.release()
            if self.retried:
                raise error
            self.retried = True
            self.booking = pools.acquire_retry(self.pool, tokens, frozenset({replica}), self.allowed, blocks)
            self.state.metrics.retries.labels(self.pool, self.booking.replica.pool).inc()
            if self.booking.replica.pool != self.pool:
                self.pool = self.booking.replica.pool
                self.reason = f"{self.reason}; retry: {self.pool}"
            guard.rearm(self.state.settings.first_byte_timeout_s)

    async def _attempt(self, replica: Replica, body: bytes) -> tuple[UpstreamResponse, bytes, ChunkReader | None]:
        headers = self.forward_headers
        pool_auth = self.state.upstream_auth.get(replica.pool)
        if pool_auth is not None:
            headers = {**headers, **pool_auth}
        if self._trace is not None:
            headers = self._trace.upstream(replica.pool, replica.url, headers)
        self.sent = True
        response = await self.state.upstream.send(replica.url + self.path, body, headers, self.method)
        try:
            if not _is_event_stream(response.headers):
                return response, await response.read(), None
            reader = response.reader()
            return response, await reader(), reader
        except response.read_errors as exc:
            await response.close()
            raise chained(UpstreamError(f"upstream broke off the response: {exc}"), exc) from exc
        except BaseException:
            await response.close()
            raise

    async def _respond(
        self, response: UpstreamResponse, first: bytes, chunks: ChunkReader | None, send: Send, guard: Guard
    ) -> None:
        self.status = response.status
        headers = response.headers + self._route_headers() + self.extra_headers
        if chunks is None:
            headers.append((b"content-length", str(len(first)).encode()))
            guard.settle()
            await self._send_head(send, response.status, headers, first, more_body=False)
            self.ttft = time.perf_counter() - self.started
            self.tokens = _usage_tokens(first, self.usage_key) or 0
            self.usage = self.tokens or None
            if _ACCEPTANCE_KEY in first:
                self.acceptance = _number_after(first, _ACCEPTANCE_KEY)
            return
        if self.resume is not None:
            first = self.resume.take(first)
        self._count(first)
        if self.strip is not None:
            first = self.strip.take(first)
        await self._send_head(send, response.status, headers + _STREAM_HEADERS, first, more_body=True)
        self.ttft = time.perf_counter() - self.started
        loop, idle = guard.loop, self.state.settings.idle_timeout_s
        guard.deadline = loop.time() + idle
        pipe, writer = response.piper(), self._writer
        tail = b""
        try:
            if pipe is not None and writer is not None and writer.usable():
                tail = await pipe(self._relay_direct, writer.drain)  # chunks skip the task: see gateway.direct
            else:
                while chunk := await chunks():
                    guard.deadline = loop.time() + idle
                    if self.resume is not None and not (chunk := self.resume.take(chunk)):
                        continue
                    self._count(chunk)
                    if self.strip is not None and not (chunk := self.strip.take(chunk)):
                        continue
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except response.read_errors as exc:
            self._count_error("disconnect")
            if self.booking is not None:
                self.booking.replica.breaker.failure()
            await response.close()
            raise chained(UpstreamError(f"upstream broke off the stream: {exc}"), exc) from exc
        except BaseException:  # not a finally: compiled, an await in one can lose what it re-raises (compiled.py)
            await response.close()
            raise
        await response.close()
        guard.settle()
        if self.resume is not None:
            tail = self.resume.end(tail)
        self._count(tail)
        if self.strip is not None:
            tail = self.strip.end(tail)
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        self.tokens = self.usage or max(self.events - 1, 0)  # the last event is [DONE]

    async def _send_head(self, send: Send, status: int, headers: RawHeaders, body: bytes, more_body: bool) -> None:
        """The response head and the first body bytes, in one write when the server offers :class:`DirectBody`."""
        writer = self._writer
        if writer is not None:
            writer.cork()
        try:
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": more_body})
        finally:
            if writer is not None:
                writer.uncork()

    def used_tokens(self, prompt_tokens: int) -> int:
        """What a key's token limit is charged. An answer (200): the prompt estimate plus the response's usage, or
        the stream's events relayed (a stream cut short too). A client that went away once its request reached a
        pool: the prompt plus what was generated for it, as far as the gateway can know: a stream's usage or
        events relayed so far; a non-streamed answer's whole booking (the engine may have generated all of it).
        Nothing for a request that never reached a pool, or that a pool refused or failed before answering."""
        if self.status == 200:
            return prompt_tokens + (self.tokens or self.usage or max(self.events - 1, 0))
        if self.status != 499 or not self.sent:
            return 0
        if self.ttft is not None or self.features.stream:
            return prompt_tokens + (self.tokens or self.usage or self.events)
        return prompt_tokens + self.features.max_tokens * self.features.sequences

    def _relay_direct(self, chunk: bytes) -> bool:
        """The pipe's sink: runs in the upstream connection's read callback, once per socket read."""
        assert self._guard is not None and self._writer is not None
        self._guard.deadline = self._guard.loop.time() + self.state.settings.idle_timeout_s
        if self.resume is not None and not (chunk := self.resume.take(chunk)):
            return True  # only part of an event so far: it goes out whole, with the next read
        self._count(chunk)
        if self.strip is not None and not (chunk := self.strip.take(chunk)):
            return True  # held back (part of an event) or the usage event the client did not ask for
        return self._writer.write(chunk)

    def _count(self, chunk: bytes) -> None:
        self.events += chunk.count(b"data: ")
        if self.usage_key in chunk:
            self.usage = _usage_tokens(chunk, self.usage_key)
            if _ACCEPTANCE_KEY in chunk:
                self.acceptance = _number_after(chunk, _ACCEPTANCE_KEY)

    async def _fail(self, send: Send, exc: GatewayError) -> None:
        if self.ttft is None:
            self.status = exc.status_code
            await send_error(send, exc, self._route_headers())
            return
        if self.resume is not None and isinstance(exc, UpstreamError) and await resume_stream(self, send):
            return  # continued on another replica (gateway/resume.py)
        # The head already went out: end the stream with an error event, as OpenAI does mid-stream. It starts
        # on a fresh line (a blank line between events dispatches nothing): a cut may have left half an event.
        event = b"\n\ndata: " + error_body(exc.message, exc.error_type, None, exc.code) + b"\n\n"
        await send({"type": "http.response.body", "body": event, "more_body": False})

    def _route_headers(self) -> RawHeaders:
        headers = [
            (b"x-specgate-pool", self.pool.encode()),
            (b"x-specgate-reason", self.reason.encode("latin-1", "replace")),
            (b"x-specgate-task", self.features.task.encode("latin-1", "replace")),
            (b"x-request-id", self.request_id.encode("latin-1", "replace")),
        ]
        predicted = self.decision.predicted
        if predicted is not None and predicted.pool == self.pool:
            headers.append((b"x-specgate-predicted-ms", b"%.0f" % (predicted.value(self.objective) * 1000)))
        return headers

    def _count_error(self, kind: str) -> None:
        replica = self.booking.replica if self.booking is not None else None
        if replica is not None:
            self.state.metrics.upstream_errors.labels(replica.pool, replica.url, kind).inc()

    def _record(self) -> None:
        metrics = self.state.metrics
        metrics.count_request(self.pool, self.reason, self.features.task, self.status)
        if self.state.request_log is not None:
            self.state.request_log.finished(self)
        if self._trace is not None:
            self._trace.end(self)
        if self.status != 200 or self.ttft is None or not self.generation:
            return
        total = time.perf_counter() - self.started
        tpot = (total - self.ttft) / (self.tokens - 1) if self.tokens > 1 else None
        metrics.observe_latency(self.pool, self.ttft, total, tpot)
        # a retry ran at a load nobody saw; a resumed stream's time includes the cut
        if self.decision.learning and self.pool == self.decision.pool and not self.resumed:
            booking = self.booking
            shift, other = (booking.run_shift, booking.other_busy) if booking is not None else (None, None)
            self.state.learn(self.features, self.decision, self.ttft, total, self.tokens, self.objective,
                             counted=self.usage is not None, acceptance=self.acceptance, run_shift=shift,
                             other_busy=other)  # fmt: skip


def _is_event_stream(headers: RawHeaders) -> bool:
    return any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)


def _usage_tokens(chunk: bytes, key: bytes = _USAGE_KEY) -> int | None:
    """``usage.completion_tokens`` (or another ``key``) found by a byte search, without parsing the JSON."""
    at = chunk.rfind(key)
    if at < 0:
        return None
    digits = chunk[at + len(key) : at + len(key) + 12].lstrip()
    end = 0
    while end < len(digits) and 48 <= digits[end] <= 57:
        end += 1
    return int(digits[:end]) if end else None


def _number_after(chunk: bytes, key: bytes) -> float | None:
    """The JSON number after the last ``key`` in ``chunk`` (a byte search, no parse)."""
    at = chunk.rfind(key) + len(key)
    text = chunk[at : at + 24].lstrip()
    end = 0
    while end < len(text) and text[end] in b"0123456789.eE+-":
        end += 1
    try:
        return float(text[:end])
    except ValueError:
        return None


def parse_json_object(body: bytes) -> dict[str, Any]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedJSON(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise MalformedJSON("request body must be a JSON object")
    return payload


async def read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("client disconnected before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is larger than {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_error(send: Send, exc: GatewayError, extra: RawHeaders | None = None) -> None:
    body = exc.to_json()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})
