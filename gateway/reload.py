"""Hot reload of the rules file: a valid new file is swapped in between requests; an invalid one is
rejected, logged and counted, and the old rules stay.

The watcher watches the file's directory, so Kubernetes ConfigMap updates (an atomic symlink swap of
``..data``) are seen as well as in-place edits.
"""

from __future__ import annotations

import logging
from pathlib import Path

import watchfiles

from gateway.errors import RulesError
from gateway.rules import load_rules
from gateway.state import GatewayState

log = logging.getLogger("specgate.reload")


class RulesWatcher:
    def __init__(self, state: GatewayState, path: Path, debounce_ms: int = 50) -> None:
        self._state = state
        self._path = Path(path)
        self._debounce_ms = debounce_ms

    async def run(self) -> None:
        async for changes in watchfiles.awatch(self._path.parent, debounce=self._debounce_ms, step=20):
            if any(self._concerns(Path(changed)) for _, changed in changes):
                self.reload()

    def _concerns(self, changed: Path) -> bool:
        # The file itself, or a ConfigMap's ``..data`` / timestamped directory swap.
        return changed.name == self._path.name or changed.name.startswith("..")

    def reload(self) -> bool:
        try:
            rules = load_rules(self._path)
        except RulesError as exc:
            log.error("rejected new rules from %s: %s", self._path, "; ".join(exc.problems))
            self._state.metrics.rule_reloads.labels("rejected").inc()
            return False
        self._state.apply_rules(rules)
        self._state.metrics.rule_reloads.labels("ok").inc()
        log.info("reloaded rules from %s (%d rules)", self._path, len(rules.rules))
        return True
