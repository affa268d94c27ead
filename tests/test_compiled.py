"""The compiled build (setup.py, gateway/compiled.py).

The wheel a user's ``pip install .`` or the image builds compiles every listed module with mypyc; the compiled
gateway extracts the same features and makes the same decisions as the source, request by request; and the
tests of the compiled modules (and of the request path over them) pass against the compiled package. The rest
of the suite runs the editable install, which is the source, interpreted.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gateway.bench.compiled_build import SOURCES, BuildError, copy_sources, pip_wheel, python_env, unpack
from gateway.compiled import MODULES, build_summary, compiled_modules, module_name
from tests.wheel import REPO_ROOT

# The suites run against the compiled package: each compiled module's own tests, the request path's over them
# (the relay's failures, retries, resumed streams and breakers included), malformed input, and the simulator's
# golden figures (the same routing to the last digit).
COMPILED_SUITES = (
    "tests/test_features.py", "tests/test_decide.py", "tests/test_pools.py", "tests/test_prefix_index.py",
    "tests/test_qps.py", "tests/test_snapshot.py", "tests/test_stream_usage.py", "tests/test_proxy.py",
    "tests/test_token_charge.py", "tests/adaptive/test_cells.py", "tests/adaptive/test_content.py",
    "tests/adaptive/test_learner.py", "tests/adaptive/test_policy.py", "tests/adaptive/test_predictor.py",
    "tests/adaptive/test_templates.py", "tests/fuzz", "tests/test_rawclient.py", "tests/test_upstream.py",
    "tests/test_guard.py", "tests/test_limits.py", "tests/test_passthrough.py", "tests/test_responses.py",
    "tests/test_resume.py", "tests/test_breaker.py",
    "tests/emulator/test_session_sim.py::test_single_turn_figures_are_unchanged_to_the_last_digit",
    "tests/emulator/test_simulate.py::test_the_learner_is_taught_the_load_each_request_ran_at",
)  # fmt: skip


def test_every_listed_module_is_a_module_of_the_package_and_the_source_install_runs_them_interpreted() -> None:
    for path in MODULES:
        assert (REPO_ROOT / path).is_file(), path
        assert module_name(path).startswith("gateway.")
    assert len(set(MODULES)) == len(MODULES)
    assert compiled_modules() == []  # the tests' editable install: the source tree runs
    assert build_summary().startswith("interpreted")


# The compiled modules' dataclasses made per request or per finished one, whose __init__ is written out: compiled,
# the one dataclasses generates runs interpreted, 8x slower than a compiled one (gateway/compiled.py).
HAND_WRITTEN_INITS = {"RequestFeatures", "Decision", "Snapshot", "Prediction", "Choice", "Content", "Observation"}


def test_a_written_out_dataclass_init_takes_and_sets_every_field_as_the_generated_one_would() -> None:
    found: dict[str, type] = {}
    for path in MODULES:
        module = importlib.import_module(module_name(path))
        for cls in vars(module).values():
            if (
                isinstance(cls, type) and cls.__module__ == module.__name__ and dataclasses.is_dataclass(cls)
                and cls.__init__.__code__.co_filename != "<string>"  # dataclasses' is made from a string
            ):  # fmt: skip
                found[cls.__name__] = cls
    assert set(found) == HAND_WRITTEN_INITS
    for name, cls in found.items():
        fields = dataclasses.fields(cls)
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
        assert [p.name for p in parameters] == [f.name for f in fields], name
        for parameter, field in zip(parameters, fields, strict=True):
            if field.default is not dataclasses.MISSING:
                expected = field.default
            elif field.default_factory is not dataclasses.MISSING:
                expected = field.default_factory()
            else:
                expected = inspect.Parameter.empty
            assert parameter.default == expected, f"{name}.{field.name}"
        values = {f.name: object() for f in fields}
        made = cls(**values)
        assert all(getattr(made, key) is value for key, value in values.items()), name


def coroutine_hazards(source: str) -> list[str]:
    """What mypyc 2.4.1 compiles wrongly in a coroutine (gateway/compiled.py), as ``line: what``: an ``await``,
    ``async with`` or ``async for`` inside a ``finally``; any ``async with``; a ``raise ... from cause`` that does
    not raise ``chained(error, cause)`` with the same cause (its ``__cause__`` would be lost)."""
    found: list[str] = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.AsyncFunctionDef):
            continue
        for node in _own_nodes(function):
            if isinstance(node, ast.Try | ast.TryStar):
                for part in node.finalbody:
                    if isinstance(part, ast.FunctionDef | ast.AsyncFunctionDef):
                        continue  # defined there, run elsewhere
                    if any(isinstance(n, ast.Await | ast.AsyncWith | ast.AsyncFor) for n in _own_nodes(part)):
                        found.append(f"{part.lineno}: an await in finally ({function.name})")
            elif isinstance(node, ast.AsyncWith):
                found.append(f"{node.lineno}: async with ({function.name})")
            elif isinstance(node, ast.Raise) and node.cause is not None:
                raised = node.exc
                if not (
                    isinstance(raised, ast.Call) and isinstance(raised.func, ast.Name) and raised.func.id == "chained"
                    and len(raised.args) == 2 and ast.dump(raised.args[1]) == ast.dump(node.cause)
                ):  # fmt: skip
                    found.append(f"{node.lineno}: raise from without chained() ({function.name})")
    return found


def _own_nodes(node: ast.AST) -> list[ast.AST]:
    """``node`` and what it holds, but not what functions defined inside it hold (their own code)."""
    out, todo = [], [node]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += [child for child in ast.iter_child_nodes(current)
                 if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)]  # fmt: skip
    return out


def test_the_compiled_coroutines_keep_clear_of_what_mypyc_compiles_wrongly() -> None:
    for path in MODULES:
        assert coroutine_hazards((REPO_ROOT / path).read_text()) == [], path


def test_the_coroutine_check_finds_each_hazard() -> None:
    source = """
