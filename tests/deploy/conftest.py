"""Fixtures for the deploy checks: the real helm, docker compose and kubernetes-validate binaries.

scripts/setup/20-deploy-tools.sh installs helm and docker compose into $SPECGATE_CACHE/bin (default
``.cache/bin``). A missing binary skips the test on a developer machine and fails it when CI=true.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "specgate"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
# Read at import time: the autouse fixture in tests/conftest.py clears SPECGATE_* for every test.
_CACHE_DIR = Path(os.environ.get("SPECGATE_CACHE", REPO_ROOT / ".cache"))


def missing_tool(what: str) -> NoReturn:
    message = f"{what} not found; run scripts/setup/20-deploy-tools.sh (or scripts/test)"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: deploy tools must be installed)")
    pytest.skip(message)


def _find_binary(name: str) -> Path:
    for candidate in (_CACHE_DIR / "bin" / name, REPO_ROOT / ".cache" / "bin" / name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found is None:
        missing_tool(name)
    return Path(str(found))


def run_tool(
    argv: Sequence[str | Path], *, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in argv],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="session")
def helm() -> Path:
    return _find_binary("helm")


@pytest.fixture(scope="session")
def docker_compose() -> Path:
    return _find_binary("docker-compose")


@pytest.fixture(scope="session")
def kubernetes_validate() -> Path:
    script = Path(sys.executable).parent / "kubernetes-validate"
    if not script.is_file():
        missing_tool("kubernetes-validate (dev extra)")
    return script


@pytest.fixture()
def compose_env() -> Iterator[dict[str, str]]:
    """A clean environment for docker compose: no inherited profiles, tokens or project overrides."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("COMPOSE_", "HF_", "SPECGATE_", "DOCKER_"))
    }
    env["DOCKER_CONFIG"] = str(_CACHE_DIR / "docker")
    yield env


FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"  # copies of real vLLM 0.32.0 /metrics texts, inside the repo


def load_documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]
