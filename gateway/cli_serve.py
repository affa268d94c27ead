"""``specgate serve`` and ``specgate rules check``."""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path
from typing import Any

import uvicorn

from gateway import cli_rules_suggest
from gateway.app import create_app
from gateway.config import Settings
from gateway.direct import DirectBodyProtocol
from gateway.errors import RulesError
from gateway.rules import load_rules
from gateway.shutdown import serve


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--rules", type=Path, help="rules file (default: the shipped reference rules)")
    serve.add_argument("--standard", help="standard pool replica URLs, comma-separated")
    serve.add_argument("--speculative", help="speculative pool replica URLs, comma-separated")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8080)")
    serve.add_argument("--upstream-client", choices=["auto", "raw", "aiohttp", "httpx", "httpx-aiohttp"])
    serve.set_defaults(func=run_serve)

    rules = sub.add_parser("rules", help="work with rules files")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True)
    check = rules_sub.add_parser("check", help="validate a rules file; exit 1 naming each bad key")
    check.add_argument("file", type=Path)
    check.set_defaults(func=run_rules_check)
    cli_rules_suggest.register(rules_sub)


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for key, value in (
        ("rules_file", args.rules),
        ("standard_urls", args.standard),
        ("speculative_urls", args.speculative),
        ("host", args.host),
        ("port", args.port),
        ("upstream_client", args.upstream_client),
    ):
        if value is not None:
            overrides[key] = value
    return Settings(**overrides)


def run_serve(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
        app = create_app(settings)
    except RulesError as exc:
        print(f"specgate: invalid rules file {exc.source}:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # health checks would log every poll
    # Everything built so far (FastAPI, pydantic models, the rules, metrics) lives as long as the process:
    # freezing it keeps the cyclic collector's full passes from re-scanning it (about 90k objects; full
    # passes went from ~60 ms to ~4 ms under load, see docs/architecture.md).
    gc.collect()
    gc.freeze()
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=DirectBodyProtocol,  # uvicorn's httptools protocol plus the relay's direct-write extension
        log_level=settings.log_level,
        access_log=False,
        proxy_headers=False,  # routing never reads the client address; skip the middleware on the hot path
        server_header=False,
    )
    # SIGTERM drains, then exit 0: gateway/shutdown.py
    return serve(config, app.state, settings.drain_delay_s, settings.shutdown_grace_s)


def run_rules_check(args: argparse.Namespace) -> int:
    try:
        rules = load_rules(args.file)
    except RulesError as exc:
        print(f"{exc.source}: invalid", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print(f"{args.file}: ok ({len(rules.rules)} rules, tasks: {', '.join(rules.task_names())})")
    return 0
