"""Operator endpoints beyond explain: ``POST /admin/reload``. Each needs the admin token (gateway.auth)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from gateway.auth import KeysError, require_admin
from gateway.errors import RulesError
from gateway.rules import load_rules
from gateway.state import GatewayState

log = logging.getLogger("specgate.admin")


def register(api: FastAPI, state: GatewayState) -> None:
    @api.post("/admin/reload", dependencies=[Depends(require_admin)])
    async def reload() -> JSONResponse:
        """Re-read the rules file (as the watcher does) and the keys; an invalid source keeps the old one (422)."""
        rules, keys = reload_rules(state), reload_keys(state)
        ok = rules["status"] != "rejected" and keys["status"] != "rejected"
        return JSONResponse({"rules": rules, "keys": keys}, status_code=200 if ok else 422)


def reload_rules(state: GatewayState) -> dict[str, Any]:
    path = state.settings.rules_file
    if path is None:
        return {"status": "unchanged", "detail": "no rules file set: the shipped rules are in force"}
    try:
        rules = load_rules(path)
    except RulesError as exc:
        log.error("rejected new rules from %s: %s", path, "; ".join(exc.problems))
        state.metrics.rule_reloads.labels("rejected").inc()
        return {"status": "rejected", "problems": exc.problems}
    state.apply_rules(rules)
    state.metrics.rule_reloads.labels("ok").inc()
    log.info("reloaded rules from %s (%d rules) on request", path, len(rules.rules))
    return {"status": "reloaded", "rules": len(rules.rules)}


def reload_keys(state: GatewayState) -> dict[str, Any]:
    try:
        count = state.access.reload()
    except KeysError as exc:
        log.error("rejected new keys from %s: %s", exc.source, "; ".join(exc.problems))
        return {"status": "rejected", "problems": exc.problems}
    log.info("reloaded keys: %d key(s)", count)
    return {"status": "reloaded", "keys": count}
