"""The virtual-time simulator: deterministic, uses the gateway's decide(), sees what a gateway sees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backends.emulator.cli import register_simulate  # noqa: F401  (the CLI module imports cleanly)
from backends.emulator.policies import PolicySet, fixed_pool_rules, run_policies, simulations
from backends.emulator.profiles import dynamic_profile, load_profile
from backends.emulator.report import shares_per_second, summarise
from backends.emulator.scenarios import capacity_qps, make_arrivals, simulate_level
from backends.emulator.simulate import (
    ACCEPTANCE,
    ADAPTIVE,
    ADAPTIVE_WARM,
    ALWAYS_SPECULATIVE,
    ALWAYS_STANDARD,
    DYNAMIC_POOL,
    LENGTH,
    MYOPIC,
    PERFECT,
    RULES,
    Simulation,
)
from backends.emulator.timing import TimingModel
from backends.workloads.loader import load_workload
from gateway.adaptive.learner import Learner
from gateway.cli import main
from gateway.rules import default_rules, parse_rules, reference_rules

PROFILE = load_profile("a100-70b-draft")
WORKLOAD = load_workload()


def _level(qps: float, seed: int = 0, duration_s: float = 30.0) -> dict[str, list]:  # type: ignore[type-arg]
    return simulate_level(PROFILE, WORKLOAD, reference_rules(), qps, duration_s, seed, warmup_s=5.0)


def test_same_seed_same_results_different_seed_different() -> None:
    assert _level(6, seed=1) == _level(6, seed=1)
    assert _level(6, seed=1)[RULES] != _level(6, seed=2)[RULES]


def test_fixed_policies_send_everything_to_their_pool() -> None:
    runs = _level(4)
    assert {result.pool for result in runs[ALWAYS_STANDARD]} == {"standard"}
    assert {result.pool for result in runs[ALWAYS_SPECULATIVE]} == {"speculative"}


def test_the_shipped_rules_route_through_the_gateway_decide() -> None:
    low = _level(4)[RULES]
    assert all(r.pool == "standard" for r in low if r.reason == "short-output")
    assert {r.reason for r in low} >= {"short-output", "draft-friendly-task", "default"}
    high = _level(30)[RULES]
    assert summarise(high).speculative_share < 0.1  # qps > 20: the high-load rule holds (once the window fills)


def test_a_custom_rules_file_changes_the_routing() -> None:
    rules = parse_rules({"rules": [{"name": "all-spec", "pool": "speculative"}], "default_pool": "standard"})
    runs = simulate_level(PROFILE, WORKLOAD, rules, 4, 20, 0, warmup_s=2)
    assert {result.reason for result in runs[RULES]} == {"all-spec"}


def test_speculation_wins_at_low_load_and_loses_at_saturation() -> None:
    low, high = _level(4), _level(40, duration_s=40)
    assert summarise(low[ALWAYS_SPECULATIVE]).mean_s < 0.7 * summarise(low[ALWAYS_STANDARD]).mean_s
    assert summarise(high[ALWAYS_SPECULATIVE]).mean_s > 1.5 * summarise(high[ALWAYS_STANDARD]).mean_s


def test_simulate_cli_prints_emulated_tables_and_writes_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot, data = tmp_path / "sim.png", tmp_path / "sim.json"
    argv = ["simulate", "--qps", "2,30", "--duration", "15", "--warmup", "2", "--scenarios", "drift",
            "--scenario-duration", "30", "--seeds", "2", "--jobs", "1", "--plot", str(plot),
            "--json", str(data)]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "EMULATED a100-70b-draft: mean latency" in out and "EMULATED a100-70b-draft scenarios" in out
    assert "adaptive policy targets" in out and "2 seeds" in out
    assert captured.err == ""  # no progress bar where stderr is not a terminal
    assert plot.stat().st_size > 10_000
    report = json.loads(data.read_text())["a100-70b-draft"]
    assert report["seeds"] == [0, 1] and report["telemetry"] == "full"
    assert [len(seed) for seed in report["levels"]] == [2, 2] and report["scenarios"][1][0]["name"] == "drift"
    assert [level["seed"] for level in report["levels"][1]] == [1, 1]
    policies = {ALWAYS_STANDARD, ALWAYS_SPECULATIVE, RULES, ADAPTIVE, ADAPTIVE_WARM, PERFECT, MYOPIC, DYNAMIC_POOL}
    assert set(report["levels"][0][0]["summaries"]) == policies
    assert {t["name"] for t in report["targets"]} >= {"explored share <= 3%"}
    assert all(t["seeds"] == 2 for t in report["targets"])


def test_simulate_cli_rejects_bad_levels(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--qps", "0"]) == 2
    assert "positive" in capsys.readouterr().out


def test_a_lone_request_takes_prefill_plus_one_step_per_token() -> None:
    from backends.emulator.timing import TimingModel

    rules = fixed_pool_rules(default_rules(), "standard")
    arrivals = make_arrivals(WORKLOAD, 0.001, 3, 0, rules)  # ~1000 s apart: each request runs alone
    model = TimingModel(PROFILE, speculative=False)
    for arrival, result in zip(arrivals, Simulation(PROFILE, rules).run(arrivals), strict=True):
        item = arrival.item
        tokens = min(item.output_tokens, item.max_tokens)
        prefill = model.step_s(0, 1, item.prompt_tokens)
        assert result.ttft_s == pytest.approx(prefill)
        assert result.latency_s == pytest.approx(prefill + (tokens - 1) * model.step_s(1))


def test_the_decider_sees_engine_stats_as_of_the_last_scrape() -> None:
    """Between scrapes the engine stats stay as scraped; only the gateway's own in-flight count is fresh."""
    seen = []

    class Spy(Simulation):
        def _snapshot(self, now: float, gateway: int = 0):  # type: ignore[no-untyped-def]
            snapshot = super()._snapshot(now, gateway)
            seen.append((now, snapshot.pool("standard").running, snapshot.pool("standard").inflight))
            return snapshot

    rules = fixed_pool_rules(reference_rules(), "standard")
    arrivals = make_arrivals(WORKLOAD, 40, 60, 0, rules)  # 60 arrivals in ~1.5 s: several per scrape
    Spy(PROFILE, rules, scrape_interval_s=1.0).run(arrivals)
    first_second = [(running, inflight) for at, running, inflight in seen if at < 1.0]
    assert len({running for running, _ in first_second}) == 1  # one scrape's value all through the second
    assert len({inflight for _, inflight in first_second}) > 3  # the own count moved with every arrival


