"""Which of the gateway's modules an install compiles with mypyc, and whether this process runs them compiled.

The routing decision and what it reads are plain, strictly typed Python; mypyc (the compiler that ships with
mypy) turns the modules below into C extensions when a wheel is built (``setup.py``), which halves the
decision's time and cuts the gateway's CPU per non-streamed request by two fifths (docs/performance.md,
"Compiled"). The same source runs interpreted where no compiler is present, in an editable install
(development: an edited file must not be shadowed by a stale extension), or with ``SPECGATE_COMPILE=0``.

The relay's coroutines are compiled too (``proxy``, ``passthrough``, ``responses``, ``rawclient``, ``guard``,
``limits``): half of that CPU saving is theirs. mypyc 2.4.1 gets two things wrong in a
coroutine that the interpreter gets right, so the compiled coroutines keep clear of them
(``tests/test_compiled.py`` reads the modules' syntax and fails where one does not):

- an ``await`` inside ``finally`` (or ``async with``, whose exit is one): where the exception being unwound came
  from an awaited future and was re-raised in an ``except``, it is lost, and the function runs on past the
  ``finally`` as if nothing had been raised. The compiled code closes in an ``except BaseException: ...; raise``
  and again after the ``try``, and times out with ``asyncio.wait_for``.
- ``raise ... from cause`` leaves no ``__cause__``: they raise ``errors.chained(error, cause) from cause``.

A compiled dataclass keeps the ``__init__`` that ``dataclasses`` generates, which runs interpreted: 8x the time of
a compiled one, 10 % of a decision. The dataclasses made per request write theirs out (the fields in order;
``tests/test_compiled.py`` checks each).

Left out: ``upstream`` (aiohttp and httpx clients, the health checks' GETs: off the hot path, and written with
``async with``), ``state`` (tests replace its methods on an instance, which a compiled class does not allow),
``direct`` and ``intake`` (uvicorn's protocol subclassed: compiled with the rest, the package failed to import,
``native module 'gateway.decide' in sys.modules was replaced after initialization``; not pursued); ``app`` (an
async generator); and what runs at start-up or on command only.

``setup.py`` reads ``MODULES`` by path (the build environment has none of the package's dependencies), so
this file imports nothing from the package.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys

MODULES = (
    "gateway/bounds.py",
    "gateway/features.py",
    "gateway/snapshot.py",
    "gateway/decide.py",
    "gateway/pools.py",
    "gateway/prefix_index.py",
    "gateway/qps.py",
    "gateway/stream_usage.py",
    "gateway/adaptive/cells.py",
    "gateway/adaptive/content.py",
    "gateway/adaptive/learner.py",
    "gateway/adaptive/model.py",
    "gateway/adaptive/policy.py",
    "gateway/adaptive/predictor.py",
    "gateway/proxy.py",
    "gateway/passthrough.py",
    "gateway/responses.py",
    "gateway/rawclient.py",
    "gateway/guard.py",
    "gateway/limits.py",
)


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def compiled_modules() -> list[str]:
    """The modules of :data:`MODULES` this process imported as compiled extensions (each is imported)."""
    found = []
    for path in MODULES:
        name = module_name(path)
        module = sys.modules.get(name) or importlib.import_module(name)
        origin = getattr(module, "__file__", None) or ""
        if origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            found.append(name)
    return found


def build_summary() -> str:
    """One line for the start-up banner: how much of the request path runs compiled."""
    found = compiled_modules()
    if not found:
        return "interpreted (no compiled modules: an editable install, SPECGATE_COMPILE=0, or no C compiler)"
    if len(found) == len(MODULES):
        return f"compiled with mypyc ({len(found)} modules)"
    return f"partly compiled ({len(found)} of {len(MODULES)} modules; the rest interpreted)"
