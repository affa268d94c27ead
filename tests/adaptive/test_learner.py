"""The learner on synthetic data from the emulator's timing model: it converges, its intervals shrink with
samples, it forgets (drift), and several learners share through export/absorb."""

from __future__ import annotations

import math
import random

import pytest

from backends.emulator.profiles import load_profile
from backends.emulator.timing import TimingModel, expected_tokens_per_step
from gateway.adaptive.learner import Learner, Observation
from gateway.adaptive.model import NODES, LatencyModel, Lengths, Offset, load_position, prompt_bin
from gateway.snapshot import POOL_NAMES

PROFILE = load_profile("a100-70b-draft")
SEGMENTS = {"code/copy": 0.85, "chat": 0.55}  # per-token acceptance of each segment
STANDARD = TimingModel(PROFILE, speculative=False)
SPECULATIVE = TimingModel(PROFILE, speculative=True)


def truth(pool: str, segment: str, load: float) -> tuple[float, float]:
    """(ttft, tpot) the timing model gives a request joining ``load`` others, 100 prompt tokens."""
    model = SPECULATIVE if pool == "speculative" else STANDARD
    batch = int(load) + 1
    ttft = model.step_s(batch - 1, 1, 100)
    return ttft, model.time_per_output_token_s(batch, SEGMENTS[segment])


def observations(rng: random.Random, count: int, noise: float = 0.1, loads: tuple[int, ...] = (0, 4, 30, 120)):
    for _ in range(count):
        pool = rng.choice(("standard", "speculative"))
        segment = rng.choice(list(SEGMENTS))
        load = rng.choice(loads)
        ttft, tpot = truth(pool, segment, load)
        tokens = rng.randint(50, 300)
        ttft *= math.exp(rng.gauss(0, noise))
        tpot *= math.exp(rng.gauss(0, noise))
        acceptance = None
        if pool == "speculative":
            acceptance = expected_tokens_per_step(SEGMENTS[segment], SPECULATIVE.k)
        yield Observation(pool, segment, 100, load, ttft, ttft + (tokens - 1) * tpot, tokens, acceptance)


@pytest.mark.parametrize("with_acceptance", [True, False], ids=["per-request-acceptance", "timing-only"])
def test_converges_to_the_timing_model(with_acceptance: bool) -> None:
    learner = Learner(learning_rate=0.02)
    for obs in observations(random.Random(1), 4000):
        if not with_acceptance:
            obs = Observation(obs.pool, obs.segment, obs.prompt_tokens, obs.load, obs.ttft_s, obs.total_s,
                              obs.output_tokens)  # fmt: skip
        learner.observe(obs)
    model = learner.model()
    for pool in ("standard", "speculative"):
        for segment in SEGMENTS:
            for load in (0, 4, 30, 120):
                predicted = model.predict(pool, segment, 100, 256, load)
                assert predicted is not None
                ttft, tpot = truth(pool, segment, load)
                assert predicted.tpot_s == pytest.approx(tpot, rel=0.12), (pool, segment, load)
                assert predicted.ttft_s == pytest.approx(ttft, rel=0.15), (pool, segment, load)


def test_the_learned_model_ranks_the_pools_as_the_timing_model_does() -> None:
    learner = Learner()
    for obs in observations(random.Random(2), 3000):
        learner.observe(obs)
    model = learner.model()
    for segment in SEGMENTS:
        for load in (0, 4, 120):
            std = model.predict("standard", segment, 100, 200, load)
            spec = model.predict("speculative", segment, 100, 200, load)
            assert std is not None and spec is not None
            true_std, true_spec = (200 * truth(p, segment, load)[1] for p in ("standard", "speculative"))
            if abs(true_std - true_spec) > 0.15 * min(true_std, true_spec):
                assert (std.e2e_s < spec.e2e_s) == (true_std < true_spec), (segment, load)


def test_intervals_shrink_with_samples() -> None:
    learner = Learner()
    widths = []
    rng = random.Random(3)
    stream = observations(rng, 2000, noise=0.3, loads=(8,))
    for seen in (5, 50, 1000):
        while learner.observations < seen:
            learner.observe(next(stream))
        prediction = learner.model().predict("speculative", "chat", 100, 200, 8)
        assert prediction is not None
        widths.append(prediction.high_s / prediction.low_s)
    assert widths[0] > widths[1] > widths[2]


