"""``specgate rules suggest``: a static file from a learned model that loads, and reproduces its choices."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from backends.emulator.policies import PolicySet, run_policies
from backends.emulator.profiles import load_profile
from backends.emulator.report import summarise
from backends.emulator.scenarios import make_scenario_arrivals, ramp
from backends.emulator.simulate import ADAPTIVE, RULES, Simulation
from backends.workloads.loader import load_workload
from gateway.adaptive.learner import Learner
from gateway.adaptive.suggest import e2e_ms, render, suggest
from gateway.adaptive.views import model_view
from gateway.cli import main
from gateway.decide import decide
from gateway.features import RequestFeatures
from gateway.rules import default_rules, parse_rules, reference_rules
from gateway.snapshot import SPECULATIVE, STANDARD, PoolSnapshot, Snapshot

PROFILE = load_profile("a100-70b-draft")
WORKLOAD = load_workload()


@pytest.fixture(scope="module")
def view() -> dict[str, object]:
    """What the adaptive policy learned over a ramp from 10 % to 130 % of one pool's capacity (EMULATED)."""
    learner = Learner()
    arrivals = make_scenario_arrivals(WORKLOAD, ramp(60, 160), 0, reference_rules())
    Simulation(PROFILE, default_rules(), 0, learner=learner).run(arrivals)
    return model_view(learner.model(), default_rules(), 0.0, True)


def test_the_suggested_file_passes_rules_check(view: dict[str, object], tmp_path: Path) -> None:
    data = suggest(view, reference_rules())
    path = tmp_path / "suggested.yaml"
    path.write_text(render(data, "test", 1))
    assert main(["rules", "check", str(path)]) == 0
    rules = yaml.safe_load(path.read_text())["rules"]
    assert [r["name"] for r in rules[:2]] == ["pinned-standard", "pinned-speculative"]
    assert any(r["name"].startswith("learned-") for r in rules)


def test_the_suggested_rules_reproduce_the_learned_choices(view: dict[str, object]) -> None:
    rules = parse_rules(suggest(view, reference_rules()))
    pools = view["pools"]  # type: ignore[index]
    agree = total = 0
    for segment, stats in view["segments"].items():  # type: ignore[attr-defined]
        if "/" in segment or stats["samples"] < 20:
            continue
        for index, point in enumerate(pools["speculative"]["by_load"]):
            load = point["load"]
            if load > 200:
                continue
            tokens = stats["output_tokens_mean"]
            learned = min((STANDARD, SPECULATIVE), key=lambda p: e2e_ms(pools[p], index, segment, tokens))
            snapshot = Snapshot(pools={
                STANDARD: PoolSnapshot(STANDARD, 1, 1, running=load, waiting=0),
                SPECULATIVE: PoolSnapshot(SPECULATIVE, 1, 1, running=load, waiting=0),
            })  # fmt: skip
            features = RequestFeatures("m", 256, 200, segment, False, 1, None, {})
            agree += decide(features, snapshot, rules).pool == learned
            total += 1
    assert total > 10 and agree == total


def test_the_suggested_rules_beat_the_reference_rules_on_the_simulator(view: dict[str, object]) -> None:
    suggested = parse_rules(suggest(view, reference_rules()))
    arrivals = make_scenario_arrivals(WORKLOAD, ramp(60, 100), 1, reference_rules())
    reference = run_policies(PROFILE, arrivals, PolicySet(reference_rules(), default_rules()), 1)
    static = Simulation(PROFILE, suggested, 1).run(arrivals)
    ours, theirs, adaptive = (summarise(r).mean_s for r in (static, reference[RULES], reference[ADAPTIVE]))
    print(f"\nramp to 130 %: suggested {ours:.2f} s, reference rules {theirs:.2f} s, adaptive {adaptive:.2f} s")
    assert ours < theirs and math.isfinite(adaptive)


def test_suggest_refuses_a_model_that_has_not_seen_both_pools() -> None:
    with pytest.raises(ValueError, match="both pools"):
        suggest({"pools": {"standard": {}}, "segments": {}}, reference_rules())


def _pool(tpots: list[float], observed: int) -> dict[str, object]:
    grid = [0, 1, 3, 7, 15, 31, 63, 127, 255]
    return {
        "by_load": [
            {"load": load, "ttft_ms": 50.0, "tpot_ms": tpot, "samples": 20.0 if i < observed else 0.0}
            for i, (load, tpot) in enumerate(zip(grid, tpots, strict=True))
        ],
        "tpot_factor_by_segment": {},
        "ttft_factor_by_prompt_tokens": {},
    }


def test_a_threshold_is_never_drawn_past_the_loads_the_model_observed() -> None:
    """One noisy point at the top of the observed loads made the standard pool's extrapolated curve steep,
    speculative 'won' at every load, and the file sent every request there with no queue guard (seed 0 of
    the ramp above: 19.7 s against 4.8 s for the reference rules)."""
    flat = [20.0] * 7 + [40.0, 60.0]
    steep = [30.0] * 6 + [32.0, 52.0, 96.0]
    view = {
        "pools": {"speculative": _pool(flat, observed=8), "standard": _pool(steep, observed=8)},
        "segments": {"code": {"samples": 100, "output_tokens_mean": 200.0}},
    }
    rules = suggest(view, reference_rules())["rules"]
    learned = [r for r in rules if r["name"] == "learned-code"]
    assert learned and learned[0]["when"]["pools"] == {"speculative": {"running": {"lt": 255.0}, "waiting": {"lt": 1}}}
