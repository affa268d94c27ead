"""``specgate simulate``: every policy against emulated pools in virtual time, over seeds, and the targets.

Registered in gateway/cli.py (through ``backends.emulator.cli.register_simulate``). Tables go to stdout; a
progress bar per profile goes to stderr when stderr is a terminal (never into output a script reads).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from backends.emulator.scenarios import LOAD_SHARES, SCENARIOS
from backends.emulator.simulate import ACCEPTANCE, BOTH, LENGTH, PERFECT_KNOWS
from backends.emulator.telemetry import FULL, TELEMETRY

KNOWN = {ACCEPTANCE: "acceptance", LENGTH: "output length"}

if TYPE_CHECKING:
    from backends.emulator.profiles import Profile
    from backends.emulator.sweep import Job, Plan, Result
    from backends.emulator.targets import Target
    from backends.workloads.loader import Workload
    from gateway.rules import RoutingRules

DEFAULT_SEEDS = 5


def register_simulate(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate", help="evaluate routing policies in virtual time against emulated pools (figures are emulated)"
    )
    parser.add_argument("--profile", default="a100-70b-draft", help="shipped profile, YAML path, or 'all'")
    parser.add_argument(
        "--loads", default=",".join(f"{s:g}" for s in LOAD_SHARES),
        help="comma-separated load levels as shares of one pool's capacity (default 0.1 .. 2; targets to 1.5)",
    )  # fmt: skip
    parser.add_argument("--qps", help="comma-separated load levels in requests/s (instead of --loads)")
    parser.add_argument("--duration", type=positive_float, default=90.0, help="virtual seconds of arrivals per level")
    parser.add_argument("--warmup", type=float, default=10.0, help="virtual seconds left out of the level tables")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument(
        "--seeds", type=_count, default=DEFAULT_SEEDS,
        help=f"seeds to run from --seed on (default {DEFAULT_SEEDS}): targets are judged on their mean, with the "
             "worst seed shown",
    )  # fmt: skip
    parser.add_argument("--scenarios", default="ramp,mix-shift,drift", help="scenarios to run ('' for none)")
    parser.add_argument("--scenario-load", type=float, default=0.7, help="(peak) load share of the scenarios")
    parser.add_argument("--scenario-duration", type=float, default=240.0, help="virtual seconds per scenario")
    parser.add_argument(
        "--workload", type=Path, action="append",
        help="workload YAML with ground truth, or a directory of them (repeatable; default: the shipped "
             "backends/workloads/data): simulate your own traffic",
    )  # fmt: skip
    parser.add_argument(
        "--sessions", type=Path, action="append",
        help="a session workload (YAML file or directory of them; 'shipped': backends/workloads/sessions): "
             "multi-turn sessions instead of single requests; runs the session policies (specgate, and the "
             "single-pool baselines at equal hardware) and prints TTFT of later turns and end to end",
    )  # fmt: skip
    parser.add_argument(
        "--think-time", type=non_negative_float, default=5.0,
        help="sessions: mean seconds between an answer and the next turn (exponential; default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--prefix-caching", choices=("on", "off"), default="on",
        help="sessions: the engines' prefix caches (default on; single-turn workloads never cache, so their "
             "figures stay as they were)",
    )  # fmt: skip
    parser.add_argument("--replicas", type=_count, default=1, help="engines per pool")
    parser.add_argument(
        "--speculative-k", default="fixed", metavar="fixed|dynamic|profiled|learned|TABLE",
        help="specgate's speculative pool: fixed (the profile's k at every batch size, as profiled), dynamic "
             "(vLLM's num_speculative_tokens_per_batch_size: the profile's k up to 8 running requests, 2 to 32, "
             "0 beyond; the profile is named NAME+dynamic-k), profiled (at each batch size the k that decodes the "
             "most tokens per second at the workload's mean acceptance, as an operator would profile it offline), "
             "learned (what `specgate backends suggest-k` reads from the adaptive gateway's model after a ramp "
             "from the lowest level to the busiest and back at fixed k, on a seed of its own: per batch size the k "
             "with the most tokens a second by both pools' learned times per token) or your own table as "
             "FROM-TO:K entries, e.g. 1-32:5,33-64:2,65:0 (the last k holds for larger batches); the one-pool "
             "baseline runs the same table (the dynamic one with fixed)",
    )  # fmt: skip
    parser.add_argument(
        "--gateways", type=_count, default=1,
        help="gateway replicas in front of the pools (arrivals dealt round-robin; each sees the others' requests "
             "only through the engines' stats, a scrape late; perfect-predictor sees the engines as they are)",
    )  # fmt: skip
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between engine-stat scrapes")
    parser.add_argument(
        "--perfect-knows", choices=PERFECT_KNOWS, default=BOTH,
        help="what the perfect-predictor bound is fed: both (each request's true acceptance and output length, "
             "the default), acceptance or length (that truth alone, the other estimated as the adaptive gateway "
             "estimates it): splits the learned policy's distance from the bound into what each prediction's "
             "error costs",
    )  # fmt: skip
    parser.add_argument(
        "--telemetry", choices=list(TELEMETRY), default=FULL.name,
        help="what the gateway learns from: full (usage on every stream, the speculative engine with "
             "per-request spec-decode metrics: the default, what the gateway sees asking every stream for usage), "
             "no-spec-metrics (no request's acceptance), no-usage (no stream carries usage: the gateway counts "
             "its events; acceptance unknown), mixed (half the streams carry usage), bare (neither)",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", type=_count, default=min(os.cpu_count() or 1, 8),
        help="worker processes (default: the CPU count, at most 8); the figures do not depend on it",
    )  # fmt: skip
    parser.add_argument("--rules", type=Path, help="the reference policy (default gateway/rules-reference.yaml)")
    parser.add_argument("--adaptive-rules", type=Path, help="the adaptive policy (default: the shipped rules)")
    parser.add_argument("--plot", type=Path, help="write PNGs of latency against load and the learning curves")
    parser.add_argument("--json", type=Path, help="write the figures as JSON")
    parser.set_defaults(func=_run_simulate)


def _run_simulate(args: argparse.Namespace) -> int:
    console = output_console()
    plans = _plans(args, console)
    if plans is None:
        return 2
    from backends.emulator.sweep import run_jobs

    jobs = [job for plan in plans for job in plan.jobs()]
    with progress_bars(plans, Console(stderr=True)) as done:
        results = run_jobs(jobs, args.jobs, done)
    report: dict[str, object] = {}
    targets: dict[str, list[Target]] = {}
    for plan in plans:
        mine = [result for job, result in zip(jobs, results, strict=True) if job.plan is plan]
        if plan.sessions is not None:
            report[plan.profile.name] = _show_sessions(console, plan, mine)
            continue
        report[plan.profile.name], targets[plan.profile.name] = _show(console, plan, mine, args)
    if len(targets) > 1:
        from backends.emulator.report import summary_table

        console.print(summary_table(targets))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
        console.print(f"wrote {args.json} (EMULATED)")
    return 0


def _learned(
    args: argparse.Namespace, profile: Profile, workload: Workload, adaptive: RoutingRules, levels: Sequence[float],
    console: Console,
) -> Profile:  # fmt: skip
    """``--speculative-k learned``: the profile with the table its gateway suggests after a ramp over ``levels``."""
    from backends.emulator.learned_k import learned_table
    from backends.emulator.profiles import dynamic_profile
    from gateway.adaptive.suggest_k import table_text

    low, top = min(levels), max(levels)
    found = learned_table(profile, workload, adaptive, low, top, args.duration, args.seed, args.replicas)
    if not found.table:
        console.print(f"{profile.name}: the learning run saw too little of both pools to suggest a table: fixed k")
        return profile
    where = f"stops at batch {found.stop_at}" if found.stop_at else "pays at every batch size seen"
    console.print(f"{profile.name}: learned over a ramp {low:.0%}-{top:.0%} (EMULATED): drafting {where} (judged "
                  f"{found.judged_from}-{found.judged_to}); table {table_text(found.table)}")  # fmt: skip
    return dynamic_profile(profile, found.table)


def _plans(args: argparse.Namespace, console: Console) -> list[Plan] | None:
    """One plan per profile from the arguments, or None (after saying why) when they are not usable."""
    from backends.emulator.evaluate import Options
    from backends.emulator.policies import PolicySet
    from backends.emulator.profiles import ProfileError, dynamic_profile, load_profile, shipped_profiles
    from backends.emulator.scenarios import capacity_qps
    from backends.emulator.sweep import Plan
    from backends.emulator.timing import profiled_table
    from backends.spec_schedule import parse_schedule
    from backends.workloads.loader import load_workload
    from backends.workloads.sessions import SESSIONS_DIR, SessionSet, load_sessions
    from gateway.errors import RulesError
    from gateway.rules import default_rules, load_rules, reference_rules

    try:
        paths = None if not args.workload else [
            f for p in args.workload for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p])]  # fmt: skip
        sessions: SessionSet | None = None
        if args.sessions:
            if args.workload:
                raise ValueError("give either --workload or --sessions")
            sessions = load_sessions([SESSIONS_DIR if str(p) == "shipped" else p for p in args.sessions])
        workload = sessions.workload if sessions else load_workload(paths)  # WorkloadError: a ValueError
        if not workload.items:
            raise ValueError(f"no workload items in {', '.join(map(str, args.workload))}")
        names = shipped_profiles() if args.profile == "all" else [args.profile]
        profiles = [load_profile(name) for name in names]
        if args.speculative_k == "profiled":  # each profile's table at the mean acceptance its drafter reads
            profiles = [dynamic_profile(p, profiled_table(p, workload.with_model(p.acceptance_model).mean_acceptance))
                        for p in profiles]  # fmt: skip
        elif args.speculative_k not in ("fixed", "learned"):
            table = None if args.speculative_k == "dynamic" else parse_schedule(args.speculative_k)
            profiles = [dynamic_profile(profile, table) for profile in profiles]
        reference = load_rules(args.rules) if args.rules else reference_rules()
        adaptive = load_rules(args.adaptive_rules) if args.adaptive_rules else default_rules()
        shares = [float(v) for v in args.loads.split(",") if v.strip()]
        qps = [float(v) for v in args.qps.split(",") if v.strip()] if args.qps else None
        scenarios = () if sessions else tuple(v.strip() for v in args.scenarios.split(",") if v.strip())
        if args.speculative_k == "learned" and sessions is not None:
            raise ValueError("--speculative-k learned learns on single-turn traffic: run it with --workload and "
                             "pass the table it prints to the sessions run")  # fmt: skip
    except (ProfileError, ValueError, OSError) as exc:
        console.print(f"specgate simulate: {exc}")
        return None
    except RulesError as exc:
        console.print(f"specgate simulate: invalid rules {exc.source}: {'; '.join(exc.problems)}")
        return None
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown or not (qps or shares) or min(qps or shares) <= 0:
        console.print(f"specgate simulate: positive load levels and scenarios from {', '.join(SCENARIOS)} needed")
        return None
    if not adaptive.uses_fastest:
        console.print("specgate simulate: the adaptive rules route nothing to `fastest`; it runs as a fixed policy")
    options = Options(args.duration, args.warmup, args.replicas, args.scrape_interval, args.gateways,
                      TELEMETRY[args.telemetry], args.perfect_knows)  # fmt: skip
    seeds = tuple(range(args.seed, args.seed + args.seeds))
    policies = PolicySet(reference, adaptive)

    def levels(profile: Profile) -> tuple[float, ...]:
        return tuple(v / capacity_qps(profile, workload) for v in qps) if qps else tuple(shares)

    if args.speculative_k == "learned":  # levels checked above: the learning ramp spans them
        profiles = [_learned(args, p, workload, adaptive, levels(p), console) for p in profiles]
    scenario = {"scenario_share": args.scenario_load, "scenario_duration_s": args.scenario_duration}
    if sessions is not None:
        caching = args.prefix_caching == "on"
        return [Plan(p, workload, policies, levels(p), seeds, options=options, think_s=args.think_time,
                     sessions=sessions.with_model(p.acceptance_model), prefix_caching=caching)
                for p in profiles]  # fmt: skip
    # each profile's drafter reads the synthetic items (recorded ones keep what the engine measured), as its
    # emulator does (backends/emulator/core.py): a profile whose acceptance_model differs is simulated on its own truth
    return [Plan(p, workload.with_model(p.acceptance_model), policies, levels(p), seeds, scenarios, **scenario,
                 options=options) for p in profiles]  # fmt: skip


@contextmanager
def progress_bars(plans: Sequence[Plan], console: Console) -> Iterator[Callable[[Job], None]]:
    """A rich progress bar per profile (on stderr in the command), advanced as each level or scenario of a
    seed finishes (what finished last is its description); silent where the console is not a terminal."""
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, disable=not console.is_terminal,
    )  # fmt: skip
    tasks = {plan.profile.name: progress.add_task(plan.profile.name, total=len(list(plan.jobs()))) for plan in plans}
    with progress:
        yield lambda job: progress.update(tasks[job.plan.profile.name], advance=1, description=job.label)


def _show(
    console: Console, plan: Plan, results: Sequence[Result], args: argparse.Namespace
) -> tuple[dict[str, object], list[Target]]:
    """One profile's tables (and plot); its figures for the JSON report, and its targets."""
    from backends.emulator.report import levels_table, plot_evaluation, ratios_table, scenarios_table, targets_table
    from backends.emulator.scenarios import capacity_qps
    from backends.emulator.sweep import by_seed
    from backends.emulator.targets import check_targets

    name, capacity = plan.profile.name, capacity_qps(plan.profile, plan.workload)
    levels, runs = by_seed(plan, results)
    console.print(levels_table(name, capacity, levels))
    console.print(ratios_table(name, levels))
    if plan.options.perfect_knows != BOTH:
        console.print(
            f"perfect-predictor here knows each request's {KNOWN[plan.options.perfect_knows]} only (--perfect-knows "
            f"{plan.options.perfect_knows}), the rest estimated as the adaptive gateway estimates it: its gap to "
            "warm is what that truth alone is worth; the targets below are judged against it"
        )  # fmt: skip
    if plan.scenarios:
        console.print(scenarios_table(name, runs))
    targets = check_targets(levels, runs if plan.scenarios else ())
    console.print(targets_table(name, targets))
    if args.plot:
        single = args.profile != "all"
        path = args.plot if single else args.plot.with_name(f"{args.plot.stem}-{name}{args.plot.suffix}")
        plot_evaluation(path, name, levels, runs)
        console.print(f"wrote {path} (EMULATED)")
    figures: dict[str, object] = {
        "capacity_qps": capacity,
        "seeds": list(plan.seeds),
        "telemetry": plan.options.telemetry.name,
        "perfect_knows": plan.options.perfect_knows,
        "levels": [[dataclasses.asdict(level) for level in seed] for seed in levels],
        "scenarios": [[dataclasses.asdict(run) for run in seed] for seed in runs],
        "targets": [dataclasses.asdict(target) for target in targets],
    }
    return figures, targets


def _show_sessions(console: Console, plan: Plan, results: Sequence[Result]) -> dict[str, object]:
    """A session plan's table; its figures for the JSON report."""
    from backends.emulator.report import sessions_table
    from backends.emulator.scenarios import capacity_qps
    from backends.emulator.sweep import session_levels

    levels = session_levels(plan, results)
    caching = "" if plan.prefix_caching else ", prefix caching off"
    title = f", think {plan.think_s:g} s{caching}"
    console.print(sessions_table(plan.profile.name, capacity_qps(plan.profile, plan.workload), levels, title))
    return {
        "capacity_qps": capacity_qps(plan.profile, plan.workload),
        "seeds": list(plan.seeds),
        "think_s": plan.think_s,
        "prefix_caching": plan.prefix_caching,
        "sessions": [[dataclasses.asdict(level) for level in seed] for seed in levels],
    }


def output_console() -> Console:
    """stdout; wide when it is not a terminal (a file or a pipe), so tables are not wrapped there."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 170))


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value