def test_more_replicas_per_pool_share_the_load() -> None:
    rules = fixed_pool_rules(reference_rules(), "standard")
    arrivals = make_arrivals(WORKLOAD, 90, 1200, 0, rules)  # ~2x one engine's capacity
    one = Simulation(PROFILE, rules, replicas=1).run(arrivals)
    two = Simulation(PROFILE, rules, replicas=2).run(arrivals)
    assert summarise(two).mean_s < 0.8 * summarise(one).mean_s


def test_the_adaptive_policy_learns_from_a_cold_start_and_beats_both_fixed_pools_under_load() -> None:
    """EMULATED, a100-70b-draft at ~70 % of one pool's capacity: where the fixed pools are far apart."""
    arrivals = make_arrivals(WORKLOAD, 32, 1600, 3, reference_rules())
    runs = run_policies(PROFILE, arrivals, PolicySet(reference_rules(), default_rules()), 3)
    tail = {policy: summarise([r for r in results if r.index >= 600]).mean_s for policy, results in runs.items()}
    assert tail[ADAPTIVE] < min(tail[ALWAYS_STANDARD], tail[ALWAYS_SPECULATIVE])
    assert tail[ADAPTIVE] < tail[RULES]
    adaptive = runs[ADAPTIVE]
    assert any(r.reason.endswith("(warm-up)") for r in adaptive[:40])  # the rules decided while cold
    assert sum(r.reason == "fastest" for r in adaptive[600:]) > 0.9 * len(adaptive[600:])
    shares = {pool: sum(r.pool == pool for r in adaptive[600:]) for pool in ("standard", "speculative")}
    assert min(shares.values()) > 0.15 * len(adaptive[600:]), shares  # both pools used: split, not herded
    assert sum(r.explored for r in adaptive) <= 0.03 * len(adaptive)


