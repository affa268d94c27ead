"""``specgate emulate``, ``specgate simulate`` and ``specgate demo``: registered in gateway/cli.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from backends.emulator.profiles import shipped_profiles
from backends.emulator.scenarios import LOAD_SHARES, SCENARIOS

if TYPE_CHECKING:
    from backends.emulator.profiles import Profile
    from backends.emulator.simulate import PolicySet
    from backends.workloads.loader import Workload

SubParsers = "argparse._SubParsersAction[argparse.ArgumentParser]"


def register_emulate(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("emulate", help="run an emulated vLLM server (no GPU; figures are emulated)")
    parser.add_argument(
        "--profile",
        default="a100-70b-draft",
        help=f"shipped profile ({', '.join(shipped_profiles())}) or a YAML path",
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--speculative", action="store_true", help="emulate a speculative-decoding engine")
    mode.add_argument("--standard", action="store_true", help="emulate a plain engine")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--speed", type=_positive, default=1.0, help="run this many times faster than the profile")
    parser.add_argument("--seed", type=int, default=0, help="seed of the acceptance draws")
    parser.add_argument(
        "--workload",
        type=Path,
        action="append",
        help="workload YAML with ground truth (repeatable; default: the shipped workloads)",
    )
    parser.add_argument("--served-model-name", help="model name to serve (default: the profile's)")
    parser.add_argument(
        "--server",
        choices=["asgi", "aiohttp"],
        default="asgi",
        help="transport: raw ASGI under uvicorn (default) or aiohttp.web",
    )
    parser.set_defaults(func=_run_emulate)


def _run_emulate(args: argparse.Namespace) -> int:
    import uvicorn

    from backends.emulator.profiles import ProfileError, load_profile
    from backends.emulator.server import EmulatorApp, EmulatorConfig
    from backends.workloads.loader import WorkloadError, load_workload

    try:
        profile = load_profile(args.profile)
        workload = load_workload(args.workload)
    except (ProfileError, WorkloadError, OSError) as exc:
        print(f"specgate emulate: {exc}")
        return 2
    config = EmulatorConfig(
        profile,
        speculative=args.speculative,
        speed=args.speed,
        seed=args.seed,
        served_model_name=args.served_model_name,
    )
    print(
        f"EMULATED vLLM ({config.mode}, profile {profile.name}, speed x{args.speed}, {args.server}) "
        f"on http://{args.host}:{args.port}",
        flush=True,
    )
    if args.server == "aiohttp":
        from aiohttp import web

        from backends.emulator.aiohttp_server import build_aiohttp_app
        from backends.emulator.core import EmulatorCore

        app = build_aiohttp_app(EmulatorCore(config, workload))
        web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, handler_cancellation=True)
        return 0
    uvicorn.run(
        EmulatorApp(config, workload),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    return 0


def register_simulate(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate", help="evaluate routing policies in virtual time against emulated pools (figures are emulated)"
    )
    parser.add_argument("--profile", default="a100-70b-draft", help="shipped profile, YAML path, or 'all'")
    parser.add_argument(
        "--loads", default=",".join(f"{s:g}" for s in LOAD_SHARES),
        help="comma-separated load levels as shares of one pool's capacity (default 0.1 .. 1.5)",
    )  # fmt: skip
    parser.add_argument("--qps", help="comma-separated load levels in requests/s (instead of --loads)")
    parser.add_argument("--duration", type=float, default=90.0, help="virtual seconds of arrivals per level")
    parser.add_argument("--warmup", type=float, default=10.0, help="virtual seconds left out of the level tables")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenarios", default="ramp,mix-shift,drift", help="scenarios to run ('' for none)")
    parser.add_argument("--scenario-load", type=float, default=0.7, help="(peak) load share of the scenarios")
    parser.add_argument("--scenario-duration", type=float, default=240.0, help="virtual seconds per scenario")
    parser.add_argument(
        "--workload", type=Path, action="append",
        help="workload YAML with ground truth, or a directory of them (repeatable; default: the shipped "
             "backends/workloads/data): simulate your own traffic",
    )  # fmt: skip
    parser.add_argument("--replicas", type=int, default=1, help="engines per pool")
    parser.add_argument(
        "--gateways", type=_count, default=1,
        help="gateway replicas in front of the pools (arrivals dealt round-robin; each sees the others' requests "
             "only through the engines' stats, a scrape late; the clairvoyant bounds stay one router)",
    )  # fmt: skip
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between engine-stat scrapes")
    parser.add_argument("--rules", type=Path, help="the reference policy (default gateway/rules-reference.yaml)")
    parser.add_argument("--adaptive-rules", type=Path, help="the adaptive policy (default: the shipped rules)")
    parser.add_argument("--plot", type=Path, help="write PNGs of latency against load and the learning curves")
    parser.add_argument("--json", type=Path, help="write the figures as JSON")
    parser.set_defaults(func=_run_simulate)


def _run_simulate(args: argparse.Namespace) -> int:
    from backends.emulator.profiles import ProfileError, load_profile, shipped_profiles
    from backends.emulator.simulate import PolicySet
    from backends.workloads.loader import load_workload
    from gateway.errors import RulesError
    from gateway.rules import default_rules, load_rules, reference_rules

    console = _console()
    try:
        paths = None if not args.workload else [
            f for p in args.workload for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p])]  # fmt: skip
        workload = load_workload(paths)  # a WorkloadError is a ValueError: a clear message and exit 2
        if not workload.items:
            raise ValueError(f"no workload items in {', '.join(map(str, args.workload))}")
        names = shipped_profiles() if args.profile == "all" else [args.profile]
        profiles = [load_profile(name) for name in names]
        reference = load_rules(args.rules) if args.rules else reference_rules()
        adaptive = load_rules(args.adaptive_rules) if args.adaptive_rules else default_rules()
        shares = [float(v) for v in args.loads.split(",") if v.strip()]
        qps = [float(v) for v in args.qps.split(",") if v.strip()] if args.qps else None
        scenarios = [v.strip() for v in args.scenarios.split(",") if v.strip()]
    except (ProfileError, ValueError, OSError) as exc:
        console.print(f"specgate simulate: {exc}")
        return 2
    except RulesError as exc:
        console.print(f"specgate simulate: invalid rules {exc.source}: {'; '.join(exc.problems)}")
        return 2
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown or not (qps or shares) or min(qps or shares) <= 0:
        console.print(f"specgate simulate: positive load levels and scenarios from {', '.join(SCENARIOS)} needed")
        return 2
    if not adaptive.uses_fastest:
        console.print("specgate simulate: the adaptive rules route nothing to `fastest`; it runs as a fixed policy")
    policies = PolicySet(reference, adaptive)
    report = {}
    for profile in profiles:
        report[profile.name] = _simulate_profile(console, profile, workload, policies, shares, qps, scenarios, args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
        console.print(f"wrote {args.json} (EMULATED)")
    return 0


def _simulate_profile(
    console: Console, profile: Profile, workload: Workload, policies: PolicySet, shares: list[float],
    qps: list[float] | None, scenarios: list[str], args: argparse.Namespace,
) -> dict[str, object]:  # fmt: skip
    from backends.emulator.evaluate import check_targets, evaluate_levels, evaluate_scenario
    from backends.emulator.report import levels_table, plot_evaluation, scenarios_table, targets_table
    from backends.emulator.scenarios import capacity_qps

    capacity = capacity_qps(profile, workload)
    if qps:
        shares = [value / capacity for value in qps]
    options = {"replicas": args.replicas, "scrape_interval_s": args.scrape_interval, "gateways": args.gateways}
    levels = evaluate_levels(profile, workload, policies, shares, args.duration, args.seed, warmup_s=args.warmup,
                             **options)  # fmt: skip
    console.print(levels_table(profile.name, capacity, levels))
    runs = [
        evaluate_scenario(
            name, profile, workload, policies, args.scenario_load, args.scenario_duration, args.seed, **options
        )
        for name in scenarios
    ]
    if runs:
        console.print(scenarios_table(profile.name, runs))
    targets = check_targets(levels, runs)
    console.print(targets_table(profile.name, targets))
    if args.plot:
        path = args.plot if len(args.profile.split(",")) == 1 and args.profile != "all" else (
            args.plot.with_name(f"{args.plot.stem}-{profile.name}{args.plot.suffix}"))  # fmt: skip
        plot_evaluation(path, profile.name, levels, runs)
        console.print(f"wrote {path} (EMULATED)")
    return {
        "capacity_qps": capacity,
        "levels": [dataclasses.asdict(level) for level in levels],
        "scenarios": [dataclasses.asdict(run) for run in runs],
        "targets": [dataclasses.asdict(target) for target in targets],
    }


def register_demo(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo", help="two emulated pools + the gateway on loopback, driven at a low and a high load (emulated)"
    )
    parser.add_argument("--quick", action="store_true", help="a shortened run (about 20 s)")
    parser.add_argument("--plot", type=Path, help="write a PNG of the per-task latencies")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from backends.emulator.demo import FULL, QUICK, run_demo

    plan = dataclasses.replace(QUICK if args.quick else FULL, seed=args.seed)
    return run_demo(plan, _console(), args.plot).exit_code


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 170))


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value
