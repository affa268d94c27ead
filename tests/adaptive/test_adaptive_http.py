"""The adaptive policy through HTTP against two emulated pools (EMULATED, cpu-smollm2 profile, sped up).

On the CPU profile speculation wins for a lone request (clearly for code and translation, about a tie for
chat) and loses as soon as a few requests share a step (verification of B x (k+1) tokens is compute-bound
there). So the learned policy must send most traffic to the speculative pool at concurrency 1, spread it
over both pools at concurrency 10, and come back when the load falls again.
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from backends.emulator.core import EmulatorConfig
from backends.emulator.profiles import load_profile
from backends.emulator.server import EmulatorApp
from backends.workloads.loader import WorkloadItem, load_workload
from gateway.app import create_app
from gateway.config import Settings
from gateway.rules import default_rules_path
from gateway.servers import ThreadServer
from tests.conftest import wait_for

pytestmark = pytest.mark.slow
WORKLOAD = load_workload()
ITEMS = [item for item in WORKLOAD.items if item.task in ("code", "translation", "chat")]
random.Random(0).shuffle(ITEMS)  # the tasks interleaved: the warm-up rules then use both pools


@contextlib.contextmanager
def emulated(profile: str, speed: float) -> Iterator[tuple[EmulatorApp, str, str]]:
    """Two emulated pools: the speculative emulator app (to drift it) and both pools' URLs."""
    loaded = load_profile(profile)
    apps = [EmulatorApp(EmulatorConfig(loaded, s, speed, served_model_name="smollm2"), WORKLOAD) for s in (False, True)]
    with ThreadServer(apps[0]) as standard, ThreadServer(apps[1]) as speculative:
        yield apps[1], standard.url, speculative.url


@pytest.fixture
def pools() -> Iterator[tuple[str, str]]:
    """cpu-smollm2: its knee is at a few concurrent requests, which a test on loopback can reach."""
    with emulated("cpu-smollm2", 4.0) as (_, standard, speculative):
        yield standard, speculative


def adaptive_rules(tmp_path: Path, **adaptive: object) -> Path:
    data = yaml.safe_load(default_rules_path().read_text())
    data["adaptive"].update({"min_samples": 8, **adaptive})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def send(url: str, count: int, concurrency: int, start: int) -> list[tuple[str, str, str]]:
    """``count`` chat requests, ``concurrency`` at a time (closed loop); (pool, reason, item's task) of each."""
    items = list(itertools.islice(itertools.cycle(ITEMS), start, start + count))

    def one(client: httpx.Client, i: int) -> tuple[str, str, str]:
        body = {**items[i].request_body("smollm2", stream=i % 2 == 0), "max_tokens": 64}
        response = client.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.text  # a stream is read to its end
        return response.headers["x-specgate-pool"], response.headers["x-specgate-reason"], items[i].task

    with httpx.Client() as client, ThreadPoolExecutor(concurrency) as workers:
        return list(workers.map(lambda i: one(client, i), range(count)))


def spec_share(outcomes: Sequence[tuple[str, ...]]) -> float:
    return sum(outcome[0] == "speculative" for outcome in outcomes) / len(outcomes)


def split(light: list[tuple[str, str, str]], heavy: list[tuple[str, str, str]]) -> bool:
    """Under load both pools take traffic, and less of it goes to speculation than alone (all requests, and
    code and translation), by at least 20 points."""
    alone = spec_share(copying(light))
    return 0.05 <= spec_share(heavy) <= alone - 0.2 and spec_share(copying(heavy)) <= alone - 0.2