def test_forgets_old_data_after_a_drift() -> None:
    """Acceptance of one segment collapses; within a few hundred of its observations the model follows."""
    learner = Learner()
    rng = random.Random(4)
    for obs in observations(rng, 1500, loads=(2,)):
        learner.observe(obs)
    before = learner.model().predict("speculative", "code/copy", 100, 200, 2)
    SEGMENTS["code/copy"] = 0.3
    try:
        for obs in observations(rng, 600, loads=(2,)):
            learner.observe(obs)
        after = learner.model().predict("speculative", "code/copy", 100, 200, 2)
        _, true_tpot = truth("speculative", "code/copy", 2)
    finally:
        SEGMENTS["code/copy"] = 0.85
    assert before is not None and after is not None
    assert after.tpot_s > 1.5 * before.tpot_s
    assert after.tpot_s == pytest.approx(true_tpot, rel=0.15)


def test_curves_never_fall_with_load_and_fill_unvisited_nodes() -> None:
    learner = Learner()
    for obs in observations(random.Random(5), 500, loads=(0, 120)):
        learner.observe(obs)
    curve = learner.model().pools["speculative"].tpot
    assert all(b >= a for a, b in zip(curve.values, curve.values[1:], strict=False))
    low, mid, high = (curve.at(load)[0] for load in (0, 30, 120))
    assert low <= mid <= high


def test_output_length_is_learned_per_segment_and_capped_by_max_tokens() -> None:
    lengths = Lengths.of([10, 20, 30, 1000])
    assert lengths.expected(2000) == pytest.approx(265)
    assert lengths.expected(25) == pytest.approx((10 + 20 + 25 + 25) / 4)
    assert LatencyModel().expected_tokens("x", 100) == (50.0, 0.0)  # nothing known: half of max_tokens


def _warm_and_synced(seed: int = 6) -> tuple[Learner, Learner]:
    """A learner taught 2,000 observations, and a fresh one that has absorbed its export once."""
    warm, cold = Learner(), Learner()
    for obs in observations(random.Random(seed), 2000):
        warm.observe(obs)
    cold.absorb(warm.export())
    return warm, cold


def test_sharing_brings_a_cold_learner_to_what_the_others_know() -> None:
    warm, cold = _warm_and_synced()
    a, b = warm.model(), cold.model()
    for pool in ("standard", "speculative"):
        pa, pb = a.predict(pool, "chat", 100, 200, 30), b.predict(pool, "chat", 100, 200, 30)
        assert pa is not None and pb is not None
        assert pb.e2e_s == pytest.approx(pa.e2e_s, rel=0.1)
        assert b.samples(pool) > 10


def test_a_fresh_learner_takes_both_residual_variances_as_the_others_learned_them() -> None:
    """The two variances share one sample count: the second must not be blended against the count the
    first has just raised (a fresh replica took about half of the others' time-per-token variance)."""
    warm, cold = _warm_and_synced()
    theirs, mine = warm.export(), cold.export()
    for pool in ("standard", "speculative"):
        for part in ("ttft", "tpot"):
            name = f"{pool}|var|{part}|-"
            assert mine[name][0] == pytest.approx(theirs[name][0], rel=1e-9)
    cold.absorb(warm.export())  # a second sync moves nothing
    assert cold.export()["standard|var|tpot|-"][0] == pytest.approx(theirs["standard|var|tpot|-"][0], rel=1e-9)


def test_time_per_token_is_learned_at_the_load_a_request_ran_at() -> None:
    """A pool that fills up behind the requests it takes (a warm-up under the rules piles requests onto it):
    half the requests arrive at load 2 and run at load 2, half arrive at load 2 and then run beside 250 more
    (four times slower per token). Learned against the load at arrival, load 2 would look twice as slow as
    it is, and the policy would send the pool less than it should; against the load they ran at, both
    loads are right."""
    learner = Learner()
    rng = random.Random(3)
    for _ in range(600):
        ran_at = rng.choice((2.0, 250.0))
        _, tpot = truth("speculative", "chat", ran_at)
        tpot *= math.exp(rng.gauss(0, 0.05))
        accepted = expected_tokens_per_step(SEGMENTS["chat"], SPECULATIVE.k)
        learner.observe(Observation("speculative", "chat", 100, 2.0, None, 200 * tpot, 201, accepted, run_load=ran_at))
    model = learner.model()
    for load in (2.0, 250.0):
        predicted = model.predict("speculative", "chat", 100, 1000, load, tokens=(201.0, 100.0))
        assert predicted is not None
        assert predicted.tpot_s == pytest.approx(truth("speculative", "chat", load)[1], rel=0.1)


