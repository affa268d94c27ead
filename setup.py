"""The build's one step beyond pyproject.toml: the request path's modules compiled with mypyc.

Which modules, and why those: ``gateway/compiled.py``. ``SPECGATE_COMPILE`` chooses:

- unset or ``auto``: compile where a C compiler is present; where compiling fails for any reason, say so and
  install the same modules as plain Python (nothing half-built);
- ``1``: compile, and fail the build if that fails (the container image);
- ``0``: never compile.

An editable install (``pip install -e``, setuptools' ``editable_wheel``) never compiles: the source tree is what
runs, and an extension built from it would shadow every later edit of its module.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
CHOICE = os.environ.get("SPECGATE_COMPILE", "auto").strip().lower()
if CHOICE not in ("auto", "0", "1"):
    raise SystemExit(f"SPECGATE_COMPILE must be auto, 0 or 1 (got {CHOICE!r})")


def _warn(message: str) -> None:
    print(f"specgate build: {message}", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """All or nothing: with ``auto``, a failed compile leaves no extension behind, so the package installs
    as plain Python instead of a mix whose compiled half may not import."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # any compiler failure: fall back, loudly
            if CHOICE == "1":
                raise
            _warn(f"compiling with mypyc failed ({exc}); installing plain Python")
            for output in self.get_outputs():
                Path(output).unlink(missing_ok=True)
            self.extensions = []


def _drop_stale_extensions() -> None:
    """A plain build must not package extensions an earlier compiled build left in ``build/`` (pip builds a
    local directory in place, and setuptools packages whatever ``build/lib*`` holds)."""
    for stale in ROOT.glob("build/lib*/**/*.so"):
        stale.unlink(missing_ok=True)


def extensions() -> list[object]:
    # only for a command that builds a wheel or the extensions: not for the metadata steps (egg_info, dist_info)
    # that run this file first, and not for an editable install (editable_wheel)
    if not {"bdist_wheel", "build_ext", "build", "install"} & set(sys.argv[1:]):
        return []
    if CHOICE == "0":
        _drop_stale_extensions()
        return []
    modules = runpy.run_path(str(ROOT / "gateway" / "compiled.py"))["MODULES"]
    try:
        from mypyc.build import mypycify

        # The same build wherever it runs: mypy reads none of the installed packages (a fresh `pip install .`
        # builds before the dependencies are installed), so their types read as Any, and the strict settings
        # that refuse Any (subclassing it, returning it, untyped decorators) are relaxed for the build only;
        # `mypy` itself, in the tests, checks the project with them.
        relaxed = ["--no-site-packages", "--ignore-missing-imports", "--allow-subclassing-any",
                   "--allow-untyped-decorators", "--no-warn-return-any", "--no-warn-unused-ignores"]  # fmt: skip
        return list(mypycify([*relaxed, *modules], opt_level="3"))
    except (Exception, SystemExit) as exc:  # mypy missing, or a type error in a compiled module (mypyc exits)
        if CHOICE == "1":
            raise
        _warn(f"not compiling ({exc}); installing plain Python")
        _drop_stale_extensions()
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
