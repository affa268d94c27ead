"""The ``specgate`` command line. Each sub-command lives in its own module with ``register(subparsers)``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gateway import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specgate", description=__doc__)
    parser.add_argument("--version", action="version", version=f"specgate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in _commands():
        register(sub)
    return parser


Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _commands() -> list[Register]:
    # Sub-command modules register themselves here, one line each.
    from gateway import cli_backends, cli_bench, cli_serve

    return [
        cli_serve.register,
        cli_backends.register,
        cli_bench.register,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
