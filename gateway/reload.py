"""Hot reload of the rules file and the keys file: a valid new file is swapped in between requests; an
invalid one is rejected, logged and counted, and the old rules (or keys) stay.

:class:`FileWatcher` watches a file's directory, so Kubernetes ConfigMap and Secret updates (an atomic
symlink swap of ``..data``) are seen as well as in-place edits, and calls a reload function on each change.
``reload_rules`` and ``reload_keys`` are those functions; ``POST /admin/reload`` (gateway/admin.py) calls them
too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import watchfiles

from gateway.auth import KeysError
from gateway.errors import RulesError
from gateway.rules import load_rules
from gateway.state import GatewayState

log = logging.getLogger("specgate.reload")


class FileWatcher:
    def __init__(self, path: Path, on_change: Callable[[], object], debounce_ms: int = 50) -> None:
        self._path = Path(path)
        self._on_change = on_change
        self._debounce_ms = debounce_ms

    async def run(self) -> None:
        async for changes in watchfiles.awatch(self._path.parent, debounce=self._debounce_ms, step=20):
            if any(self._concerns(Path(changed)) for _, changed in changes):
                self._on_change()

    def _concerns(self, changed: Path) -> bool:
        # The file itself, or a ConfigMap's / Secret's ``..data`` / timestamped directory swap.
        return changed.name == self._path.name or changed.name.startswith("..")


def rules_watcher(state: GatewayState, path: Path) -> FileWatcher:
    return FileWatcher(path, lambda: reload_rules(state, "on change"))


def keys_watcher(state: GatewayState, path: Path) -> FileWatcher:
    return FileWatcher(path, lambda: reload_keys(state, "on change"))


def reload_rules(state: GatewayState, why: str) -> dict[str, Any]:
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
    log.info("reloaded rules from %s (%d rules) %s", path, len(rules.rules), why)
    return {"status": "reloaded", "rules": len(rules.rules)}


def reload_keys(state: GatewayState, why: str) -> dict[str, Any]:
    """Re-read the keys file and variable; a valid set is swapped in as one reference (limits of keys kept by
    name keep their state), an invalid one is logged and counted and the old keys stay."""
    try:
        count = state.access.reload()
    except KeysError as exc:
        log.error("rejected new keys from %s: %s", exc.source, "; ".join(exc.problems))
        state.metrics.key_reloads.labels("rejected").inc()
        return {"status": "rejected", "problems": exc.problems}
    state.metrics.key_reloads.labels("ok").inc()
    log.info("reloaded keys: %d key(s) %s", count, why)
    return {"status": "reloaded", "keys": count}