def copying(outcomes: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The code and translation requests: those a lone request clearly finishes sooner on the speculative pool
    on this profile (chat is about a tie there, and which pool it goes to is rightly a coin toss)."""
    return [outcome for outcome in outcomes if outcome[2] != "chat"]


def test_the_adaptive_policy_splits_under_load_and_comes_back(pools: tuple[str, str], tmp_path: Path) -> None:
    standard, speculative = pools
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        standard_urls=[standard], speculative_urls=[speculative], rules_file=adaptive_rules(tmp_path),
        reload_rules=False, health_interval_s=0.2, snapshot_interval_s=0.05, engine_metrics_interval_s=0.25,
    )  # fmt: skip
    registry = CollectorRegistry()
    app = create_app(settings, registry)
    with ThreadServer(app) as gateway:
        wait_for(lambda: app.state.health_rounds > 0, what="first health check")
        warmup = send(gateway.url, 40, 2, 0)
        assert any(reason.endswith("(warm-up)") for _, reason, _ in warmup)
        send(gateway.url, 40, 1, 0)  # unmeasured: the model learns the light load before it is judged there
        # Each phase is one window of wall-clock timings against emulated pools; a busy machine can slow one
        # and blur its shares (clean-clone runs read light 68 % against 87-100 % alone, heavy 49 % against a
        # light 68 %, light again 74 % against a heavy 57 % + 20 points). A window that is not where the phase
        # should be is measured again, once, and judged on the new requests; the test fails if those are not
        # there either.
        light = send(gateway.url, 40, 1, 40)
        if spec_share(copying(light)) < 0.8:  # alone, code and translation go to speculation
            light = send(gateway.url, 60, 1, 400)
        heavy = send(gateway.url, 160, 10, 80)[40:]  # judged after 40 that let the model see the load
        if not split(light, heavy):
            heavy = send(gateway.url, 160, 10, 460)[40:]
        again = send(gateway.url, 100, 1, 240)[40:]  # judged on its last 60: the model sees the load fall first
        if spec_share(copying(again)) < spec_share(copying(heavy)) + 0.2:
            again = send(gateway.url, 60, 1, 340)
        model = httpx.get(f"{gateway.url}/v1/route/model").json()
        metrics = httpx.get(f"{gateway.url}/metrics").text
    assert model["warm"] and model["pools"]["speculative"]["samples"] > 8
    assert all(reason.startswith("fastest") for _, reason, _ in light + heavy + again)
    print(f"\nspeculative share (code and translation; all): light {spec_share(copying(light)):.0%}; "
          f"{spec_share(light):.0%}, heavy {spec_share(copying(heavy)):.0%}; {spec_share(heavy):.0%}, "
          f"light again {spec_share(copying(again)):.0%}; {spec_share(again):.0%}")  # fmt: skip
    # Alone, speculation wins for code and translation (n-gram drafts copy well) and ties for chat.
    # The gaps are a few tens of percent on this profile, and a loaded CI machine blurs them: the direction of
    # the movement is asserted, with margin, not exact shares (the simulator measures the quality).
    assert split(light, heavy)  # under load: a split, less speculation
    assert spec_share(copying(again)) >= spec_share(copying(heavy)) + 0.2  # and back
    assert "specgate_prediction_ratio_bucket" in metrics and "specgate_model_warm 1.0" in metrics


def test_explain_and_the_response_show_the_prediction(pools: tuple[str, str], tmp_path: Path) -> None:
    standard, speculative = pools
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        standard_urls=[standard], speculative_urls=[speculative], rules_file=adaptive_rules(tmp_path),
        reload_rules=False, health_interval_s=0.2, snapshot_interval_s=0.05,
    )  # fmt: skip
    app = create_app(settings, CollectorRegistry())
    body = {**ITEMS[0].request_body("smollm2"), "max_tokens": 64}
    with ThreadServer(app) as gateway:
        wait_for(lambda: app.state.health_rounds > 0, what="first health check")
        cold = httpx.post(f"{gateway.url}/v1/route/explain", json=body).json()
        assert cold["model"]["warm"] is False and cold["predictions"] == []
        send(gateway.url, 40, 2, 0)
        wait_for(lambda: app.state.snapshot.model is not None and app.state.snapshot.model.version >= 40,
                 what="the model to take in 40 requests")  # fmt: skip
        warm = httpx.post(f"{gateway.url}/v1/route/explain", json=body).json()
        reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=60)
    assert warm["model"]["warm"] is True and warm["decision"]["reason"].startswith("fastest")
    assert {p["pool"] for p in warm["predictions"]} == {"standard", "speculative"}
    for prediction in warm["predictions"]:
        low, high = prediction["interval_ms"]
        assert low <= prediction["predicted_ms"] <= high and prediction["samples"] >= 0
    assert reply.headers["x-specgate-reason"].startswith("fastest")
    assert float(reply.headers["x-specgate-predicted-ms"]) > 0


def test_a_drift_in_acceptance_is_followed(tmp_path: Path) -> None:
    """a100-70b-draft: code runs ~2.5x faster on the speculative pool alone; then its acceptance collapses
    there (a new draft model, say) and speculation costs 1.4x: the learned policy moves code to standard."""
    with emulated("a100-70b-draft", 10.0) as (speculative_app, standard, speculative):
        _drift(speculative_app, standard, speculative, tmp_path)


def _drift(speculative_app: EmulatorApp, standard: str, speculative: str, tmp_path: Path) -> None:
    code = [item for item in ITEMS if item.task == "code"]
    rules = adaptive_rules(tmp_path, learning_rate=0.1)  # forget faster than the default 0.05: a short test
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        standard_urls=[standard], speculative_urls=[speculative], rules_file=rules,
        reload_rules=False, health_interval_s=0.2, snapshot_interval_s=0.05,
    )  # fmt: skip
    app = create_app(settings, CollectorRegistry())
    with ThreadServer(app) as gateway:
        wait_for(lambda: app.state.health_rounds > 0, what="first health check")
        send(gateway.url, 40, 2, 0)  # warm-up on the mixed workload
        before = send_items(gateway.url, code, 30)
        assert speculative_app.core.drift("code", 0.05) > 0
        after = send_items(gateway.url, code, 140)
    print(f"\ncode to speculative: before the drift {spec_share(before):.0%}, "
          f"after it {spec_share(after[:20]):.0%}, then {spec_share(after[20:50]):.0%}, "
          f"then {spec_share(after[50:100]):.0%}, then {spec_share(after[100:]):.0%}")  # fmt: skip
    assert spec_share(before) >= 0.6
    # the share falls over the first ~100 requests after the drift (16-34 % in requests 50-100 over six runs
    # on 8100983 and this tree, 34 % once under a loaded CI machine); judged on the 40 after those
    assert spec_share(after[100:]) <= 0.25  # (a few explored, or split where the predictions are close)


def send_items(url: str, items: list[WorkloadItem], count: int) -> list[tuple[str, str]]:
    """``count`` requests from ``items`` one at a time (non-streamed: the reply carries usage and acceptance)."""
    with httpx.Client() as client:
        outcomes = []
        for i in range(count):
            body = {**items[i % len(items)].request_body("smollm2"), "max_tokens": 64}
            response = client.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert response.status_code == 200, response.text
            outcomes.append((response.headers["x-specgate-pool"], response.headers["x-specgate-reason"]))
        return outcomes
