"""The CI-aware skip: a missing dependency skips on a developer machine and fails when CI=true."""

from __future__ import annotations

import pytest

from tests.signals._paths import missing
from tests.signals.servers import require_binary


def test_missing_dependency_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        require_binary("specgate-no-such-binary")


def test_missing_dependency_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        missing("redis-server is not installed")
