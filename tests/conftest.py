"""Shared fixtures. Every test starts with no SPECGATE_* variables in its environment."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _clean_specgate_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SPECGATE_"):
            monkeypatch.delenv(key, raising=False)
