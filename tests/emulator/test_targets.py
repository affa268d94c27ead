"""The targets judged over seeds: on the mean, with the worst seed beside it, on the levels they name."""

from __future__ import annotations

from backends.emulator.evaluate import Level
from backends.emulator.report import Summary
from backends.emulator.simulate import (
    ADAPTIVE,
    ADAPTIVE_WARM,
    ALWAYS_SPECULATIVE,
    ALWAYS_STANDARD,
    MYOPIC,
    PERFECT,
    RULES,
)
from backends.emulator.targets import Target, check_targets

BASE = {ALWAYS_STANDARD: 4.0, ALWAYS_SPECULATIVE: 2.0, RULES: 2.2, ADAPTIVE_WARM: 2.0, PERFECT: 2.0, MYOPIC: 2.0}


def level(share: float, seed: int, **means: float) -> Level:
    """A level whose policies have the given means (p95 twice the mean), else BASE's; adaptive as the best pool."""
    values = {**BASE, ADAPTIVE: 2.0, **{k.replace("_", "-"): v for k, v in means.items()}}
    summaries = {p: Summary(100, m, m, 2 * m, 0.1, 0.2, 0.5, 0.0) for p, m in values.items()}
    return Level(share, 10 * share, seed, summaries, 0.01, 0, 0, [])


def target(targets: list[Target], start: str) -> Target:
    return next(t for t in targets if t.name.startswith(start))


def test_a_target_met_on_the_mean_shows_the_seed_that_alone_would_miss_it() -> None:
    seeds = [[level(0.1, s, adaptive=2.0), level(1.0, s, adaptive=1.9)] for s in range(4)]
    seeds.append([level(0.1, 4, adaptive=2.06), level(1.0, 4, adaptive=1.9)])  # 1.03x the best pool
    found = target(check_targets(seeds), "cold: mean <= 1.00x")
    assert found.met is False  # mean over seeds at 10 %: (4 x 1.0 + 1.03) / 5 = 1.006x
    assert found.failing == 1 and found.seeds == 5
    assert found.mean.startswith("1.006x at 10%") and found.worst == "1.030x at 10% (seed 4)"
    seeds[4][0] = level(0.1, 4, adaptive=2.02)  # 1.01x: the mean is 1.002x
    seeds = [[level(lv.share, lv.seed, adaptive=lv.summaries[ADAPTIVE].mean_s * 0.99) for lv in s] for s in seeds]
    found = target(check_targets(seeds), "cold: mean <= 1.00x")
    assert found.met is True and found.failing == 0  # 0.99 x 1.01 = 0.9999x


def test_levels_beyond_150_percent_are_shown_but_not_judged() -> None:
    seeds = [[level(1.5, s), level(2.0, s, adaptive=3.0)] for s in range(5)]
    assert target(check_targets(seeds), "cold: mean <= 1.00x").met is True
    seeds = [[level(1.5, s, adaptive=3.0), level(2.0, s)] for s in range(5)]
    assert target(check_targets(seeds), "cold: mean <= 1.00x").met is False


def test_the_rules_target_applies_only_where_the_rules_leave_room_above_perfect_predictor() -> None:
    close = [[level(0.1, s, rules=2.08), level(1.0, s, rules=2.08)] for s in range(5)]  # 1.04x perfect
    assert target(check_targets(close), "cold: mean <= 0.95x the rules").met is None
    roomy = [[level(0.1, s, rules=2.08), level(1.0, s, rules=4.0)] for s in range(5)]
    found = target(check_targets(roomy), "cold: mean <= 0.95x the rules")
    assert found.met is True and found.mean.startswith("0.500x at 100%")  # the close level is not judged
    tight = [[level(0.1, s, rules=2.08), level(1.0, s, rules=2.12, adaptive=2.05)] for s in range(5)]
    found = target(check_targets(tight), "cold: mean <= 0.95x the rules")  # the rules 1.06x perfect: judged
    assert found.met is False and found.failing == 5 and found.mean.startswith("0.967x at 100%")


def test_the_bound_is_perfect_predictor_and_the_steady_state_is_shown_beside_the_cold_start() -> None:
    seeds = [[level(0.1, s, adaptive=2.3, adaptive_warm=2.1)] for s in range(5)]
    found = target(check_targets(seeds), "cold: mean within 10% of perfect-predictor")
    assert found.met is False and found.mean == "1.150x at 10%; steady state 1.050x"


def test_a_seed_that_never_settles_misses_the_target_whatever_the_others_do() -> None:
    def settled(seed: int, after: int | None) -> list[Level]:
        return [Level(lv.share, lv.qps, seed, lv.summaries, 0.01, after, 9, []) for lv in [level(0.5, seed)]]

    found = target(check_targets([settled(0, 100), settled(1, None), settled(2, 0)]), "cold start:")
    assert found.met is False and found.mean == "never (a seed)" and found.worst == "never (seed 1)"
    found = target(check_targets([settled(0, 100), settled(1, 400), settled(2, 0)]), "cold start:")
    assert found.met is True and found.failing == 1 and found.worst == "slowest level 400 requests (seed 1)"


def test_against_one_dynamic_pool_the_low_load_target_reads_only_levels_to_55_percent() -> None:
    def seed(s: int, dyn_low: float, dyn_high: float) -> list[Level]:
        return [level(0.1, s, dynamic_pool=dyn_low), level(0.55, s, dynamic_pool=dyn_low),
                level(1.0, s, dynamic_pool=dyn_high)]  # fmt: skip

    assert not any("dynamic-k" in t.name for t in check_targets([[level(0.1, 0), level(1.0, 0)]]))  # not run
    low_room = check_targets([seed(s, dyn_low=2.4, dyn_high=1.0) for s in range(3)])
    assert target(low_room, "cold: mean <= 0.90x one dynamic-k").met is True  # 2.0 / 2.4 = 0.833x; 100 % not read
    assert target(low_room, "cold: mean <= 1.02x one dynamic-k").met is False  # 2.0 / 1.0 at 100 %
    assert target(low_room, "cold: mean <= 1.02x one dynamic-k").mean.startswith("2.000x at 100%")
    no_room = check_targets([seed(s, dyn_low=2.1, dyn_high=4.0) for s in range(3)])
    assert target(no_room, "cold: mean <= 0.90x one dynamic-k").met is False  # 0.952x at 10-55 %
    assert target(no_room, "cold: mean <= 1.02x one dynamic-k").met is True