async def a(r):
    try:
        await r.read()
    finally:
        await r.close()
async def b(r):
    async with r:
        pass
async def c(r):
    try:
        await r.read()
    except OSError as exc:
        raise ValueError("x") from exc
async def d(r):
    try:
        await r.read()
    except OSError as exc:
        raise chained(ValueError("x"), None) from exc
async def fine(r):
    try:
        await r.read()
    except OSError as exc:
        await r.close()
        raise chained(ValueError("x"), exc) from exc
    finally:
        r.done()
        async def inner():
            await r.later()
    def sync_inner():
        raise ValueError("x") from None
"""
    assert [hazard.split(": ", 1)[1] for hazard in coroutine_hazards(source)] == [
        "an await in finally (a)", "async with (b)", "raise from without chained() (c)",
        "raise from without chained() (d)",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def compiled_site(image_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(image_wheel, tmp_path_factory.mktemp("compiled-site"))


def _python(
    site: Path, *args: str, cwd: Path, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Python with ``site`` first on its path (-P: not the working directory), so ``gateway`` is the wheel's."""
    env = {**python_env(site, REPO_ROOT), **(env_extra or {})}
    return subprocess.run([sys.executable, "-P", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip


@pytest.mark.slow
def test_the_wheel_compiles_every_listed_module(image_wheel: Path, compiled_site: Path) -> None:
    built = {name.split("/")[-1].split(".")[0] for name in os.listdir(compiled_site) if name.endswith(".so")}
    assert any(name.endswith("__mypyc") for name in built), "no mypyc runtime library in the wheel"
    for path in MODULES:
        extension = list((compiled_site / path).parent.glob(Path(path).stem + ".*.so"))
        assert extension, f"{path} is not compiled in the wheel"
    summary = _python(compiled_site, "-c", "from gateway.compiled import build_summary; print(build_summary())",
                      cwd=compiled_site)  # fmt: skip
    assert summary.stdout.strip() == f"compiled with mypyc ({len(MODULES)} modules)", summary.stderr


@pytest.mark.slow
def test_the_compiled_gateway_reads_and_routes_every_request_as_the_source_does(compiled_site: Path) -> None:
    source = _python(REPO_ROOT, "-m", "tests.compiled_probe", cwd=REPO_ROOT)
    compiled = _python(compiled_site, "-m", "tests.compiled_probe", cwd=compiled_site)
    assert source.returncode == 0, source.stderr
    assert compiled.returncode == 0, compiled.stderr
    a, b = json.loads(source.stdout), json.loads(compiled.stdout)
    assert a["compiled"] == [] and b["compiled"] == [module_name(p) for p in MODULES]
    assert a["requests"] > 500 and a["decided"] > 10_000
    assert {k: v for k, v in a.items() if k != "compiled"} == {k: v for k, v in b.items() if k != "compiled"}


@pytest.mark.slow
def test_the_compiled_modules_pass_their_tests(compiled_site: Path) -> None:
    suites = [str(REPO_ROOT / suite) for suite in COMPILED_SUITES]
    for suite in suites:
        assert Path(suite.split("::")[0]).exists(), suite
    result = _python(
        compiled_site, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=append",
        "--rootdir", str(REPO_ROOT), "-c", str(REPO_ROOT / "pyproject.toml"), "-o", "pythonpath=",
        "-m", "not vllm", *suites, cwd=compiled_site,
        env_extra={"TEST_SPECGATE_COMPILED": "1"},  # tests/conftest.py: refuse to start unless all are compiled
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


@pytest.mark.slow
def test_where_compiling_fails_the_install_falls_back_to_plain_python_whole(tmp_path: Path) -> None:
    """``SPECGATE_COMPILE=auto`` (the default) with a C compiler that fails: a wheel of plain Python, no extension
    left half-built, and the reason in pip's verbose output. With ``=1`` the same build fails."""
    source = copy_sources(SOURCES, tmp_path / "src")
    wheel, log = pip_wheel(source, tmp_path / "auto", {"SPECGATE_COMPILE": "auto", "CC": "false"})
    names = zipfile.ZipFile(wheel).namelist()
    assert "gateway/features.py" in names
    assert not [n for n in names if n.endswith(".so")], "an extension was left in the fallback wheel"
    assert "installing plain Python" in log
    with pytest.raises(BuildError):
        pip_wheel(source, tmp_path / "strict", {"SPECGATE_COMPILE": "1", "CC": "false"})
