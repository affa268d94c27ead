"""This tree built as a user's ``pip install .`` builds it, compiled (setup.py, gateway/compiled.py), for the
benchmarks that put the compiled build beside the source: ``bench overhead --compare-to compiled`` and
``bench decide --compiled``. The wheel is built with pip's isolated build (setuptools and mypy from the
package index) and ``SPECGATE_COMPILE=1``, then unpacked into a directory that a process puts first on its
path (``PYTHONPATH``), as ``--compare-to REV`` does with another commit's files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# What the wheel is built from (the image's build context holds the same: .dockerignore)
SOURCES = ("pyproject.toml", "setup.py", "README.md", "gateway", "backends")
BUILD_TIMEOUT_S = 900  # mypy's check, mypyc's C and one C compiler run: ~1-4 minutes on two shared cores


class BuildError(RuntimeError):
    pass


def build_wheel(source: Path, out: Path, timeout_s: float = BUILD_TIMEOUT_S) -> Path:
    """The compiled wheel of the project at ``source``, written into ``out``; :class:`BuildError` with pip's
    last words when the build fails (no compiler, a type error mypyc refuses)."""
    return pip_wheel(source, out, {"SPECGATE_COMPILE": "1"}, timeout_s)[0]


def pip_wheel(source: Path, out: Path, env: dict[str, str], timeout_s: float = BUILD_TIMEOUT_S) -> tuple[Path, str]:
    """``pip wheel -v`` of the project at ``source`` into ``out`` with ``env`` over this process's variables: the
    wheel, and what pip printed (with the build's own output: setup.py's warnings, which pip shows only when
    verbose)."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--disable-pip-version-check", "-w", str(out),
             str(source)],
            capture_output=True, text=True, timeout=timeout_s, check=False, env={**os.environ, **env},
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"building the wheel took over {timeout_s:g} s") from exc
    if result.returncode != 0:
        raise BuildError(f"building the wheel failed:\n{(result.stdout + result.stderr)[-4000:]}")
    wheels = sorted(out.glob("specgate-*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"expected one specgate wheel in {out}, found {[w.name for w in wheels]}")
    return wheels[0], result.stdout + result.stderr


def python_env(*roots: Path) -> dict[str, str]:
    """This process's variables for a Python that imports ``gateway`` from ``roots`` (first found first): none
    of the ``SPECGATE_*`` settings, ``PYTHONPATH`` the roots. Run it with ``-P`` so that its working directory
    does not come first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECGATE_")}
    env["PYTHONPATH"] = os.pathsep.join(str(root) for root in roots)
    return env


def unpack(wheel: Path, target: Path) -> Path:
    """The wheel's files under ``target`` (what ``pip install --target`` lays out, without the scripts)."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    return target


def copy_sources(names: tuple[str, ...] | list[str], target: Path) -> Path:
    """``names`` (files or directories of this tree) copied into ``target``, without caches or built files."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
        elif source.is_file():
            shutil.copy(source, target / name)
    return target


@contextmanager
def compiled_tree(wheel: Path | None = None) -> Iterator[Path]:
    """This tree's compiled build (or ``wheel``, one built before), unpacked in a temporary directory (removed
    afterwards)."""
    with tempfile.TemporaryDirectory(prefix="specgate-compiled-") as tmp:
        root = Path(tmp)
        if wheel is None:
            wheel = build_wheel(copy_sources(SOURCES, root / "src"), root / "wheels")
        yield unpack(wheel, root / "site")