def test_several_gateways_each_see_their_own_requests_fresh_and_the_others_a_scrape_late() -> None:
    seen: list[tuple[int, int, int]] = []  # (gateway, own in flight on the standard pool, everyone's)

    class Spy(Simulation):
        def _snapshot(self, now: float, gateway: int = 0):  # type: ignore[no-untyped-def]
            snapshot = super()._snapshot(now, gateway)
            total = sum(r.inflight for r in self._replicas["standard"])
            seen.append((gateway, snapshot.pool("standard").inflight, total))
            assert snapshot.gateways == 2
            return snapshot

    rules = fixed_pool_rules(reference_rules(), "standard")
    results = Spy(PROFILE, rules, gateways=2).run(make_arrivals(WORKLOAD, 40, 200, 0, rules))
    assert len(results) == 200 and {g for g, _, _ in seen} == {0, 1}
    assert all(own <= total for _, own, total in seen)
    assert sum(own < total for _, own, total in seen) > 150  # mostly the other one's requests are there too


def test_two_gateways_split_the_load_without_herding() -> None:
    """EMULATED, a100-70b-draft at ~70 % of one pool's capacity, two gateways that do not know of each other
    (no Redis): each reads the other's requests only in the engines' stats, a scrape late. Herding would show
    as the speculative share swinging between seconds (all of a second's requests to one pool, then back)."""
    arrivals = make_arrivals(WORKLOAD, 32, 1600, 3, reference_rules())
    policies = PolicySet(reference_rules(), default_rules())
    include = (ALWAYS_STANDARD, ALWAYS_SPECULATIVE, ADAPTIVE)
    runs = run_policies(PROFILE, arrivals, policies, 3, include=include, gateways=2)
    blind = Simulation(PROFILE, default_rules(), 3, learner=Learner(), gateways=2, gateways_known=False)
    runs["blind"] = blind.run(arrivals)
    tail = {policy: [r for r in results if r.index >= 600] for policy, results in runs.items()}
    best_fixed = min(summarise(tail[ALWAYS_STANDARD]).mean_s, summarise(tail[ALWAYS_SPECULATIVE]).mean_s)
    for policy in (ADAPTIVE, "blind"):
        assert summarise(tail[policy]).mean_s < best_fixed, policy
        shares = shares_per_second(tail[policy])
        summary = summarise(tail[policy])
        assert 0.2 < summary.speculative_share < 0.9 and summary.share_spread < 0.25, (policy, shares)


def test_myopic_uses_both_pools_under_load() -> None:
    arrivals = make_arrivals(WORKLOAD, 40, 800, 0, reference_rules())
    runs = run_policies(PROFILE, arrivals, PolicySet(reference_rules()), 0, include=(MYOPIC,))
    pools = {r.pool for r in runs[MYOPIC]}
    assert pools == {"standard", "speculative"}


def test_adaptive_warm_starts_from_a_learner_that_served_earlier_arrivals() -> None:
    arrivals = make_arrivals(WORKLOAD, 32, 300, 5, reference_rules())
    earlier = make_arrivals(WORKLOAD, 32, 300, 6, reference_rules())
    policies = PolicySet(reference_rules(), default_rules())
    runs = run_policies(PROFILE, arrivals, policies, 5, include=(ADAPTIVE, ADAPTIVE_WARM), warm_arrivals=earlier)
    assert any(r.reason.endswith("(warm-up)") for r in runs[ADAPTIVE][:20])
    assert not any(r.reason.endswith("(warm-up)") for r in runs[ADAPTIVE_WARM])  # it learned before these
    assert ADAPTIVE_WARM not in run_policies(PROFILE, arrivals, policies, 5, include=(ADAPTIVE, ADAPTIVE_WARM))


