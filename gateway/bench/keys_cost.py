"""``python -m gateway.bench.keys_cost``: what API keys and per-key limits add to the routing step, in-process.

The whole-path comparison is ``specgate bench overhead --targets direct,specgate,specgate/keys``; on a busy
machine its figures are noisy, so this measures just the code keys add (authenticate, the max_tokens cap,
allowed pools, admission to three buckets and its finish, the per-key counters) against the routing step
without keys (with the anonymous counters), in process
CPU time (other processes' load does not count), best of 7 runs.
"""

from __future__ import annotations

import argparse
import time

import orjson
from prometheus_client import CollectorRegistry

from gateway.app import CHAT_PATH, create_app
from gateway.config import Settings
from gateway.proxy import ProxyRoute

BODY = orjson.dumps(
    {"model": "fake-model", "max_tokens": 64, "messages": [{"role": "user", "content": "Tell me about the sea."}]}
)
HEADERS = {"host": "x", "content-type": "application/json", "content-length": str(len(BODY))}
KEYS = "keys: [{name: bench, key: sk-bench, rpm: 1000000000, tpm: 1000000000, concurrency: 100000}]"


def per_request_us(keys: bool, requests: int, runs: int = 7) -> float:
    settings = Settings(
        _env_file=None, standard_urls=["http://127.0.0.1:1"], speculative_urls=["http://127.0.0.1:2"],
        keys=KEYS if keys else None,
    )  # fmt: skip
    app = create_app(settings, CollectorRegistry())
    route, access = app._routes[CHAT_PATH], app.state.access
    assert isinstance(route, ProxyRoute)
    best = float("inf")
    for _ in range(runs):
        started = time.process_time()
        for _ in range(requests):
            headers = {**HEADERS, "authorization": "Bearer sk-bench"}
            key = access.authenticate(headers)
            if key is None:
                features, _ = route.route(BODY, headers)
                access.finish(None, None, 200, features.prompt_tokens + 16)  # the anonymous counters
                continue
            _, features, _, admission = route.route_key(key, BODY, headers)
            access.finish(key, admission, 200, features.prompt_tokens + 16)  # admission back, per-key counters
        best = min(best, (time.process_time() - started) / requests)
    return best * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args(argv)
    off, on = per_request_us(False, args.requests), per_request_us(True, args.requests)
    print(f"routing step without keys: {off:.2f} us/request")
    print(f"with a key (auth, cap, pools, rpm+tpm+concurrency admit and finish): {on:.2f} us/request (+{on - off:.2f})")


if __name__ == "__main__":
    main()
