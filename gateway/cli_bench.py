"""``specgate bench ...``: benchmarks that print ratios measured side by side in one run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway import cli_bench_compare, cli_bench_engine, cli_bench_vllm


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    overhead = bench_sub.add_parser("overhead", help="gateway overhead vs direct and vs a minimal aiohttp proxy")
    overhead.add_argument(
        "--targets",
        default=None,
        help="comma-separated targets (default: all but specgate+json-logs and specgate+otel, which measure the "
        "default gateway with JSON request logs or OpenTelemetry tracing on, specgate/keys, "
        "specgate/reference-rules, vllm-router (vLLM Router as a peer) and specgate@REV (another commit's gateway)",
    )
    overhead.add_argument("--concurrency", default="1,64,256", help="comma-separated concurrency levels")
    overhead.add_argument("--scale", type=float, default=1.0, help="multiply request counts (0.1 for a quick run)")
    overhead.add_argument(
        "--pace-ms", type=float, default=20.0, help="the paced scenarios' time per token (default 20 ms)"
    )
    overhead.add_argument("--json", type=Path, help="also write the results as JSON")
    overhead.add_argument("--rules", type=Path, help="rules file for the gateway targets (default: the shipped one)")
    overhead.add_argument(
        "--compare-to",
        metavar="REV",
        help="this tree's gateway against REV's (git archive), alternating, same apparatus; one gateway target. "
        "'compiled': this tree's compiled build (a wheel built as pip install . builds it, with mypyc) against "
        "its source, interpreted",
    )
    overhead.add_argument("--rounds", type=int, default=3, help="with --compare-to: runs per side (default 3)")
    overhead.add_argument(
        "--wheel", type=Path, help="with --compare-to compiled: this compiled wheel instead of building one"
    )
    overhead.add_argument(
        "--paired",
        action="store_true",
        help="run two gateways at once on the same CPU under the same load: this tree's and --compare-to REV's, "
        "or (without --compare-to) two proxy targets of this tree, e.g. --targets "
        "specgate/reference-rules,specgate or vllm-router,specgate (ratios move by a few percent between rounds "
        "instead of tens; absolute figures are those of two proxies sharing a CPU)",
    )
    overhead.set_defaults(func=run_overhead)
    soak = bench_sub.add_parser("soak", help="N paced streams for minutes through specgate serve: RSS, fds, loop lag")
    soak.add_argument("--streams", type=int, default=1000, help="concurrent paced streams (default 1000)")
    soak.add_argument("--duration", type=float, default=600.0, help="seconds through the gateway (default 600)")
    soak.add_argument("--direct", type=float, default=120.0, help="seconds of the same load direct (default 120)")
    soak.add_argument("--chunks", type=int, default=64, help="events per stream (default 64)")
    soak.add_argument("--pace", type=float, default=0.05, help="seconds between a stream's events (default 0.05)")
    soak.add_argument("--sample", type=float, default=5.0, help="seconds between samples (default 5)")
    soak.add_argument("--warmup", type=float, default=60.0, help="RSS growth counts from here (default 60 s)")
    soak.add_argument(
        "--no-pin",
        action="store_true",
        help="let the gateway, the load generator and the upstream share every CPU (default: the gateway alone on "
        "the first CPU, the others for the apparatus, as bench overhead does)",
    )
    soak.add_argument(
        "--rev", help="soak another commit's gateway (git archive) with this tree's apparatus, for a before/after"
    )
    soak.add_argument("--plot", type=Path, default=Path("soak.png"), help="where to save the plot")
    soak.add_argument("--json", type=Path, help="also write the samples and results as JSON")
    soak.set_defaults(func=run_soak)
    cli_bench_compare.register(bench_sub)
    cli_bench_vllm.register(bench_sub)
    cli_bench_engine.register(bench_sub)
    cli_bench_engine.register_kv_events(bench_sub)
    signals = bench_sub.add_parser(
        "signals", help="request latency while Redis and Prometheus are healthy, slow (SIGSTOPped) or down"
    )
    signals.add_argument("--requests", type=int, default=1500, help="requests per condition")
    signals.add_argument("--settle", type=float, default=3.0, help="seconds between start-up and measuring")
    signals.set_defaults(func=run_signals)
    hooks = bench_sub.add_parser("hooks", help="CPU per request of the JSON request log and of tracing, in-process")
    hooks.add_argument("-n", type=int, default=20000, help="calls per run")
    hooks.add_argument("--repeat", type=int, default=5, help="runs (the best counts)")
    hooks.set_defaults(func=run_hooks)
    route = bench_sub.add_parser(
        "route", help="the workload through the gateway to two real pools: pinned, reference rules, adaptive"
    )
    route.add_argument("--standard", required=True, help="standard pool URL (e.g. `specgate backends launch --cpu`)")
    route.add_argument("--speculative", required=True, help="speculative pool URL")
    route.add_argument("--workload", type=Path, action="append", help="workload file or directory (repeatable; "
                       "default: the shipped backends/workloads/data)")  # fmt: skip
    route.add_argument("--per-category", type=int, default=None, help="at most this many prompts per category")
    route.add_argument("--concurrency", default="1,8", help="comma-separated closed-loop concurrency levels")
    route.add_argument("--max-tokens", type=int, default=128, help="cap on each request's max_tokens")
    route.add_argument("--min-samples", type=int, default=None, help="override adaptive.min_samples (short runs)")
    route.add_argument("--repeat", type=int, default=2, help="passes over the four phases per level, each in the "
                       "reverse order of the one before (default 2: drift in the machine's speed weighs on all alike)")
    route.add_argument("--json", type=Path, help="also write the results as JSON")
    route.add_argument("--suggest-k", type=int, metavar="K", help="the speculative pool's k: after the run, print "
                       "the k table `specgate backends suggest-k` reads from the adaptive gateway's model")
    route.set_defaults(func=run_route)
    sessions = bench_sub.add_parser(
        "sessions", help="multi-turn conversations through the gateway to two real pools: pinned, cache-blind, "
        "cache-aware (TTFT of later turns, the engines' prefix-cache hit rate)",
    )  # fmt: skip
    sessions.add_argument("--standard", required=True, action="append", help="standard pool URL (e.g. `specgate "
                          "backends launch --cpu`); repeat it once per replica")
    sessions.add_argument("--speculative", required=True, action="append", help="speculative pool URL (repeatable)")
    sessions.add_argument("--sessions", type=Path, action="append", help="session file or directory (repeatable; "
                          "default: the shipped backends/workloads/sessions)")  # fmt: skip
    sessions.add_argument("--sessions-per-file", type=int, default=3, help="the first N sessions of each file")
    sessions.add_argument("--turns", type=int, default=4, help="at most N turns per conversation (default 4)")
    sessions.add_argument("--concurrency", type=int, default=4, help="conversations in flight at once (default 4)")
    sessions.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every turn (default 64)")
    sessions.add_argument("--think-time", type=float, default=0.0, help="seconds between an answer and the next turn")
    sessions.add_argument("--system-bytes", type=int, default=2048, help="system prompt cut to N bytes (default 2048)")
    sessions.add_argument("--message-bytes", type=int, default=768, help="each turn's message cut to N bytes "
                          "(default 768; the CPU pair's context is 2,048 tokens)")  # fmt: skip
    sessions.add_argument("--min-samples", type=int, default=None, help="override adaptive.min_samples (short runs)")
    sessions.add_argument("--repeat", type=int, default=2, help="passes over the four phases, each in the reverse "
                          "order of the one before (default 2)")  # fmt: skip
    sessions.add_argument("--json", type=Path, help="also write the results as JSON")
    sessions.set_defaults(func=run_sessions)
    limits = bench_sub.add_parser("limits", help="per-key limit accuracy with two gateway replicas over a real Redis")
    limits.add_argument("--seconds", type=float, default=30.0, help="seconds per scenario (default 30)")
    limits.add_argument("--clients", type=int, default=8, help="closed-loop clients per gateway (default 8)")
    limits.add_argument("--sync", type=float, default=0.25, help="redis_sync_interval_s (default 0.25)")
    limits.set_defaults(func=run_limits)
    decide = bench_sub.add_parser("decide", help="the cost of one routing decision per policy (micro-benchmark)")
    decide.add_argument("--rounds", type=int, default=20_000, help="calls timed per row")
    decide.add_argument(
        "--compiled",
        action="store_true",
        help="this tree's compiled build (a wheel built as pip install . builds it, with mypyc) against its "
        "source, each in a process of its own, alternating",
    )
    decide.add_argument("--wheel", type=Path, help="with --compiled: this compiled wheel instead of building one")
    decide.set_defaults(func=run_decide)
    prefix = bench_sub.add_parser("prefix-index", help="the prefix index's memory for N sessions and its cost per call")
    prefix.add_argument("--sessions", type=int, default=100_000, help="synthetic chat sessions (default 100,000)")
    prefix.add_argument("--replicas", type=int, default=4, help="replicas the sessions spread over (default 4)")
    prefix.add_argument("--turns", type=int, default=3, help="turns per session (default 3)")
    prefix.add_argument("--capacity", type=int, default=None, help="values per replica (default: the setting's)")
    prefix.add_argument("--rounds", type=int, default=20_000, help="calls timed per row")
    prefix.set_defaults(func=run_prefix_index)


def run_overhead(args: argparse.Namespace) -> int:
    from gateway.bench import overhead

    targets = args.targets.split(",") if args.targets else list(overhead.TARGETS)
    known = (*overhead.TARGETS, *overhead.EXTRA_TARGETS)
    unknown = sorted(t for t in set(targets) - set(known) if not t.startswith("specgate@"))
    if unknown:
        raise SystemExit(f"unknown targets: {', '.join(unknown)} (known: {', '.join(known)})")
    concurrency = [int(c) for c in args.concurrency.split(",")]
    return overhead.main(
        targets, concurrency, args.scale, args.json, args.rules, args.compare_to, args.rounds, args.paired,
        pace_s=args.pace_ms / 1e3, wheel=args.wheel,
    )


def run_signals(args: argparse.Namespace) -> int:
    from gateway.bench import signals_latency
    from gateway.bench.services import MissingBinary

    try:
        return signals_latency.main(args.requests, args.settle)
    except MissingBinary as exc:
        raise SystemExit(f"specgate bench signals: {exc}") from exc


def run_hooks(args: argparse.Namespace) -> int:
    from gateway.bench import hooks

    return hooks.main(args.n, args.repeat)


def run_decide(args: argparse.Namespace) -> int:
    from gateway.bench import decide

    return decide.main(args.rounds, args.compiled, args.wheel)


def run_prefix_index(args: argparse.Namespace) -> int:
    from gateway.bench import prefix_index
    from gateway.prefix_index import BLOCKS_PER_REPLICA

    capacity = args.capacity or BLOCKS_PER_REPLICA
    return prefix_index.main(args.sessions, args.replicas, args.turns, capacity, args.rounds)


def run_route(args: argparse.Namespace) -> int:
    from rich.console import Console

    from backends.workloads.loader import DATA_DIR
    from gateway.bench import route
    from gateway.cli_bench_compare import WorkloadFileError, load_items

    try:
        items = load_items(args.workload or [DATA_DIR], args.per_category)
        levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except (WorkloadFileError, ValueError) as exc:
        raise SystemExit(f"specgate bench route: {exc}") from exc
    config = route.RouteConfig(
        args.standard.rstrip("/"), args.speculative.rstrip("/"), items, levels, args.max_tokens, args.min_samples,
        repeat=args.repeat, suggest_k=args.suggest_k,
    )
    result = route.bench_route(config)
    route.report(result, Console(width=160))
    if args.json:
        route.write_json(args.json, result)
    return 1 if result.errors() else 0


def run_sessions(args: argparse.Namespace) -> int:
    from rich.console import Console

    from backends.workloads.loader import WorkloadError
    from gateway.bench import sessions, sessions_report

    try:
        conversations = sessions.load_conversations(
            args.sessions, args.sessions_per_file, args.turns, args.system_bytes, args.message_bytes
        )
    except (WorkloadError, OSError) as exc:
        raise SystemExit(f"specgate bench sessions: {exc}") from exc
    config = sessions.SessionsConfig(
        [url.rstrip("/") for url in args.standard], [url.rstrip("/") for url in args.speculative], conversations,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens, think_time_s=args.think_time, repeat=args.repeat, min_samples=args.min_samples,
    )  # fmt: skip
    result = sessions.bench_sessions(config)
    sessions_report.report(result, Console(width=200))
    if args.json:
        sessions_report.write_json(args.json, result)
    return 1 if result.errors() else 0


def run_soak(args: argparse.Namespace) -> int:
    from rich.console import Console

    from gateway.bench import soak, soak_report

    config = soak.SoakConfig(
        streams=args.streams, duration_s=args.duration, direct_s=args.direct, chunks=args.chunks,
        pace_s=args.pace, sample_s=args.sample, warmup_s=args.warmup, pin=not args.no_pin, rev=args.rev,
    )  # fmt: skip
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # samples show as they come, also into a log file
    console = Console(width=160)
    console.print(f"[bold]specgate bench soak[/]: {config.streams} streams, {config.chunks} events x "
                  f"{config.pace_s * 1e3:.0f} ms, {config.duration_s:.0f} s through specgate"
                  f"{'@' + config.rev if config.rev else ''}, "
                  f"{config.direct_s:.0f} s direct")  # fmt: skip
    result = soak.run(config, console)
    soak_report.render(result, console)
    soak_report.plot(result, args.plot)
    console.print(f"plot: {args.plot}")
    if args.json is not None:
        soak.write_json(result, args.json)
    return 1 if result.errors else 0


def run_limits(args: argparse.Namespace) -> int:
    from gateway.bench import limits_accuracy

    return limits_accuracy.main(args.seconds, args.clients, args.sync)
