"""``create_app(settings)``: builds one gateway instance; nothing lives at module level.

The two proxy endpoints go to :class:`gateway.proxy.ProxyRoute` (raw ASGI, the hot path); everything else
(health, readiness, models, metrics, explain) is a thin FastAPI handler.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from gateway import admin
from gateway.adaptive.policy import is_warm, predictions
from gateway.adaptive.views import model_view, prediction_view
from gateway.auth import require_admin, require_key
from gateway.config import Settings
from gateway.errors import BodyTooLarge, GatewayError, error_body
from gateway.pools import replica_states
from gateway.proxy import ProxyRoute, parse_json_object
from gateway.reload import RulesWatcher
from gateway.state import GatewayState

log = logging.getLogger("specgate")

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


class SpecgateApp:
    """The ASGI application: proxy paths to the lean route, the rest to FastAPI."""

    def __init__(self, state: GatewayState, api: FastAPI, routes: dict[str, ProxyRoute]) -> None:
        self.state = state
        self.api = api
        self._routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            route = self._routes.get(scope["path"])
            if route is not None:
                await route(scope, receive, send)
                return
        await self.api(scope, receive, send)


def create_app(
    settings: Settings | None = None, registry: CollectorRegistry | None = None, *, rng: random.Random | None = None
) -> SpecgateApp:
    settings = settings or Settings()
    registry = registry if registry is not None else CollectorRegistry()
    state = GatewayState(settings, registry, rng)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.start()
        if settings.reload_rules and settings.rules_file is not None:
            state.add_task(RulesWatcher(state, settings.rules_file).run(), "rules-watcher")
        try:
            yield
        finally:
            await state.stop()

    api = FastAPI(title="specgate", version="0.1.0", lifespan=lifespan)
    api.state.gateway = state
    routes = {
        CHAT_PATH: ProxyRoute(state, "chat", CHAT_PATH),
        COMPLETIONS_PATH: ProxyRoute(state, "completions", COMPLETIONS_PATH),
    }

    @api.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> Response:
        headers = {k.decode(): v.decode() for k, v in exc.headers}
        return Response(exc.to_json(), status_code=exc.status_code, media_type="application/json", headers=headers)

    @api.exception_handler(HTTPException)  # unknown paths and methods: OpenAI's shape, not FastAPI's "detail"
    async def _http_error(_: Request, exc: HTTPException) -> Response:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        body = error_body(str(exc.detail), kind)
        return Response(body, status_code=exc.status_code, media_type="application/json", headers=exc.headers)

    @api.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/ready")
    async def ready() -> JSONResponse:
        pools = {
            name: {"healthy": p.healthy_replicas, "total": p.total_replicas} for name, p in state.snapshot.pools.items()
        }
        ok = any(p.available for p in state.snapshot.pools.values()) and not state.draining
        details = {"ready": ok, "pools": pools, "qps_source": state.snapshot.qps_source}
        details["replicas"] = replica_states(state.pools)
        details["draining"] = state.draining
        details["signals"] = state.signals.status()
        return JSONResponse(details, status_code=200 if ok else 503)

    @api.get("/metrics")
    async def metrics(request: Request) -> Response:
        if settings.metrics_need_admin:
            state.access.check_admin(request.headers)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @api.get("/v1/models", dependencies=[Depends(require_key)])
    async def models() -> dict[str, Any]:
        names = sorted(state.ruleset.models or state.pool_models)
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": 0, "owned_by": "specgate"} for n in names],
        }

    @api.post("/v1/route/explain", dependencies=[Depends(require_admin)])
    async def explain(request: Request) -> dict[str, Any]:
        body = await request.body()
        if len(body) > settings.max_body_bytes:
            raise BodyTooLarge(f"request body is larger than {settings.max_body_bytes} bytes")
        payload = parse_json_object(body)
        route = routes[COMPLETIONS_PATH if "prompt" in payload else CHAT_PATH]
        headers = {k.lower(): v for k, v in request.headers.items()}
        snapshot = state.current_snapshot()
        features, decision = route.route_payload(payload, headers, snapshot)
        rules = state.ruleset.rules
        objective = features.objective or state.ruleset.rules.objective
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
            "features": {**asdict(features), "headers": None},
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
    return SpecgateApp(state, api, routes)
