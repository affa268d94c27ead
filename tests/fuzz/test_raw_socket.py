"""The raw-socket fuzzer against the running gateway (uvicorn, fake upstreams): ~5,100 seeded cases (with the
property and mutation tests of tests/fuzz/test_parse_props.py and test_gateway_props.py, > 10,000 a run).

Per batch (one category of bad input): no 5xx, no hang (every case has a deadline), every 4xx in OpenAI's
error shape, every well-framed request answered; after it a valid request succeeds and bookings are back to
zero. ``FUZZ_SCALE`` (an environment variable, default 1) multiplies the case counts; ``FUZZ_SEED`` the seed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from tests.conftest import Gateway
from tests.fuzz.cases import RAN, Case, plan, valid_request
from tests.fuzz.runner import BatchReport, run_batch, send_case

SEED = int(os.environ.get("FUZZ_SEED", "20261201"))
SCALE = float(os.environ.get("FUZZ_SCALE", "1"))
BODY_LIMIT = 256 * 1024
READ_TIMEOUT_S = 1.0  # so stalled cases end quickly
DEADLINE_S = 15.0  # per case: far above the read timeout, so only a real hang reaches it


def _gateway_5xx(gw: Gateway) -> float:
    return sum(
        s.value
        for metric in gw.registry.collect()
        if metric.name == "specgate_requests"
        for s in metric.samples
        if s.name.endswith("_total") and s.labels["status"].startswith("5")
    )


async def _bookings_back_to_zero(gw: Gateway) -> None:
    pools = gw.app.state.pools
    deadline = time.monotonic() + 5
    while pools.total_booked() or any(r.inflight for r in pools.replicas()):
        assert time.monotonic() < deadline, f"bookings stuck at {pools.total_booked()}"
        await asyncio.sleep(0.02)


async def test_raw_socket_fuzz(gateway: Callable[..., Gateway]) -> None:
    # the shipped rules (rules_file None): the adaptive policy and its headers, as users run it
    gw = gateway(rules_file=None, max_body_bytes=BODY_LIMIT, client_read_timeout_s=READ_TIMEOUT_S)
    url = urlsplit(gw.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    logging.getLogger("uvicorn.error").setLevel(logging.ERROR)  # one warning per refused request otherwise
    reports: list[BatchReport] = []
    started = time.monotonic()
    for batch in plan(random.Random(SEED), SCALE, BODY_LIMIT):
        reports.append(await run_batch(host, port, batch, DEADLINE_S))
        after = await send_case(host, port, Case("valid", valid_request(), json_level=True), DEADLINE_S)
        assert after.status == 200, f"a valid request after the {batch.category!r} batch got {after.status}"
        await _bookings_back_to_zero(gw)
    elapsed = time.monotonic() - started
    total = sum(r.cases for r in reports)
    RAN[__name__] += total
    print(f"\nraw-socket fuzz: {total} cases in {elapsed:.1f} s (seed {SEED})")
    for r in reports:
        print(f"  {r.category:<24} {r.cases:>5}  {dict(sorted(r.statuses.items()))}  problems: {len(r.problems)}")
    problems = [(r.category, p) for r in reports for p in r.problems]
    assert not problems, "\n".join(f"{c}: {why}\n    sent {data!r}" for c, (why, data) in problems[:15])
    assert _gateway_5xx(gw) == 0
    assert total >= 5_000 * SCALE
