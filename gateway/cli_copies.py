"""``specgate sync-copies [--check]``: regenerate the shipped copies of the rules and the dashboard."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway import copies

CHECKOUT = Path(__file__).resolve().parents[1]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "sync-copies",
        help="regenerate deploy/compose/rules.yaml, the Helm values' rules and the chart's dashboard",
        description=copies.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each stale copy")
    parser.add_argument("--root", type=Path, default=CHECKOUT, help="the checkout (default: this one)")
    parser.set_defaults(func=run_sync)


def run_sync(args: argparse.Namespace) -> int:
    root: Path = args.root
    try:
        planned = copies.plan(root)
    except copies.CopyError as exc:
        print(f"specgate sync-copies: {exc}", file=sys.stderr)
        return 2
    stale = copies.stale(root, planned)
    if args.check:
        for copy in stale:
            print(f"{copy.path}: out of date; run `specgate sync-copies`", file=sys.stderr)
        if not stale:
            print(f"{len(planned)} copies up to date")
        return 1 if stale else 0
    for copy in stale:
        copies.write(root, copy)
        print(f"{copy.path}: regenerated")
    print(f"{len(planned)} copies up to date")
    return 0