def test_the_learner_is_taught_the_load_each_request_ran_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst onto one pool: the first requests arrived at a low load and ran beside the rest (their run
    load is higher than their arrival load); the last ones arrived at the burst's peak and ran while it
    drained (lower). The simulator reports it as the gateway does (``Booking.run_shift``). What the learner is
    taught is read where the simulator makes it, not by subclassing ``Learner`` (compiled, it cannot be)."""
    from gateway.adaptive.learner import Observation

    seen: list[Observation] = []
    made = Simulation._observation

    def spy(self: Simulation, *args: Any) -> Observation:
        seen.append(made(self, *args))
        return seen[-1]

    monkeypatch.setattr(Simulation, "_observation", spy)
    rules = default_rules()  # the model is cold all through the burst: the warm-up rules split it by task
    arrivals = make_arrivals(WORKLOAD, 400, 40, 0, rules)  # 40 arrivals in ~0.1 s: a burst, then none
    Simulation(PROFILE, rules, learner=Learner()).run(arrivals)
    by_load = sorted((obs for obs in seen if obs.pool == "standard"), key=lambda obs: obs.load)
    assert len(by_load) > 10 and by_load[0].load < 1 and by_load[-1].load > 10
    assert all(obs.run_load is not None for obs in seen)
    assert by_load[0].run_load > by_load[0].load + 5  # arrived first, ran beside the whole burst
    assert by_load[-1].run_load < by_load[-1].load  # arrived last, ran while the others finished


def test_simulate_cli_runs_on_an_operators_own_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--workload``: a file (or a directory of them) in the shipped format replaces the shipped workloads.
    One category of long outputs only (drawn values, as the drawer writes them): the figures follow it."""
    from backends.workloads.loader import DATA_DIR

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "code.yaml").write_text((DATA_DIR / "code.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    argv = ["simulate", "--qps", "4", "--duration", "15", "--warmup", "2", "--scenarios", "", "--seeds", "1",
            "--jobs", "1", "--json"]  # fmt: skip
    assert main([*argv, str(tmp_path / "shipped.json")]) == 0
    assert main([*argv, str(tmp_path / "mine.json"), "--workload", str(mine)]) == 0
    assert main([*argv, str(tmp_path / "file.json"), "--workload", str(mine / "code.yaml")]) == 0
    capsys.readouterr()
    shipped, own, file = (json.loads((tmp_path / f"{n}.json").read_text())["a100-70b-draft"]
                          for n in ("shipped", "mine", "file"))  # fmt: skip
    assert own == file  # a directory is its files
    assert own["capacity_qps"] != shipped["capacity_qps"]  # capacity is the workload's: code only here
    assert own["levels"][0][0]["summaries"] != shipped["levels"][0][0]["summaries"]


def test_simulate_cli_names_a_bad_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("category: code\nitems:\n  - id: x\n    user: hi\n    max_tokens: 10\n", encoding="utf-8")
    assert main(["simulate", "--workload", str(bad)]) == 2  # no drawn acceptance / output_tokens
    assert "bad.yaml" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main(["simulate", "--workload", str(tmp_path / "empty")]) == 2
    assert "no workload items" in capsys.readouterr().out


def test_perfect_predictor_is_fed_each_requests_truth_and_no_other_policy_is() -> None:
    """``known`` carries the acceptance the speculative engine draws from and the tokens the request will
    generate, on perfect-predictor's features only: what decide() is given."""
    given: list[tuple[int, object]] = []

    class Spy(Simulation):
        def _features(self, arrival, output_tokens):  # type: ignore[no-untyped-def]
            features = super()._features(arrival, output_tokens)
            given.append((arrival.index, features.known))
            return features

    arrivals = make_arrivals(WORKLOAD, 20, 60, 0, default_rules())
    Spy(PROFILE, default_rules(), learner=Learner(), perfect=True).run(arrivals)
    model = TimingModel(PROFILE, speculative=True)
    assert len(given) == len(arrivals)
    for index, known in given:
        item = arrivals[index].item
        truth = (model.effective_acceptance(arrivals[index].acceptance), min(item.output_tokens, item.max_tokens))
        assert known == truth
    for knows, part in ((ACCEPTANCE, 0), (LENGTH, 1)):  # one truth; the other left to be estimated
        given.clear()
        Spy(PROFILE, default_rules(), learner=Learner(), perfect=True, perfect_knows=knows).run(arrivals)
        for index, known in given:
            item = arrivals[index].item
            truth = (model.effective_acceptance(arrivals[index].acceptance), min(item.output_tokens, item.max_tokens))
            assert known == tuple(value if i == part else None for i, value in enumerate(truth))
    given.clear()
    Spy(PROFILE, default_rules(), learner=Learner()).run(arrivals)
    assert {known for _, known in given} == {None}


def test_perfect_predictor_reads_the_engines_as_they_are() -> None:
    """Exact state: every decision of perfect-predictor sees the engines' running and waiting counts of that
    moment; a gateway scraping every second sees them up to a second late."""
    stale: dict[str, list[bool]] = {}

    class Spy(Simulation):
        def _snapshot(self, now: float, gateway: int = 0):  # type: ignore[no-untyped-def]
            snapshot = super()._snapshot(now, gateway)
            engines = sum(r.engine.num_running + r.engine.num_waiting for r in self._replicas["standard"])
            seen = snapshot.pool("standard")
            stale.setdefault("exact" if self.scrape_interval_s == 0 else "scraped", []).append(
                seen.running + seen.waiting != engines or seen.stats_age_s > 0
            )
            return snapshot

    rules = fixed_pool_rules(reference_rules(), "standard")
    arrivals = make_arrivals(WORKLOAD, 40, 200, 0, rules)
    Spy(PROFILE, rules, scrape_interval_s=0.0).run(arrivals)
    Spy(PROFILE, rules, scrape_interval_s=1.0).run(arrivals)
    assert len(stale["exact"]) == 200 and not any(stale["exact"])
    assert sum(stale["scraped"]) > 100


def test_perfect_predictor_runs_warm_and_is_no_worse_than_the_warm_adaptive_policy() -> None:
    """The bound runs the shipped decision from a learner trained as adaptive-warm's (on other arrivals at
    the same load, as it routes them); without those arrivals it does not run (a cold bound is no bound)."""
    arrivals = make_arrivals(WORKLOAD, 32, 900, 5, reference_rules())
    earlier = make_arrivals(WORKLOAD, 32, 900, 6, reference_rules())
    policies = PolicySet(reference_rules(), default_rules())
    runs = run_policies(PROFILE, arrivals, policies, 5, include=(ADAPTIVE_WARM, PERFECT), warm_arrivals=earlier)
    assert not any(r.reason.endswith("(warm-up)") for r in runs[PERFECT])
    assert {r.reason for r in runs[PERFECT]} <= {"fastest", "fastest: explore"}
    assert summarise(runs[PERFECT]).mean_s <= 1.02 * summarise(runs[ADAPTIVE_WARM]).mean_s
    assert PERFECT not in run_policies(PROFILE, arrivals, policies, 5, include=(ADAPTIVE, PERFECT))
    made = simulations(PROFILE, policies, 5, scrape_interval_s=2.0, warm_arrivals=earlier[:100])
    bound, warm = made[PERFECT](), made[ADAPTIVE_WARM]()
    assert bound.perfect and bound.scrape_interval_s == 0.0 and bound.learner is not None
    assert bound.learner.observations == warm.learner.observations == 100  # type: ignore[union-attr]
    assert not warm.perfect and warm.scrape_interval_s == 2.0
    partial = simulations(PROFILE, policies, 5, warm_arrivals=earlier[:100], perfect_knows=LENGTH)
    assert partial[PERFECT]().perfect_knows == LENGTH


def test_simulate_cli_says_what_a_partial_bound_knows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--perfect-knows``: the tables say what the bound was fed, and the JSON records it."""
    argv = ["simulate", "--profile", "h100-8b", "--loads", "1.5", "--seeds", "1", "--duration", "60", "--scenarios",
            "", "--json"]  # fmt: skip
    for knows in ("acceptance", "length"):
        assert main([*argv, str(tmp_path / f"{knows}.json"), "--perfect-knows", knows]) == 0
        out = capsys.readouterr().out
        assert f"knows each request's {'acceptance' if knows == 'acceptance' else 'output length'} only" in out
        data = json.loads((tmp_path / f"{knows}.json").read_text())
        profile = data["h100-8b"]
        assert profile["perfect_knows"] == knows
        assert profile["levels"][0][0]["summaries"][PERFECT]["requests"] > 0


def test_myopic_is_not_a_bound_under_load() -> None:
    """At one pool's capacity the policy that counts the delay a request adds to the others (the shipped
    decision, warm) beats the one that knows every request's truth and the engines' exact state but picks
    for each request alone: why ``myopic`` is named for what it is and judged by nothing."""
    arrivals = make_arrivals(WORKLOAD, 46, 2000, 1, reference_rules())
    earlier = make_arrivals(WORKLOAD, 46, 2000, 2, reference_rules())
    policies = PolicySet(reference_rules(), default_rules())
    runs = run_policies(PROFILE, arrivals, policies, 1, include=(ADAPTIVE_WARM, MYOPIC), warm_arrivals=earlier)
    tail = {policy: summarise([r for r in results if r.index >= 400]).mean_s for policy, results in runs.items()}
    assert tail[ADAPTIVE_WARM] < 0.95 * tail[MYOPIC]


def test_simulate_reads_the_workload_with_each_profiles_own_drafter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profile whose drafter fits Chinese badly is simulated on that truth, as its emulator serves it."""
    from backends.emulator.profiles import PROFILE_DIR

    text = (PROFILE_DIR / "h100-8b.yaml").read_text(encoding="utf-8")
    weak = tmp_path / "weak-cjk.yaml"
    weak.write_text(text.replace("name: h100-8b", "name: weak-cjk").replace("cjk: -0.15", "cjk: -3.0"), "utf-8")
    argv = ["simulate", "--loads", "0.25", "--duration", "15", "--warmup", "2", "--scenarios", "", "--seeds", "1",
            "--jobs", "1", "--workload", str(Path(__file__).parents[2] / "backends/workloads/data/translation.yaml")]
    assert main([*argv, "--profile", "h100-8b", "--json", str(tmp_path / "own.json")]) == 0
    assert main([*argv, "--profile", str(weak), "--json", str(tmp_path / "weak.json")]) == 0
    capsys.readouterr()
    own = json.loads((tmp_path / "own.json").read_text())["h100-8b"]
    low = json.loads((tmp_path / "weak.json").read_text())["weak-cjk"]
    assert low["levels"][0][0]["summaries"] != own["levels"][0][0]["summaries"]


