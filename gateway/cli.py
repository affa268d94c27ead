"""The ``specgate`` command line (each sub-command lives in its own module with ``register(subparsers)``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gateway import __version__

DESCRIPTION = (
    "specgate is a latency-aware routing gateway for LLM serving. Behind it run two vLLM pools of the same "
    "model, one with speculative decoding and one plain; on every request specgate decides which pool will "
    "answer faster and forwards it there. Applications change only their OpenAI base URL."
)
EPILOG = "Quick start: specgate serve --standard http://vllm-a:8000 --speculative http://vllm-b:8000"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specgate", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"specgate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in _commands():
        register(sub)
    return parser


Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _commands() -> list[Register]:
    # Sub-command modules register themselves here, one line each.
    from backends.emulator import cli as emulator_cli
    from gateway import cli_backends, cli_bench, cli_copies, cli_serve, cli_workloads

    return [
        cli_serve.register,
        cli_backends.register,
        cli_bench.register,
        cli_copies.register,
        cli_workloads.register,
        emulator_cli.register_emulate,
        emulator_cli.register_simulate,
        emulator_cli.register_demo,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
