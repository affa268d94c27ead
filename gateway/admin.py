"""Operator endpoints beyond explain: ``POST /admin/reload``. Each needs the admin token (gateway.auth)."""

from __future__ import annotations

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from gateway.auth import require_admin
from gateway.reload import reload_keys, reload_rules
from gateway.state import GatewayState


def register(api: FastAPI, state: GatewayState) -> None:
    @api.post("/admin/reload", dependencies=[Depends(require_admin)])
    async def reload() -> JSONResponse:
        """Re-read the rules file (as the watcher does) and the keys; an invalid source keeps the old one (422)."""
        rules, keys = reload_rules(state, "on request"), reload_keys(state, "on request")
        ok = rules["status"] != "rejected" and keys["status"] != "rejected"
        return JSONResponse({"rules": rules, "keys": keys}, status_code=200 if ok else 422)
