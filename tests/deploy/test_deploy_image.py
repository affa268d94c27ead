"""deploy/Dockerfile: pinned base, non-root, health check, and a build context that holds what it needs.

No Docker engine here, so the image itself is not built; the wheel the Dockerfile's first stage builds is,
from exactly the files .dockerignore lets into the context (tests/wheel.py, the session's ``image_wheel``)."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import COMPOSE_FILE, REPO_ROOT
from tests.wheel import context_paths

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


def test_every_copied_path_is_in_the_build_context() -> None:
    allowed = set(context_paths())
    for op, value in instructions():
        if op == "COPY" and not value.startswith("--from"):
            for source in value.split()[:-1]:
                assert source.rstrip("*") in allowed, f"COPY {source} is excluded by .dockerignore"


@pytest.mark.slow
def test_the_build_context_builds_a_wheel_with_the_cli_and_its_data(image_wheel: Path) -> None:
    names = set(zipfile.ZipFile(image_wheel).namelist())
    for needed in ("gateway/cli.py", "gateway/rules.yaml", "backends/render.py", "backends/pools/standard.yaml"):
        assert needed in names, f"{needed} missing from the image's wheel"
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "specgate = gateway.cli:main" in zipfile.ZipFile(image_wheel).read(entry_points).decode()


def test_the_build_stage_compiles_the_request_path_or_fails() -> None:
    """The image is built compiled: the stage has a C compiler and asks for a compiled build (setup.py)."""
    ops = instructions()
    build = ops[: [i for i, (op, _) in enumerate(ops) if op == "FROM"][1]]
    assert any(op == "ENV" and "SPECGATE_COMPILE=1" in value for op, value in build)
    assert any(op == "RUN" and "gcc" in value for op, value in build)
    assert any(op == "COPY" and "setup.py" in value.split() for op, value in build)
