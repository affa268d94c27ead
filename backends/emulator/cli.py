"""``specgate emulate``, ``specgate simulate`` (its own module) and ``specgate demo``: registered in gateway/cli.py."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from backends.emulator.cli_simulate import output_console, positive_float
from backends.emulator.cli_simulate import register_simulate as register_simulate
from backends.emulator.profiles import shipped_profiles

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
    parser.add_argument("--speed", type=positive_float, default=1.0, help="run this many times faster than the profile")
    parser.add_argument("--seed", type=int, default=0, help="seed of the acceptance draws")
    parser.add_argument(
        "--workload",
        type=Path,
        action="append",
        help="workload YAML with ground truth (repeatable; default: the shipped workloads)",
    )
    parser.add_argument("--served-model-name", help="model name to serve (default: the profile's)")
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="vLLM's automatic prefix caching: a prompt's cached 16-token blocks are not prefilled again "
        "(vLLM's default is on; the emulator's is off, so that earlier emulated figures stay as they were)",
    )
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
        prefix_caching=args.enable_prefix_caching,
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
    return run_demo(plan, output_console(), args.plot).exit_code
