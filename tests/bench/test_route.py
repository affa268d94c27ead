"""``specgate bench route``'s pass order (the run itself, on real pools: tests/backends/test_bench_route.py)."""

from __future__ import annotations

import json

import httpx

from gateway.bench import route
from gateway.bench.route import PHASES, phase_orders


def test_passes_alternate_the_phase_order_so_drift_weighs_on_every_policy_alike() -> None:
    assert phase_orders(1) == [PHASES]
    assert phase_orders(2) == [PHASES, PHASES[::-1]]
    assert phase_orders(3) == [PHASES, PHASES[::-1], PHASES]
    assert phase_orders(0) == [PHASES]  # at least one pass
    # over two passes every phase's mean position is the same: a linear drift shifts them all alike
    positions = {p: sum(order.index(p) for order in phase_orders(2)) for p in PHASES}
    assert len(set(positions.values())) == 1


async def test_each_pool_gets_one_unmeasured_request_before_the_phases() -> None:
    seen: list[tuple[str, dict[str, object]]] = []

    def engine(request: httpx.Request) -> httpx.Response:
        seen.append((str(request.url), json.loads(request.content)))
        return httpx.Response(200, json={"choices": []})

    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        await route.warm_up(client, ("http://std:1", "http://spec:2"), "m")
    assert [url for url, _ in seen] == ["http://std:1/v1/chat/completions", "http://spec:2/v1/chat/completions"]
    assert all(body["model"] == "m" and body["max_tokens"] == 4 for _, body in seen)
