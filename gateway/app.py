"""``create_app(settings)``: builds one gateway instance; nothing lives at module level.

The routed endpoints go to raw ASGI routes (the hot path): chat and completions to
:class:`gateway.proxy.ProxyRoute`, ``/v1/responses`` to :class:`gateway.responses.ResponsesRoute`; vLLM's other
public endpoints (the allow-list in :mod:`gateway.passthrough`) to :class:`~gateway.passthrough.PassthroughRoute`;
everything else (health, readiness, models, metrics, explain, and OpenAI's 404 for any other path) is a thin
FastAPI handler.

What a caller without a key sees once keys are configured: ``/health``, ``/ready`` as ready or not (the pools,
replicas and signals behind it only with the admin token), and ``/metrics`` unless ``metrics_need_admin``; the
interactive docs (``/docs``, ``/redoc``, ``/openapi.json``) answer 404 then, as any unknown path does. While the
gateway is open (no keys) all of them answer in full.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict, fields
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway import admin
from gateway.adaptive.policy import is_warm, predictions
from gateway.adaptive.views import model_view, prediction_view
from gateway.auth import require_admin, require_key
from gateway.config import Settings
from gateway.decide import Decision
from gateway.errors import (
    AuthenticationError,
    BodyTooLarge,
    GatewayError,
    MethodNotAllowed,
    NotFound,
    UnknownModel,
    error_body,
)
from gateway.features import RequestFeatures
from gateway.metrics import held
from gateway.passthrough import PassthroughRoute
from gateway.pools import replica_states
from gateway.proxy import ProxyRoute, parse_json_object
from gateway.reload import keys_watcher, rules_watcher
from gateway.response_ids import ResponseOwners
from gateway.responses import RESPONSES_PATH, ResponsesRoute
from gateway.state import GatewayState

log = logging.getLogger("specgate")

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


class SpecgateApp:
    """The ASGI application: routed paths to the lean routes, allow-listed ones to the pass-through, the rest
    to FastAPI."""

    def __init__(
        self, state: GatewayState, api: FastAPI, routes: dict[str, ASGIApp], passthrough: PassthroughRoute
    ) -> None:
        self.state = state
        self.api = api
        self._routes = routes
        self.passthrough = passthrough
        table = passthrough.table
        self._passthrough_paths = frozenset(table.exact)
        self._passthrough_prefixes = tuple(prefix for prefix, _, _ in table.templates)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if scope["method"] == "POST":
                route = self._routes.get(path)
                if route is not None:
                    await route(scope, receive, send)
                    return
            if path in self._passthrough_paths or path.startswith(self._passthrough_prefixes):
                await self.passthrough(scope, receive, send)
                return
        await self.api(scope, receive, send)


# explain shows the features but these (no text, no secrets; the prompt's blocks are summed up under "prefix")
_UNSHOWN = frozenset({"headers", "content", "known", "blocks"})

def create_app(
    settings: Settings | None = None, registry: CollectorRegistry | None = None, *, rng: random.Random | None = None
) -> SpecgateApp:
    settings = settings or Settings()
    registry = registry if registry is not None else CollectorRegistry()
    state = GatewayState(settings, registry, rng)
    render_job = state.metrics.background.labels("metrics-render")  # how long each /metrics page held the loop

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.start()
        if settings.reload_rules and settings.rules_file is not None:
            state.add_task(rules_watcher(state, settings.rules_file).run(), "rules-watcher")
        if settings.reload_keys and settings.keys_file is not None:
            state.add_task(keys_watcher(state, settings.keys_file).run(), "keys-watcher")
        try:
            yield
        finally:
            await state.stop()

    api = FastAPI(title="specgate", version="0.1.0", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    api.state.gateway = state
    shared = state.signals.store if settings.redis_url else None
    owners = ResponseOwners(
        settings.responses_ttl_s, settings.responses_max_ids, shared, evicted=state.metrics.response_ids_evicted
    )
    chat, completions = ProxyRoute(state, "chat", CHAT_PATH), ProxyRoute(state, "completions", COMPLETIONS_PATH)
    responses = ResponsesRoute(state, owners)
    routes: dict[str, ASGIApp] = {CHAT_PATH: chat, COMPLETIONS_PATH: completions, RESPONSES_PATH: responses}

    @api.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> Response:
        headers = {k.decode(): v.decode() for k, v in exc.headers}
        return Response(exc.to_json(), status_code=exc.status_code, media_type="application/json", headers=headers)

    @api.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """Any other path (vLLM's control endpoints included): OpenAI's error shape, not FastAPI's."""
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            return await _gateway_error(request, NotFound(f"Invalid URL ({where})"))
        if exc.status_code == 405:
            return await _gateway_error(request, MethodNotAllowed(f"Method not allowed ({where})"))
        body = error_body(str(exc.detail), "invalid_request_error")
        return Response(body, status_code=exc.status_code, media_type="application/json")

    @api.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/ready")
    async def ready(request: Request) -> JSONResponse:
        ok = any(p.available for p in state.snapshot.pools.values()) and not state.draining
        status = 200 if ok else 503
        if not sees_operator_detail(state, request.headers):
            return JSONResponse({"ready": ok, "draining": state.draining}, status_code=status)
        pools = {
            name: {"healthy": p.healthy_replicas, "total": p.total_replicas} for name, p in state.snapshot.pools.items()
        }
        details = {"ready": ok, "pools": pools, "qps_source": state.snapshot.qps_source}
        details["replicas"] = replica_states(state.pools)
        details["draining"] = state.draining
        details["signals"] = state.signals.status()
        return JSONResponse(details, status_code=status)

    @api.get("/metrics")
    async def metrics(request: Request) -> Response:
        if settings.metrics_need_admin:
            state.access.check_admin(request.headers)
        with held(render_job):
            page = generate_latest(registry)
        return Response(page, media_type=CONTENT_TYPE_LATEST)

    @api.get("/v1/models", dependencies=[Depends(require_key)])
    async def models() -> dict[str, Any]:
        names = sorted(state.ruleset.models or state.pool_models)
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": 0, "owned_by": "specgate"} for n in names],
        }

    @api.get("/v1/models/{model:path}", dependencies=[Depends(require_key)])
    async def model(model: str) -> dict[str, Any]:
        if model not in (state.ruleset.models or state.pool_models):
            raise UnknownModel(f"The model '{model}' does not exist", param="model")
        return {"id": model, "object": "model", "created": 0, "owned_by": "specgate"}

    @api.post("/v1/route/explain", dependencies=[Depends(require_admin)])
    async def explain(request: Request) -> dict[str, Any]:
        body = await request.body()
        if len(body) > settings.max_body_bytes:
            raise BodyTooLarge(f"request body is larger than {settings.max_body_bytes} bytes")
        payload = parse_json_object(body)
        route = responses if "input" in payload else completions if "prompt" in payload else chat
        headers = {k.lower(): v for k, v in request.headers.items()}
        snapshot = state.current_snapshot()
        features, decision = route.route_payload(payload, headers, snapshot)
        rules = state.ruleset.rules
        objective = features.objective or state.ruleset.rules.objective
        state.flush_observations()  # the observation count below includes every finished request
        return {
            "decision": {
                "pool": decision.pool,
                "reason": decision.reason,
                "rule": decision.rule,
                "fallback": decision.fallback,
                "explored": decision.explored,
                "load": decision.load,
            },
            "predictions": [prediction_view(p, objective) for p in predictions(features, snapshot, rules)],
            "model": {"warm": is_warm(snapshot, rules.adaptive), "observations": state.learner.observations},
            "features": {f.name: getattr(features, f.name) for f in fields(features) if f.name not in _UNSHOWN},
            "prefix": prefix_view(state, features, decision),
            "snapshot": {
                "qps": snapshot.qps,
                "qps_source": snapshot.qps_source,
                "qps_age_s": snapshot.qps_age_s,
                "pools": {name: asdict(p) for name, p in snapshot.pools.items()},
                "signals": dict(snapshot.signals),
                "signal_ages_s": dict(snapshot.signal_ages_s),
            },
        }

    @api.get("/v1/route/model", dependencies=[Depends(require_admin)])
    async def learned_model() -> dict[str, Any]:
        """What the adaptive policy learned (read-only)."""
        snapshot, rules = state.snapshot, state.ruleset.rules
        view = model_view(snapshot.model, rules, time.monotonic(), is_warm(snapshot, rules.adaptive))
        return {**view, "warm_after": state.warm_after}

    admin.register(api, state)
    register_docs(api, state)
    return SpecgateApp(state, api, routes, PassthroughRoute(state, owners))


