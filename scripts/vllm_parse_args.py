"""Feed a rendered ``vllm serve`` argv to the REAL vLLM argument parser and print what it parsed, as JSON.

Runs inside the CPU engine venv (``$SPECGATE_CACHE/vllm-venv/bin/python``), which holds vLLM 0.32.0. It builds
the ``serve`` sub-command parser the way ``vllm``'s own CLI does (``ServeSubcommand().subparser_init``), runs
its ``validate``. With ``"engine_config": true`` it also builds the full engine configuration
(``EngineArgs.from_cli_args(...).create_engine_config()``), which loads the model's config.json and validates
the speculative config; that needs the model on disk, so it is for local models only.

    echo '[{"argv": ["serve", "MODEL", "--flag", ...], "engine_config": false}]' \\
        | python scripts/vllm_parse_args.py RESULTS.json

writes to RESULTS.json (vLLM logs to stdout) a JSON list with, per argv, ``{"accepted": true, "parsed": {...}}`` or
``{"accepted": false, "stage": "argparse" | "engine", "error": "..."}``. Many argvs share one process
because importing vLLM takes about 10 s here.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any

FIELDS = (
    "model",
    "served_model_name",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "port",
    "enforce_eager",
    "dtype",
    "enable_prefix_caching",
    "trust_remote_code",
)


def build_parser() -> Any:
    import vllm.entrypoints.cli.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    commands = {}
    for command in serve.cmd_init():
        command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
        commands[command.name] = command
    return parser, commands


def check(parser: Any, commands: dict[str, Any], argv: list[str], engine_config: bool) -> dict[str, Any]:
    """One argv through the parser (and optionally the engine config); never raises."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = parser.parse_args(argv)
    except SystemExit:  # argparse rejects by printing usage and exiting
        return {"accepted": False, "stage": "argparse", "error": captured.getvalue().strip()}
    try:
        commands[args.subparser].validate(args)
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        if engine_config:  # EngineArgs resolves the model path, so only for local models
            from vllm.engine.arg_utils import EngineArgs

            EngineArgs.from_cli_args(args).create_engine_config()
    except Exception as exc:  # report any rejection, whatever vLLM raises
        return {"accepted": False, "stage": "engine", "error": f"{type(exc).__name__}: {exc}"}
    parsed = {field: getattr(args, field, None) for field in FIELDS}
    parsed["speculative_config"] = getattr(args, "speculative_config", None)
    return {"accepted": True, "parsed": parsed}


def main() -> int:
    """Reads ``[{"argv": [...], "engine_config": false}, ...]`` on stdin; one result per entry to the file."""
    if len(sys.argv) != 2:
        print("usage: vllm_parse_args.py RESULTS.json < REQUESTS.json", file=sys.stderr)
        return 2
    requests = json.load(sys.stdin)
    parser, commands = build_parser()
    results = [check(parser, commands, list(r["argv"]), bool(r.get("engine_config"))) for r in requests]
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(results, out, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
