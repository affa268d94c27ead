"""deploy/Dockerfile: pinned base, non-root, health check, and a build context that holds what it needs.

No Docker engine here, so the image itself is not built; the wheel the Dockerfile's first stage builds is,
from exactly the files .dockerignore lets into the context."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import COMPOSE_FILE, REPO_ROOT

DOCKERFILE = REPO_ROOT / "deploy" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_base_image_is_pinned_to_a_patch_version() -> None:
    (arg,) = [value for op, value in instructions() if op == "ARG" and value.startswith("PYTHON_IMAGE=")]
    image = arg.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", image), image
    assert [value for op, value in instructions() if op == "FROM"] == [
        "${PYTHON_IMAGE} AS build",
        "${PYTHON_IMAGE}",
    ]


def test_runs_as_a_non_root_user_with_a_health_check_on_the_served_port() -> None:
    ops = instructions()
    (user,) = [value for op, value in ops if op == "USER"]
    assert user.split(":")[0] not in ("0", "root")
    (cmd,) = [value for op, value in ops if op == "CMD"]
    (healthcheck,) = [value for op, value in ops if op == "HEALTHCHECK"]
    port = yaml.safe_load(cmd)[-1]
    assert f"127.0.0.1:{port}/health" in healthcheck
    assert [value for op, value in ops if op == "ENTRYPOINT"] == ['["specgate"]']


def test_compose_gateway_command_matches_the_image_default() -> None:
    (cmd,) = [value for op, value in instructions() if op == "CMD"]
    gateway = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["gateway"]
    assert gateway["command"] == yaml.safe_load(cmd)
    assert gateway["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}


def context_paths() -> list[str]:
    """The paths .dockerignore lets in: it ignores everything (`*`) and re-includes `!path` lines."""
    lines = [line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "*"
    return [line[1:].rstrip("/") for line in patterns if line.startswith("!")]


def test_every_copied_path_is_in_the_build_context() -> None:
    allowed = set(context_paths())
    for op, value in instructions():
        if op == "COPY" and not value.startswith("--from"):
            for source in value.split()[:-1]:
                assert source.rstrip("*") in allowed, f"COPY {source} is excluded by .dockerignore"


@pytest.mark.slow
def test_the_build_context_builds_a_wheel_with_the_cli_and_its_data(tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    for name in context_paths():
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif source.is_file():
            shutil.copy(source, context / name)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--disable-pip-version-check",
            "-w",
            str(tmp_path / "wheels"),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "wheels").glob("specgate-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("gateway/cli.py", "gateway/rules.yaml", "backends/render.py", "backends/pools/standard.yaml"):
        assert needed in names, f"{needed} missing from the image's wheel"
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "specgate = gateway.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
