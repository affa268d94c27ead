"""vLLM's other public endpoints, forwarded unchanged without a routing decision.

:data:`ENDPOINTS` is the allow-list, the one place that says what a client of the gateway may reach: a new
vLLM endpoint is one line. Everything else, vLLM's control endpoints above all (``/sleep``, ``/pause``,
``/collective_rpc``, the weight-update family, profiling, cache resets, LoRA loading, scaling), gets a 404 in
OpenAI's shape and never reaches a replica: a client must not be able to put an engine to sleep or swap its
weights through the gateway.

Paths are matched exactly (the ASGI path, already percent-decoded) against the list; an ``{id}`` segment
takes only :data:`gateway.response_ids.ID_PATTERN` (no ``/``, no leading ``.``), and the upstream path is
rebuilt from the matched entry, so no encoding trick makes the gateway call another upstream path. The query
string goes along only where an entry says so (GET endpoints that take one), after a character check.

Forwarding reuses the proxy's relay (booking, retry before the first byte on another replica then the other
pool, first-byte and idle deadlines, metrics, ``x-specgate-*`` headers) with a "passthrough" decision for the
default pool (``passthrough_pool`` names another). Responses API objects (``{id}`` of ``/v1/responses``) go to
the replica that created them (:mod:`gateway.response_ids`), with no retry elsewhere: no other replica has it;
only for the key that created them (any other key gets a 404).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, replace
from types import MappingProxyType

from starlette.types import Receive, Scope, Send

from gateway.auth import ApiKey
from gateway.bounds import length_bound, sequences
from gateway.decide import Decision
from gateway.direct import direct_body
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    UpstreamConnectError,
    UpstreamError,
    UpstreamTimeout,
    chained,
)
from gateway.features import RequestFeatures, estimate_tokens
from gateway.guard import Guard
from gateway.limits import Admission
from gateway.pools import Replica
from gateway.proxy import ChunkReader, _Relay, begin, parse_json_object, read_body, send_error
from gateway.response_ids import ID_PATTERN, ResponseOwners
from gateway.snapshot import other_pool
from gateway.state import GatewayState
from gateway.upstream import UpstreamResponse


@dataclass(frozen=True, slots=True)
class Endpoint:
    method: str
    path: str  # exact, or with one "{id}" segment
    query: bool = False  # pass the query string on (GET endpoints that take one)
    owner: bool = False  # {id} names a response: go to the replica that created it
    # generates text (another API's chat): a key's max_tokens cap applies, and its token limit is charged as
    # for chat (prompt estimate + max_tokens per conversation), then corrected by the usage field named here
    usage: bytes | None = None


# vLLM 0.32's public data-plane endpoints besides the routed ones (chat, completions, responses) and the
# gateway's own (/health, /metrics, /v1/models). Not here, so 404: every control or development endpoint,
# SageMaker's /invocations and /ping, the disaggregated-serving /inference/v1/*, /load and /kv_event_sources
# (one replica's internals), and the /v1/realtime websocket (the gateway relays HTTP only).
ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/v1/responses/{id}", query=True, owner=True),
    Endpoint("POST", "/v1/responses/{id}/cancel", owner=True),
    Endpoint("POST", "/tokenize"),
    Endpoint("POST", "/detokenize"),
    Endpoint("GET", "/tokenizer_info"),
    Endpoint("GET", "/version"),
    Endpoint("POST", "/v1/embeddings"),
    Endpoint("POST", "/v2/embed"),
    Endpoint("POST", "/pooling"),
    Endpoint("POST", "/classify"),
    Endpoint("POST", "/score"),
    Endpoint("POST", "/v1/score"),
    Endpoint("POST", "/rerank"),
    Endpoint("POST", "/v1/rerank"),
    Endpoint("POST", "/v2/rerank"),
    Endpoint("POST", "/v1/audio/transcriptions"),
    Endpoint("POST", "/v1/audio/translations"),
    Endpoint("POST", "/v1/messages", usage=b'"output_tokens":'),  # Anthropic's Messages API
    Endpoint("POST", "/v1/messages/count_tokens"),
    Endpoint("POST", "/v1/chat/completions/batch", usage=b'"completion_tokens":'),  # one conversation each
    Endpoint("POST", "/cohere/v2/chat", usage=b'"output_tokens":'),
    Endpoint("POST", "/generative_scoring"),
    Endpoint("POST", "/v1/systemone"),
    Endpoint("POST", "/v1/chat/completions/render"),
    Endpoint("POST", "/v1/completions/render"),
    Endpoint("POST", "/v1/messages/render"),
    Endpoint("POST", "/v1/responses/render"),
    Endpoint("POST", "/v1/chat/completions/derender"),
    Endpoint("POST", "/v1/completions/derender"),
)

_QUERY = re.compile(rb"[A-Za-z0-9._~%&=+,:;!*'()/?@$-]*")  # RFC 3986 query characters, nothing else
_NO_HEADERS: MappingProxyType[str, str] = MappingProxyType({})
# No decision reads these. The nominal one-token booking keeps the call visible in the replica's booked load.
NO_FEATURES = RequestFeatures(
    model="", max_tokens=0, prompt_tokens=1, task="none", stream=False, n=1, temperature=None, headers=_NO_HEADERS
)


class EndpointTable:
    """The allow-list compiled for lookups: exact paths in a dict, ``{id}`` templates as prefix + suffix."""

    def __init__(self, endpoints: tuple[Endpoint, ...] = ENDPOINTS) -> None:
        self.exact: dict[str, dict[str, Endpoint]] = {}
        self.templates: list[tuple[str, str, dict[str, Endpoint]]] = []
        for endpoint in endpoints:
            if "{id}" in endpoint.path:
                prefix, suffix = endpoint.path.split("{id}")
                methods = next((m for p, s, m in self.templates if (p, s) == (prefix, suffix)), None)
                if methods is None:
                    methods = {}
                    self.templates.append((prefix, suffix, methods))
            else:
                methods = self.exact.setdefault(endpoint.path, {})
            methods[endpoint.method] = endpoint

    def match(self, method: str, path: str) -> tuple[Endpoint, str | None]:
        """The entry for ``method path`` and its ``{id}``; :class:`NotFound` / :class:`MethodNotAllowed`."""
        methods, rid = self.exact.get(path), None
        if methods is None:
            for prefix, suffix, candidates in self.templates:
                if path.startswith(prefix) and path.endswith(suffix) and len(path) > len(prefix) + len(suffix):
                    middle = path[len(prefix) : len(path) - len(suffix)]
                    if ID_PATTERN.fullmatch(middle):
                        methods, rid = candidates, middle
                        break
        if methods is None:
            raise NotFound(f"Invalid URL ({method} {path})")
        endpoint = methods.get(method)
        if endpoint is None:
            raise MethodNotAllowed(f"Method {method} not allowed on {path}; allowed: {', '.join(sorted(methods))}")
        return endpoint, rid


class PassthroughRoute:
    """ASGI app for every allow-listed path: forward unchanged, no routing decision."""

    def __init__(self, state: GatewayState, owners: ResponseOwners, table: EndpointTable | None = None) -> None:
        self.state = state
        self.owners = owners
        self.table = table or EndpointTable()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        started, headers, request_id = begin(state, scope)
        admission = None
        try:
            endpoint, rid = self.table.match(scope["method"], scope["path"])
            target = upstream_target(endpoint, scope["path"], scope.get("query_string", b""))
            key = state.access.authenticate(headers)  # before the body: no key, no upload
            body = await read_body(receive, headers, state.settings.max_body_bytes)
            if key is not None:
                state.access.check(key, time.time())  # a key over its limits: refused before any parse
            pinned = await self._owner(rid, key) if endpoint.owner and rid is not None else None
            decision = Decision(pinned.pool, "response owner", None) if pinned else passthrough_decision(state)
            features = NO_FEATURES
            if key is not None:
                decision = key.steer(decision, state.snapshot)
                if endpoint.usage is not None:
                    body, features = generation_features(key, body, state.ruleset.rules.defaults.max_tokens)
                cost = features.max_tokens * features.sequences
                admission = state.access.admit(key, features.prompt_tokens, cost, time.time())
        except GatewayError as exc:
            await reject(state, send, exc, request_id, scope["path"], started)
            return
        relay = PassthroughRelay(state, target, features, decision, headers, started, request_id)
        relay.method, relay.pinned, relay.generation = endpoint.method, pinned, False
        if endpoint.usage is not None:
            relay.usage_key = endpoint.usage
        await run_relay(relay, key, admission, body, receive, send, scope)

    async def _owner(self, rid: str, key: ApiKey | None) -> Replica:
        """The replica holding this key's response ``rid``; another key's, or an unknown one, is a 404."""
        url = await self.owners.replica_url(rid, self.owners.owner_of(key))
        replica = find_replica(self.state, url) if url is not None else None
        if replica is None or (key is not None and key.pools is not None and replica.pool not in key.pools):
            raise NotFound(f"Response with id '{rid}' not found.", param="response_id")
        return replica


def generation_features(key: ApiKey, body: bytes, default_max_tokens: int) -> tuple[bytes, RequestFeatures]:
    """A text-generating pass-through call under a key: the key's ``max_tokens`` cap (every spelling checked, the
    largest counts; over it a 400, absent it is sent, as for chat), and what its token limit is charged up front:
    the body's text as a prompt estimate (its JSON keys too: an over-estimate, corrected with the rest when
    ``usage`` arrives) and ``max_tokens`` for each sequence (``n`` or ``best_of`` for each conversation: the batch
    endpoint's ``messages`` is a list of them). A bound that is not a positive integer is a 400, cap or none."""
    payload = parse_json_object(body)
    body = key.cap(payload, body)
    bound = length_bound(payload)
    messages = payload.get("messages")
    conversations = len(messages) if isinstance(messages, list) and messages and isinstance(messages[0], list) else 1
    prompt = estimate_tokens(body.decode("utf-8", "replace"))
    features = replace(
        NO_FEATURES,
        max_tokens=bound[1] if bound is not None else default_max_tokens,
        prompt_tokens=max(prompt, 1),
        n=sequences(payload),
        prompts=conversations,
        stream=payload.get("stream") is True,
    )
    return body, features


async def run_relay(
    relay: _Relay,
    key: ApiKey | None,
    admission: Admission | None,
    body: bytes,
    receive: Receive,
    send: Send,
    scope: Scope,
) -> None:
    """Run the relay within the caller's key: its allowed pools, its rate-limit headers, its admission finished
    exactly once (as :class:`gateway.proxy.ProxyRoute` does)."""
    try:
        if key is not None:
            relay.allowed, relay.extra_headers = key.pools, list(admission.headers) if admission else []
        await relay.run(body, receive, send, direct_body(scope))
    finally:
        relay.state.access.finish(key, admission, relay.status, relay.used_tokens(relay.features.prompt_tokens))


async def reject(
    state: GatewayState, send: Send, exc: GatewayError, request_id: str, path: str, started: float
) -> None:
    """The gateway's own error, counted and logged as the proxy routes do."""
    await send_error(send, exc, [(b"x-request-id", request_id.encode("latin-1")), *exc.headers])
    state.metrics.count_request("none", "rejected", "none", exc.status_code)
    if state.request_log is not None:
        state.request_log.rejected(request_id, path, exc.status_code, exc.error_type, started)


def upstream_target(endpoint: Endpoint, path: str, query: bytes) -> str:
    """The path (and query) sent upstream: the matched path, which holds only allow-listed characters."""
    if not endpoint.query or not query:
        return path
    if _QUERY.fullmatch(query) is None:
        raise InvalidRequest("the query string holds characters a URL does not allow")
    return f"{path}?{query.decode('ascii')}"


def passthrough_decision(state: GatewayState) -> Decision:
    """The configured (else the rules' default) pool, or the other one when it has no healthy replica."""
    snapshot = state.snapshot
    pool = state.settings.passthrough_pool or state.ruleset.rules.default_pool
    if not snapshot.pool(pool).available:
        alternative = other_pool(pool)
        if snapshot.pool(alternative).available:
            return Decision(alternative, f"passthrough; fallback: {pool} unavailable", None, fallback=True)
    return Decision(pool, "passthrough", None)


def find_replica(state: GatewayState, url: str) -> Replica | None:
    """One of this gateway's replicas: a URL from Redis is never called unless it is configured here too."""
    return next((r for r in state.pools.replicas() if r.url == url), None)


class PassthroughRelay(_Relay):
    """The proxy's relay with a method of its own and, when ``pinned``, one replica and no retry elsewhere.

    Latency histograms (TTFT, TPOT) and learning describe generation: pass-through calls (tokenize,
    embeddings...) set ``generation = False`` and are counted in the request and error counters (and the request
    log and trace, when on) only.
    """

    pinned: Replica | None = None

    async def _open(self, body: bytes, guard: Guard) -> tuple[UpstreamResponse, bytes, ChunkReader | None]:
        replica = self.pinned
        if replica is None:
            return await super()._open(body, guard)
        tokens = self.features.prompt_tokens + self.features.max_tokens * self.features.sequences
        self.booking = replica.book(tokens)
        try:
            opened = await self._attempt(replica, body)
        except asyncio.CancelledError:
            if guard.reason != "timeout" or not guard.absorb_cancel():
                raise
            self._count_error("timeout")
            replica.breaker.failure()
            raise chained(UpstreamTimeout(f"no response from {replica.url} in time"), None) from None
        except UpstreamError as exc:
            self._count_error("connect" if isinstance(exc, UpstreamConnectError) else "upstream")
            replica.breaker.failure()
            raise
        if opened[0].status >= 500:
            replica.breaker.failure()
        else:
            replica.breaker.success()
        return opened