def test_the_dynamic_pool_is_one_pool_of_all_the_engines_turning_speculation_down_under_load() -> None:
    profile = load_profile("h100-8b")
    policies = PolicySet(reference_rules(), default_rules())
    arrivals = make_arrivals(WORKLOAD, 2 * capacity_qps(profile, WORKLOAD), 400, 0, reference_rules())
    dynamic = simulations(profile, policies, 0, replicas=2)[DYNAMIC_POOL]()
    assert dynamic.profile == dynamic_profile(profile)
    assert [len(dynamic._replicas[p]) for p in ("standard", "speculative")] == [0, 4]
    runs = dynamic.run(arrivals)
    assert {r.pool for r in runs} == {"speculative"} and len(runs) == len(arrivals)
    # the same four engines with the profile's fixed k: speculation past its knee makes them far slower
    fixed = Simulation(profile, fixed_pool_rules(reference_rules(), "speculative"), 0, replicas=2,
                       layout={"speculative": 4, "standard": 0}).run(arrivals)  # fmt: skip
    assert summarise(runs).mean_s < 0.7 * summarise(fixed).mean_s  # 1.19 s against 2.06 s


def test_simulate_cli_runs_specgates_speculative_pool_with_dynamic_k(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim.json"
    args = ["simulate", "--profile", "h100-8b", "--loads", "0.25", "--seeds", "1", "--duration", "20",
            "--scenarios", "", "--jobs", "1", "--speculative-k", "dynamic", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert list(report) == ["h100-8b+dynamic-k"]
    assert DYNAMIC_POOL in report["h100-8b+dynamic-k"]["levels"][0][0]["summaries"]
    assert "one dynamic-k pool" in capsys.readouterr().out


def test_simulate_cli_names_a_bad_k_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--profile", "h100-8b", "--loads", "0.25", "--seeds", "1", "--scenarios", ""]
    assert main([*args, "--speculative-k", "1-8"]) == 2
    assert "FROM-TO:K" in capsys.readouterr().out
    assert main([*args, "--speculative-k", "1-8:6"]) == 2  # h100-8b drafts 5 at most
    assert "num_speculative_tokens (5)" in capsys.readouterr().out


def test_simulate_cli_profiles_a_table_per_profile_for_both_setups(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    args = ["simulate", "--profile", "h100-8b", "--loads", "0.25", "--seeds", "1", "--duration", "20",
            "--scenarios", "", "--jobs", "1", "--speculative-k", "profiled", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    (name,) = json.loads(out.read_text())
    assert name.startswith("h100-8b+k=1-") and name.endswith(":0")  # drafts nothing past h100-8b's knee


def test_the_one_pool_baseline_is_routed_by_as_many_gateways_as_specgate() -> None:
    """``--gateways N``: the dynamic pool's router is N replicas too, each seeing the others a scrape late."""
    sims = simulations(PROFILE, PolicySet(reference_rules(), default_rules()), 0, gateways=3)
    assert sims[DYNAMIC_POOL]().gateways == 3
    assert sims[ADAPTIVE]().gateways == 3
