"""``POST /v1/responses`` (OpenAI's Responses API, which vLLM serves): routed by the same decider as chat.

Features come from ``input`` (a string, or items whose last user text feeds the classifier), ``instructions``
(the system prompt), ``max_output_tokens`` and ``stream``. The relay is the proxy's, plus: the response id is
read from the body or the stream's first events and remembered with the replica that answered and the caller's
key (:mod:`gateway.response_ids`), and a request that continues a conversation (``previous_response_id``) goes
to the replica holding it, since vLLM keeps it in that server's memory; another key's id, or one the gateway
does not know, is a 404. A client-chosen id (``request_id``) that the gateway already knows is a 400.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from starlette.types import Receive, Scope, Send

from gateway.auth import ApiKey
from gateway.decide import Decision, decide
from gateway.errors import GatewayError, InvalidRequest, NotFound
from gateway.features import Classifier, RequestFeatures, estimate_tokens, request_features
from gateway.guard import Guard
from gateway.passthrough import PassthroughRelay, find_replica, reject, run_relay
from gateway.pools import Replica
from gateway.proxy import ChunkReader, begin, parse_json_object, read_body
from gateway.response_ids import ResponseOwners, StreamIdScanner, body_response_id, valid_id
from gateway.rules import RoutingRules
from gateway.snapshot import Snapshot
from gateway.state import GatewayState
from gateway.upstream import UpstreamResponse

RESPONSES_PATH = "/v1/responses"
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def responses_features(
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    rules: RoutingRules,
    classifier: Classifier,
    draw: float | None = None,
) -> RequestFeatures:
    """Validate and read a Responses API body; a bad field is a 400 naming it. The headers' fields
    (objective, SLOs) and the draw are read as :func:`gateway.features.extract_features` reads them."""
    model = body.get("model", "")
    if not isinstance(model, str):
        raise InvalidRequest("'model' must be a string", param="model")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("'instructions' must be a string", param="instructions")
    system, user, tokens = _input_text(body.get("input"))
    if instructions:
        system, tokens = instructions, tokens + estimate_tokens(instructions) + 4
    max_tokens = body.get("max_output_tokens")
    if max_tokens is None:
        max_tokens = rules.defaults.max_tokens
    elif not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise InvalidRequest("'max_output_tokens' must be a positive integer", param="max_output_tokens")
    return request_features(body, headers, classifier, model, max_tokens, tokens, system, user, draw, has_n=False)


def _input_text(items: Any) -> tuple[str | None, str | None, int]:
    """(first system/developer text, last user text, estimated prompt tokens) of ``input``."""
    if isinstance(items, str):
        return None, items, estimate_tokens(items)
    if not isinstance(items, list) or not items:
        raise InvalidRequest("'input' must be a string or a non-empty array of input items", param="input")
    system: str | None = None
    user: str | None = None
    tokens = 0
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input[{index}] must be an object", param="input")
        text = _item_text(item, index)
        tokens += estimate_tokens(text) + 4
        role = item.get("role")
        if role in ("system", "developer") and system is None:
            system = text
        elif role == "user" and text:  # an image-only message leaves the last text in charge
            user = text
    return system, user, tokens


def _item_text(item: Mapping[str, Any], index: int) -> str:
    """A message's text (a string, or its text parts); a tool call's output or arguments; else nothing."""
    content = item.get("content")
    if "role" in item:
        if content is None or isinstance(content, str):
            return content or ""
        if isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") in _TEXT_PARTS]
            return "\n".join(p for p in parts if isinstance(p, str))
        raise InvalidRequest(f"input[{index}].content must be a string or an array of parts", param="input")
    for key in ("output", "arguments"):
        value = item.get(key)
        if isinstance(value, str):
            return value
    return ""


_DELTA = b'.delta"'  # the end of a token event's type: response.output_text.delta, ...reasoning_text.delta, ...


class ResponsesRelay(PassthroughRelay):
    """The relay for a routed (or conversation-pinned) Responses API call: also remembers the response id."""

    usage_key = b'"output_tokens":'
    owners: ResponseOwners
    owner: str  # ResponseOwners.owner_of the caller's key
    _awaiting_token = False
    _scanner: StreamIdScanner | None = None

    async def _respond(
        self, response: UpstreamResponse, first: bytes, chunks: ChunkReader | None, send: Send, guard: Guard
    ) -> None:
        if response.status == 200 and self.booking is not None:
            if chunks is None:
                rid = body_response_id(first)
                if rid is not None:
                    write = self.owners.remember(rid, self.booking.replica.url, self.owner)
                    if write is not None:
                        await write  # so that a retrieve through another gateway finds it (bounded by Redis's timeout)
            else:
                self._scanner = StreamIdScanner()
                self._scan(first)
        # A Responses stream opens with response.created before any token: its first token is its first
        # delta event, so the TTFT learned and observed is taken there (in the first chunk: the head's time).
        self._awaiting_token = chunks is not None and _DELTA not in first
        await super()._respond(response, first, chunks, send, guard)

    def _count(self, chunk: bytes) -> None:
        super()._count(chunk)
        if self._awaiting_token and _DELTA in chunk:
            self._awaiting_token = False
            self.ttft = time.perf_counter() - self.started
        if self._scanner is not None:  # only until the id is found, within the stream's first bytes
            self._scan(chunk)

    def _scan(self, chunk: bytes) -> None:
        assert self._scanner is not None and self.booking is not None
        rid = self._scanner.feed(chunk)
        if rid is not None:
            self.owners.remember(rid, self.booking.replica.url, self.owner)  # Redis is written in the background
        if self._scanner.done:
            self._scanner = None


class ResponsesRoute:
    """ASGI app for ``POST /v1/responses``: parse -> decide (or follow the conversation) -> relay -> remember."""

    kind = "responses"
    path = RESPONSES_PATH

    def __init__(self, state: GatewayState, owners: ResponseOwners) -> None:
        self.state = state
        self.owners = owners

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        started, headers, request_id = begin(state, scope)
        admission = None
        try:
            key = state.access.authenticate(headers)  # before the body: no key, no upload
            body = await read_body(receive, headers, state.settings.max_body_bytes)
            if key is not None:
                state.access.check(key, time.time())  # a key over its limits: refused before any parse
            payload = parse_json_object(body)
            if key is not None:
                body = cap_output(key, payload, body)
            snapshot = state.current_snapshot()
            features, decision = self.route_payload(payload, headers, snapshot)
            owner = self.owners.owner_of(key)
            await self._refuse_taken_id(payload)
            pinned = await self._conversation_owner(payload, key, owner)
            if pinned is not None:
                decision = Decision(pinned.pool, "previous response", None)
            if key is not None:
                decision = key.steer(decision, snapshot)
                admission = state.access.admit(key, features.prompt_tokens, features.max_tokens, time.time())
        except GatewayError as exc:
            await reject(state, send, exc, request_id, self.path, started)
            return
        state.metrics.route_step.observe(time.perf_counter() - started)
        state.qps.record(time.monotonic())
        state.signals.record_request(time.time())
        relay = ResponsesRelay(state, self.path, features, decision, headers, started, request_id)
        relay.owners, relay.owner, relay.pinned = self.owners, owner, pinned
        await run_relay(relay, key, admission, body, receive, send, scope)

    def route_payload(
        self, payload: dict[str, Any], headers: dict[str, str], snapshot: Snapshot
    ) -> tuple[RequestFeatures, Decision]:
        ruleset = self.state.ruleset
        features = responses_features(payload, headers, ruleset.rules, ruleset.classifier)
        self.state.check_model(features.model)
        self.state.see_cache(features)
        return features, decide(features, snapshot, ruleset.rules)

    async def _conversation_owner(self, payload: Mapping[str, Any], key: ApiKey | None, owner: str) -> Replica | None:
        """The replica holding ``previous_response_id``. The gateway must know it as this key's, in a pool the key
        may use: else a 404, as for an id that does not exist (vLLM keeps a response only where it was made)."""
        previous = payload.get("previous_response_id")
        if previous is None:
            return None
        if not valid_id(previous):
            raise InvalidRequest("'previous_response_id' must be a response id", param="previous_response_id")
        url = await self.owners.replica_url(previous, owner)
        replica = find_replica(self.state, url) if url is not None else None
        if replica is None or (key is not None and key.pools is not None and replica.pool not in key.pools):
            raise NotFound(f"Response with id '{previous}' not found.", param="previous_response_id")
        return replica

    async def _refuse_taken_id(self, payload: Mapping[str, Any]) -> None:
        """vLLM names the response after a client's ``request_id`` and stores it over any response the replica
        holds under that id: an id the gateway knows (whoever's) is refused."""
        chosen = payload.get("request_id")
        if valid_id(chosen) and await self.owners.known(chosen):
            message = f"request_id '{chosen}' is already in use: leave request_id out or choose another"
            raise InvalidRequest(message, param="request_id")


def cap_output(key: ApiKey, payload: dict[str, Any], body: bytes) -> bytes:
    """A key's ``max_tokens`` cap on ``max_output_tokens`` (every length spelling checked, the largest counts):
    over it a 400, absent it is sent (as :meth:`gateway.auth.ApiKey.cap` does for chat)."""
    return key.cap(payload, body, field="max_output_tokens")
