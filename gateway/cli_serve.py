"""``specgate serve`` and ``specgate rules check``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import uvicorn

from gateway import __version__, cli_rules_suggest
from gateway.app import SpecgateApp, create_app
from gateway.auth import KeysError
from gateway.collector import GarbageCollector
from gateway.compiled import build_summary
from gateway.config import Settings
from gateway.errors import MissingExtra, RulesError
from gateway.intake import intake_protocol
from gateway.logs import configure_logging
from gateway.rules import load_rules
from gateway.shutdown import serve

log = logging.getLogger("specgate")

NO_REPLICAS = (
    "specgate: no replicas to route to: give the pools' URLs with --standard/--speculative "
    "(or SPECGATE_STANDARD_URLS/SPECGATE_SPECULATIVE_URLS), or list them under the rules file's `pools:` "
    "({rules})"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument(
        "--rules",
        type=Path,
        help="rules file (default: the shipped gateway/rules.yaml, the adaptive policy: pins, then the pool the "
        "learned model predicts is fastest, the reference rules until it is warm; gateway/rules-reference.yaml "
        "holds the static reference rules alone)",
    )
    serve.add_argument("--standard", help="standard pool replica URLs, comma-separated")
    serve.add_argument("--speculative", help="speculative pool replica URLs, comma-separated")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8080)")
    serve.add_argument("--upstream-client", choices=["auto", "raw", "aiohttp", "httpx", "httpx-aiohttp"])
    serve.add_argument(
        "--log-format", choices=["text", "json"], help="json: JSON lines, one per finished request (default text)"
    )
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
        ("log_format", args.log_format),
    ):
        if value is not None:
            overrides[key] = value
    return Settings(**overrides)


def run_serve(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
        app = create_app(settings)
    except (RulesError, KeysError) as exc:
        what = "rules file" if isinstance(exc, RulesError) else "API keys from"
        print(f"specgate: invalid {what} {exc.source}:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    except MissingExtra as exc:
        print(f"specgate: {exc}", file=sys.stderr)
        return 2
    if not app.state.pools.replicas():
        print(NO_REPLICAS.format(rules=settings.rules_file or "the shipped gateway/rules.yaml"), file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    log_summary(app)
    # Everything built so far (FastAPI, pydantic models, the rules, metrics) lives as long as the process:
    # frozen, the cyclic collector's passes never rescan it; and while serving, what outlives an interval is
    # frozen too, in-flight requests included (gateway/collector.py: passes of 8-57 ms became ...).
    collector = GarbageCollector(
        app.state.metrics, settings.gc_freeze_interval_s, settings.gc_full_growth, settings.gc_young_threshold
    )
    collector.install()
    app.state.collector = collector
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        # uvicorn's httptools protocol plus the relay's direct-write extension and limits on request heads and
        # read time (gateway/intake.py)
        http=intake_protocol(settings.client_max_head_bytes, settings.client_read_timeout_s),
        log_level=settings.log_level,
        log_config=None if settings.log_format == "json" else uvicorn.config.LOGGING_CONFIG,  # json: via the root
        access_log=False,
        proxy_headers=False,  # routing never reads the client address; skip the middleware on the hot path
        server_header=False,
    )
    # SIGTERM drains, then exit 0: gateway/shutdown.py
    return serve(config, app.state, settings.drain_delay_s, settings.shutdown_grace_s)


def log_summary(app: SpecgateApp) -> None:
    """One start-up block: what this process will do, so an operator sees a misconfiguration at once."""
    settings, state = app.state.settings, app.state
    rules = state.ruleset.rules
    client: str = settings.upstream_client
    if client == "auto":
        client = "auto (raw for http://, aiohttp for https://)"
    lines = [
        f"specgate {__version__} listening on http://{settings.host}:{settings.port}",
        f"rules: {settings.rules_file or 'shipped gateway/rules.yaml'} ({len(rules.rules)} rules, "
        f"default pool {rules.default_pool})",
        *(
            f"pool {name}: {', '.join(r.url for r in pool.replicas) or '(no replicas)'}"
            for name, pool in state.pools.pools.items()
        ),
        f"redis: {_redacted(settings.redis_url) if settings.redis_url else 'off (state in this process only)'}",
        f"prometheus: {settings.prometheus_url or 'off (QPS from the local or Redis window)'}",
        f"upstream client: {client}; log format: {settings.log_format}; tracing: {settings.tracing}",
        f"request path: {build_summary()}",
    ]
    log.info("start-up:\n  %s", "\n  ".join(lines))


def _redacted(url: str) -> str:
    """A URL without its password (a Redis URL may carry one)."""
    head, sep, tail = url.rpartition("@")
    if not sep:
        return url
    scheme, _, _ = head.partition("://")
    return f"{scheme}://***@{tail}"


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
