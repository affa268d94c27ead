"""``specgate rules suggest URL``: a static rules file from what a running gateway learned."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

from gateway.adaptive.suggest import render, suggest
from gateway.errors import RulesError
from gateway.rules import load_rules, parse_rules, reference_rules


def register(rules_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = rules_sub.add_parser(
        "suggest", help="write static rules (thresholds per task and load) from a gateway's learned model"
    )
    parser.add_argument("url", help="the gateway's base URL (reads GET URL/v1/route/model)")
    parser.add_argument("--rules", type=Path, help="file whose pools, tasks and pins to keep (default: reference)")
    parser.add_argument("--out", type=Path, help="write here instead of standard output")
    parser.add_argument("--admin-token", help="bearer token for the gateway's operator endpoints, if it has one")
    parser.set_defaults(func=run_suggest)


def run_suggest(args: argparse.Namespace) -> int:
    headers = {"authorization": f"Bearer {args.admin_token}"} if args.admin_token else {}
    try:
        base = load_rules(args.rules) if args.rules else reference_rules()
        response = httpx.get(f"{args.url.rstrip('/')}/v1/route/model", headers=headers, timeout=10)
        response.raise_for_status()
        view = response.json()
        data = suggest(view, base)
        parse_rules(data, "<suggested>")  # what we write must load
    except (httpx.HTTPError, ValueError) as exc:
        print(f"specgate rules suggest: {exc}", file=sys.stderr)
        return 1
    except RulesError as exc:
        print(f"specgate rules suggest: {exc.source}: {'; '.join(exc.problems)}", file=sys.stderr)
        return 1
    text = render(data, args.url, int(view.get("observations", 0)))
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
