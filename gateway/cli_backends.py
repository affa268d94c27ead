"""``specgate backends``: render, check and launch the vLLM pools described by backends/pools/*.yaml.

    specgate backends render POOL [--format argv|shell|compose|helm-values] [--vllm-version X] [--cpu]
    specgate backends check [--rules FILE] [--cpu | --pools-dir DIR]
    specgate backends launch POOL [--cpu] [--vllm-version X] [--port N]
    specgate backends launch --cpu [--replicas N]   # both CPU pools (N replicas each) on loopback until Ctrl-C

POOL is ``standard``, ``speculative`` or a manifest path.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from backends.consistency import Finding, FindingLevel, check_against_rules, check_pair
from backends.cpu_engine import (
    CpuEngine,
    CpuFleet,
    CpuPair,
    EngineNotReady,
    ServerFailed,
    cpu_fleet,
    cpu_pair,
    default_cache_dir,
)
from backends.manifest import (
    CPU_POOLS_DIR,
    POOLS_DIR,
    ManifestError,
    PoolManifest,
    load_manifest,
    resolve_manifest,
)
from backends.render import (
    DEFAULT_VLLM_VERSION,
    RenderError,
    render_argv,
    render_compose_service,
    render_helm_values,
    render_shell,
)
from backends.vocab import check_vocabulary
from gateway import cli_suggest_k
from gateway.errors import RulesError
from gateway.rules import load_rules

FORMATS = ("argv", "shell", "compose", "helm-values")
VOCAB_LEVELS: dict[str, FindingLevel] = {"mismatch": "error", "unavailable": "warning", "match": "info"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("backends", help="render, check and launch the vLLM pool manifests")
    actions = parser.add_subparsers(dest="backends_command", required=True)

    render = actions.add_parser("render", help="print a pool's vLLM launch in one of several formats")
    render.add_argument("pool", help="standard, speculative or a manifest path")
    render.add_argument("--format", choices=FORMATS, default="argv")
    render.add_argument("--vllm-version", default=DEFAULT_VLLM_VERSION)
    render.add_argument("--cpu", action="store_true", help="use the CPU manifest pair (backends/pools/cpu)")
    render.set_defaults(func=run_render)

    check = actions.add_parser("check", help="validate the manifests and compare them with the rules file")
    check.add_argument("--rules", type=Path, help="gateway rules file to compare pool names and models with")
    where = check.add_mutually_exclusive_group()
    where.add_argument("--cpu", action="store_true", help="check the CPU pair as the deployed pools")
    where.add_argument("--pools-dir", type=Path, help="directory holding standard.yaml and speculative.yaml")
    check.set_defaults(func=run_check)

    launch = actions.add_parser("launch", help="exec vLLM for a pool (with --cpu and no pool: both CPU pools)")
    launch.add_argument("pool", nargs="?", help="standard, speculative or a manifest path")
    launch.add_argument("--cpu", action="store_true", help="run on this machine's CPU engine (loopback only)")
    launch.add_argument("--vllm-version", default=DEFAULT_VLLM_VERSION)
    launch.add_argument("--port", type=int, help="override the manifest's port (single pool only)")
    launch.add_argument("--replicas", type=int, default=1, help="with --cpu alone: replicas per pool (replica i on "
                        "the manifest's port + 2i, a pool's replicas sharing its half of the CPUs)")
    launch.set_defaults(func=run_launch)

    cli_suggest_k.register(actions)


def _load(pool: str, cpu: bool) -> PoolManifest:
    return load_manifest(resolve_manifest(pool, cpu=cpu))


def _fail(message: str, code: int = 1) -> int:
    print(f"specgate backends: {message}", file=sys.stderr)
    return code


# --- render ---------------------------------------------------------------------------------------------


def format_manifest(manifest: PoolManifest, fmt: str, vllm_version: str) -> str:
    """The text ``specgate backends render`` prints for one manifest."""
    if fmt == "argv":
        return json.dumps(render_argv(manifest, vllm_version), indent=2) + "\n"
    if fmt == "shell":
        return render_shell(manifest, vllm_version)
    if fmt == "compose":
        services = {f"vllm-{manifest.pool}": render_compose_service(manifest, vllm_version)}
        return _yaml({"services": services})
    return _yaml(render_helm_values(manifest))


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=1000)


def run_render(args: argparse.Namespace) -> int:
    try:
        manifest = _load(args.pool, args.cpu)
        sys.stdout.write(format_manifest(manifest, args.format, args.vllm_version))
    except (ManifestError, RenderError) as exc:
        return _fail(str(exc))
    return 0


# --- check ----------------------------------------------------------------------------------------------


def collect_findings(pools_dir: Path, rules_path: Path | None) -> list[Finding]:
    """Validate every manifest under ``pools_dir`` and the shipped ones, then the pair and the rules."""
    findings: list[Finding] = []
    manifests: dict[Path, PoolManifest] = {}
    pools_dir = pools_dir.resolve()
    paths = sorted({p.resolve() for p in (*POOLS_DIR.rglob("*.yaml"), *pools_dir.rglob("*.yaml"))})
    for path in paths:
        try:
            manifests[path] = load_manifest(path)
        except ManifestError as exc:
            findings.append(Finding("error", str(exc)))
    for path, manifest in manifests.items():
        vocab = check_vocabulary(manifest, search_dirs=[default_cache_dir() / "models"])
        if vocab.status != "not_applicable":
            level: FindingLevel = VOCAB_LEVELS[vocab.status]
            findings.append(Finding(level, f"{path}: {vocab.message}"))
    pair = {name: manifests.get(pools_dir / f"{name}.yaml") for name in ("standard", "speculative")}
    present = {name: manifest for name, manifest in pair.items() if manifest is not None}
    for name in sorted(set(pair) - set(present)):
        findings.append(Finding("error", f"{pools_dir / (name + '.yaml')}: missing or invalid"))
    if len(present) == 2:
        findings += check_pair(present["standard"], present["speculative"])
    if rules_path is not None:
        findings += _rules_findings(present, rules_path)
    return findings


def _rules_findings(manifests: dict[str, PoolManifest], rules_path: Path) -> list[Finding]:
    try:
        rules = load_rules(rules_path)
    except RulesError as exc:
        return [Finding("error", str(exc))]
    return check_against_rules(manifests, rules)


def run_check(args: argparse.Namespace) -> int:
    pools_dir = CPU_POOLS_DIR if args.cpu else (args.pools_dir or POOLS_DIR)
    findings = collect_findings(pools_dir, args.rules)
    for finding in findings:
        print(f"{finding.level}: {finding.message}")
    errors = sum(finding.level == "error" for finding in findings)
    scope = f"{pools_dir}" + (f" against {args.rules}" if args.rules else "")
    warnings = sum(finding.level == "warning" for finding in findings)
    print(f"checked {scope}: {errors} error(s), {warnings} warning(s)")
    return 1 if errors else 0


# --- launch ---------------------------------------------------------------------------------------------


def run_launch(args: argparse.Namespace) -> int:
    if args.pool is None:
        if not args.cpu:
            return _fail("name a pool, or use --cpu alone to bring up both CPU pools", code=2)
        if args.replicas < 1:
            return _fail("--replicas must be at least 1", code=2)
        return launch_cpu_pair(CpuEngine(default_cache_dir()), args.replicas)
    if args.replicas != 1:
        return _fail("--replicas goes with --cpu alone (both CPU pools)", code=2)
    try:
        manifest = _load(args.pool, args.cpu)
        if args.port is not None:
            manifest = manifest.model_copy(update={"port": args.port})
        if args.cpu:
            engine = CpuEngine(default_cache_dir())
            engine.require(manifest)
            argv = engine.server_argv(manifest, vllm_version=args.vllm_version)
            env = engine.server_env(manifest)
        else:
            argv = render_argv(manifest, args.vllm_version)
            env = {**os.environ, **manifest.env}
    except (ManifestError, RenderError, EngineNotReady) as exc:
        return _fail(str(exc))
    print("exec: " + " ".join(argv), file=sys.stderr, flush=True)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        return _fail(f"cannot exec {argv[0]}: {exc}")


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def launch_cpu_pair(engine: CpuEngine, replicas: int = 1) -> int:
    """Start both CPU pools (``replicas`` servers each) on loopback, wait for /health, then hold until Ctrl-C and
    stop them."""
    try:
        manifests = (_load("standard", cpu=True), _load("speculative", cpu=True))
    except ManifestError as exc:
        return _fail(str(exc))
    log_dir = Path(tempfile.mkdtemp(prefix="specgate-cpu-pools-"))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
    signal.signal(signal.SIGTERM, _interrupt)
    pair: CpuPair | CpuFleet = (
        cpu_pair(engine, manifests, (manifests[0].port, manifests[1].port), log_dir) if replicas == 1
        else cpu_fleet(engine, manifests, replicas, log_dir)
    )  # fmt: skip
    try:
        pair.start()
        for server in pair.servers:
            print(
                f"{server.manifest.pool}: {server.url} (model {server.manifest.served_model_name}, "
                f"log {server.log_path})",
                flush=True,
            )
        print(f"both pools ({replicas} replica(s) each) healthy after {pair.startup_s:.1f} s; Ctrl-C stops them",
              flush=True)  # fmt: skip
        while pair.all_running():
            time.sleep(1.0)
        return _fail(f"a pool server exited; logs in {log_dir}")
    except (EngineNotReady, ServerFailed) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        print("stopping", flush=True)
        return 0
    finally:
        pair.stop()