def prefix_view(state: GatewayState, features: RequestFeatures, decision: Decision) -> dict[str, Any]:
    """What the prefix index expects of the request: its blocks read, its session key, per pool the prompt tokens
    the decision read as cached there, per pool each replica's expected hit and whether its load lets it win
    on it (``gateway/pools.py``'s rule), and what one more request in flight on a replica of the chosen pool is
    worth in cached blocks (``gateway.pools.request_blocks``; None: the fixed slack alone decides)."""
    blocks = features.blocks
    worth = state.replica_worth(features, decision) if blocks else None
    return {
        "on": state.ruleset.classifier.prefixes is not None,
        "blocks": len(blocks),
        "session": features.session,
        "cached_tokens": features.cached_tokens,
        "request_worth_blocks": None if worth is None else round(worth, 2),
        "pools": state.pools.expected_hits(blocks),
    }


def sees_operator_detail(state: GatewayState, headers: Mapping[str, str]) -> bool:
    """Whether a caller may see replica URLs and signal sources: anyone while the gateway is open (no keys),
    else only a caller with the admin token."""
    if state.access.open:
        return True
    try:
        state.access.check_admin(headers)
    except AuthenticationError:
        return False
    return True


def register_docs(api: FastAPI, state: GatewayState) -> None:
    """FastAPI's interactive docs, only while the gateway is open: with keys configured they would show every
    endpoint to anyone, so each answers OpenAI's 404 then (checked per request: a reload may add keys)."""

    def check_open(request: Request) -> None:
        if not state.access.open:
            raise NotFound(f"Invalid URL ({request.method} {request.url.path})")

    @api.get("/openapi.json", include_in_schema=False, dependencies=[Depends(check_open)])
    async def openapi() -> JSONResponse:
        return JSONResponse(api.openapi())

    @api.get("/docs", include_in_schema=False, dependencies=[Depends(check_open)])
    async def swagger(request: Request) -> HTMLResponse:
        schema = request.scope.get("root_path", "").rstrip("/") + "/openapi.json"
        return get_swagger_ui_html(openapi_url=schema, title=f"{api.title} - Swagger UI")

    @api.get("/redoc", include_in_schema=False, dependencies=[Depends(check_open)])
    async def redoc(request: Request) -> HTMLResponse:
        schema = request.scope.get("root_path", "").rstrip("/") + "/openapi.json"
        return get_redoc_html(openapi_url=schema, title=f"{api.title} - ReDoc")