def test_one_slow_request_at_a_low_load_does_not_lift_the_curve_above_it() -> None:
    """A pool that is flat at 20 ms per token from load 7 up (hundreds of requests), and one request seen
    alone that took 90 ms per token (a long prefill, an outlier). The curve stays non-decreasing by pooling
    that point with its well-known neighbour, weighted: it barely moves the loads that traffic runs at
    (a running maximum lifted every load above it to 90 ms, and the pool looked 4.5x slower than it is)."""
    learner = Learner()
    rng = random.Random(4)
    for i in range(400):
        load, tpot = rng.uniform(7, 40), 0.02 * math.exp(rng.gauss(0, 0.05))
        if i == 200:
            load, tpot = 1.0, 0.09
        learner.observe(Observation("speculative", "chat", 100, load, None, tpot * 200, 201, 2.0))
    model = learner.model()
    for load in (8.0, 16.0, 32.0):
        predicted = model.predict("speculative", "chat", 100, 1000, load, tokens=(201.0, 100.0))
        assert predicted is not None and predicted.tpot_s == pytest.approx(0.02, rel=0.1)
    low = model.predict("speculative", "chat", 100, 1000, 1.0, tokens=(201.0, 100.0))
    assert low is not None and low.tpot_s <= 0.0205  # never above the loads after it


def test_load_position_is_log_scaled_and_clipped() -> None:
    assert load_position(0) == 0 and load_position(1) == 1 and load_position(3) == 2
    assert load_position(-5) == 0 and load_position(10**9) == 11


def _compute_bound(rng: random.Random, count: int) -> list[Observation]:
    """A pool past its knee: time per token grows in proportion to the load (1 ms x load), loads seen
    anywhere from 40 to 120 (between two nodes of the curve, 63 and 127)."""
    out = []
    for _ in range(count):
        load = rng.uniform(40, 120)
        tpot = 0.001 * load * math.exp(rng.gauss(0, 0.05))
        out.append(Observation("standard", "chat", 100, load, 0.05, 0.05 + 99 * tpot, 100))
    return out


def test_the_curve_keeps_the_slope_the_observations_show() -> None:
    """Requests seen at many loads between two nodes teach how much one more request slows the pool (the
    externality that splits load), not only the mean level there."""
    learner = Learner()
    for obs in _compute_bound(random.Random(5), 2000):
        learner.observe(obs)
    model = learner.model()
    at = {load: model.predict("standard", "chat", 100, 100, load) for load in (50, 100)}
    assert at[50] is not None and at[100] is not None
    assert at[50].tpot_s == pytest.approx(0.050, rel=0.15)
    assert at[100].tpot_s == pytest.approx(0.100, rel=0.15)


def test_sharing_carries_where_the_curve_was_learned() -> None:
    teacher = Learner()
    for obs in _compute_bound(random.Random(6), 2000):
        teacher.observe(obs)
    pupil = Learner()
    pupil.absorb(teacher.export())
    for load in (50, 100):
        mine, theirs = (learner.model().predict("standard", "chat", 100, 100, load) for learner in (pupil, teacher))
        assert mine is not None and theirs is not None
        assert mine.tpot_s == pytest.approx(theirs.tpot_s, rel=0.02)


def test_a_pool_whose_speed_does_not_depend_on_load_adds_no_delay_to_others() -> None:
    """Time per token independent of load, observed with realistic noise at loads 0..40: the delay a request
    is predicted to add to the others stays small. (Read as the curve's slope at the load, the noise between
    two nearby curve points made it up to 23 % of the prediction in these seeds; the wide secant keeps it
    under 8 %.)"""
    worst = 0.0
    for seed in range(10):
        rng = random.Random(seed)
        learner = Learner()
        for _ in range(600):
            tpot = 0.02 * math.exp(rng.gauss(0, 0.3))
            learner.observe(Observation("standard", "chat", 100, rng.uniform(0, 40), 0.05, 0.05 + 99 * tpot, 100))
        model = learner.model()
        for load in range(2, 36):
            prediction = model.predict("standard", "chat", 100, 100, load)
            assert prediction is not None
            worst = max(worst, prediction.cost_s / prediction.e2e_s - 1)
    assert worst < 0.08


