"""The wheel deploy/Dockerfile's first stage builds: from exactly the files .dockerignore lets into the build
context, with ``SPECGATE_COMPILE=1`` as the Dockerfile sets it (the request path compiled with mypyc, or the
build fails; gateway/bench/compiled_build.py). One build serves the image's checks (tests/deploy) and the
compiled build's (test_compiled.py).
"""

from __future__ import annotations

from pathlib import Path

from gateway.bench.compiled_build import REPO_ROOT, build_wheel, copy_sources

__all__ = ["REPO_ROOT", "build_image_wheel", "context_paths"]


def context_paths() -> list[str]:
    """The paths .dockerignore lets in: it ignores everything (`*`) and re-includes `!path` lines."""
    lines = [line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "*"
    return [line[1:].rstrip("/") for line in patterns if line.startswith("!")]


def build_image_wheel(workdir: Path) -> Path:
    """Copy the build context into ``workdir`` and build its wheel there; the wheel's path."""
    return build_wheel(copy_sources(context_paths(), workdir / "context"), workdir / "wheels")
