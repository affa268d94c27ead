"""``specgate backends suggest-k URL``: the speculative pool's k table from what a running gateway learned."""

from __future__ import annotations

import argparse
import sys

import httpx
from rich.console import Console
from rich.table import Table

from gateway.adaptive.suggest_k import suggest_k, table_text, zero_k_overhead


def register(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = actions.add_parser(
        "suggest-k",
        help="suggest the speculative pool's num_speculative_tokens_per_batch_size (vLLM >= 0.32) from a gateway's "
             "learned model: per batch size the k with the most tokens a second by both pools' learned times",
    )  # fmt: skip
    parser.add_argument("url", help="the gateway's base URL (reads GET URL/v1/route/model)")
    parser.add_argument("--k", type=int, required=True, help="the speculative pool's num_speculative_tokens")
    parser.add_argument("--standard-replicas", type=int, default=1, help="engines in the standard pool")
    parser.add_argument("--speculative-replicas", type=int, default=1, help="engines in the speculative pool")
    parser.add_argument("--min-samples", type=float, default=3.0,
                        help="judge a batch size only where both pools' curves have this many samples")  # fmt: skip
    parser.add_argument("--admin-token", help="bearer token for the gateway's operator endpoints, if it has one")
    parser.set_defaults(func=run_suggest_k)


def run_suggest_k(args: argparse.Namespace) -> int:
    headers = {"authorization": f"Bearer {args.admin_token}"} if args.admin_token else {}
    try:
        response = httpx.get(f"{args.url.rstrip('/')}/v1/route/model", headers=headers, timeout=10)
        response.raise_for_status()
        found = suggest_k(response.json(), args.k, args.standard_replicas, args.speculative_replicas,
                          args.min_samples)  # fmt: skip
    except (httpx.HTTPError, ValueError) as exc:
        print(f"specgate backends suggest-k: {exc}", file=sys.stderr)
        return 1
    console = Console()
    table = Table(title="learned time per output token by batch size (ms), and the k chosen")
    for column in ("batch", f"speculative (k = {args.k})", "standard", "at k = 0 (+overhead)", "k"):
        table.add_column(column, justify="right")
    for row in found.rows:
        table.add_row(str(row.batch), f"{row.speculative_ms:.2f}", f"{row.standard_ms:.2f}",
                      f"{row.zero_k_ms:.2f} (+{zero_k_overhead(row.batch):.1%})", str(row.k))  # fmt: skip
    console.print(table)
    if found.acceptance_length is None:
        console.print("the speculative pool reports no acceptance: only k against k = 0 was judged")
    else:
        console.print(f"the speculative pool's mean acceptance length: {found.acceptance_length:.2f} tokens a step")
    if not found.table:
        print("not enough samples at any batch size on both pools yet: nothing to suggest", file=sys.stderr)
        return 1
    if found.stop_at is None:
        console.print(f"drafting pays at every batch size judged ({found.judged_from}-{found.judged_to}): no k = 0 "
                      "range to suggest")  # fmt: skip
    else:
        console.print(f"drafting stops paying at batch size {found.stop_at} (judged from {found.judged_from})")
    entries = ", ".join(f"[{a}, {b}, {k}]" for a, b, k in found.table)
    console.print("for the speculative pool's manifest (speculative block):")
    print(f"num_speculative_tokens_per_batch_size: [{entries}]")
    print(f"# specgate simulate --speculative-k {table_text(found.table)}")
    return 0