def _readable_prediction(model: LatencyModel, pool: str, segment: str, prompt: int, max_tokens: int, load: float,
                         objective: str) -> tuple[float, float, float, float, float]:  # fmt: skip
    """``LatencyModel.predict`` written as docs/adaptive.md states it, without the inlining."""
    found = model.pools[pool]
    expected, token_samples = model.expected_tokens(segment, max_tokens)
    seg = found.tpot_offsets.get(segment, Offset(0.0, 0.0))
    u = load_position(load)
    tpot_log, tpot_w = found.tpot.at_position(u)
    tpot = math.exp(tpot_log + seg.shrunk)
    ttft_log, ttft_w = found.ttft.at_position(u)
    shift = found.ttft_offsets[prompt_bin(prompt)].shrunk if prompt_bin(prompt) in found.ttft_offsets else 0.0
    ttft = math.exp(ttft_log + shift) if any(found.ttft.weights) else 0.0
    e2e = ttft + max(expected - 1.0, 1.0) * tpot
    if objective == "ttft":
        return ttft, e2e, tpot, ttft, ttft_w
    node = min(int(u), NODES - 2)
    slope = found.added_slope[node] * (1 - (u - node)) + found.added_slope[node + 1] * (u - node)
    cost = e2e + slope * math.exp(seg.shrunk) * expected * load
    return ttft, e2e, tpot, cost, min(tpot_w, seg.weight, token_samples)


def test_the_inlined_prediction_is_the_readable_one() -> None:
    rng = random.Random(3)
    learner = Learner()
    for obs in observations(rng, 600):
        obs.prompt_tokens = rng.choice([10, 300, 1000, 4000])  # every prompt bin learns its own offset
        learner.observe(obs)
    model = learner.model()
    assert all(len(pool.ttft_offsets) == 4 and pool.has_ttft for pool in model.pools.values())
    segments = [*model.pools["standard"].tpot_offsets, "never-seen"]
    for _ in range(400):
        pool, segment = rng.choice(POOL_NAMES), rng.choice(segments)
        prompt = rng.choice([0, 127, 128, 511, 512, 2047, 2048, 9000])
        load, max_tokens, objective = rng.choice([0.0, 0.4, 3.0, 17.5, 300.0, 5000.0]), rng.randint(1, 600), rng.choice(
            ["e2e", "ttft"])  # fmt: skip
        got = model.predict(pool, segment, prompt, max_tokens, load, objective)
        assert got is not None
        want = _readable_prediction(model, pool, segment, prompt, max_tokens, load, objective)
        assert (got.ttft_s, got.e2e_s, got.tpot_s, got.cost_s, got.samples) == pytest.approx(want, rel=1e-12)


def test_a_mix_of_acceptances_that_shifts_with_load_is_not_read_as_a_slope() -> None:
    """A speculative pool whose time per engine step does not depend on load, serving mostly high-acceptance
    code at low load and mostly low-acceptance chat when busier (what routing does): the curve stays flat,
    so no delay is charged for adding a request, and each segment's prediction follows its acceptance.
    (Against a running mean acceptance the shifting mix showed as a rise of the curve with the load.)"""
    rng = random.Random(3)
    learner = Learner()
    step_s, acceptance = 0.03, {"code": 3.5, "chat": 1.6}
    for i in range(3000):
        load = rng.uniform(0, 4) if (i // 200) % 2 else rng.uniform(10, 30)  # quiet and busy spells
        segment = "code" if (load < 5) == (rng.random() < 0.9) else "chat"
        a = acceptance[segment] * math.exp(rng.gauss(0, 0.05))
        tpot = step_s / a * math.exp(rng.gauss(0, 0.05))
        learner.observe(Observation("speculative", segment, 100, load, 0.05, 0.05 + 99 * tpot, 100, a, i * 0.01))
    model = learner.model()
    for segment, a in acceptance.items():
        for load in (2.0, 20.0):
            prediction = model.predict("speculative", segment, 100, 100, load)
            assert prediction is not None
            assert prediction.tpot_s == pytest.approx(step_s / a, rel=0.1)
            assert prediction.cost_s / prediction.e2e_s - 1 < 0.05
