"""The ``fastest`` pool target: pick the pool whose predicted latency for this request is lower.

Pure: reads the request's features, the snapshot (the learned model, each pool's load) and the rules'
``adaptive`` block. Randomness comes only from ``features.draw``, a uniform number drawn when the request's
features were extracted, so the same features and snapshot always give the same choice.

- Warm-up: while either pool has fewer than ``min_samples`` observations, :func:`choose_fastest` returns
  None and the rules below the ``fastest`` rule decide (the shipped file keeps the reference rules there).
- Split, not herd: the two pools' costs (the objective plus the delay the request adds to the others on
  the pool) are compared softly: the cheaper pool gets ``sigmoid(relative gap / split_temperature)`` of the
  draws. A clear winner takes nearly all; near the balance point of two loaded pools traffic splits, so
  several gateway replicas reading the same stale stats settle on a share instead of swinging together.
- Exploration: up to ``explore_share`` of the draws go to the other pool when its prediction is uncertain
  (few samples there) or stale, never for a request that carries an SLO header.
- SLOs: ``x-specgate-slo-ttft-ms`` / ``x-specgate-slo-e2e-ms`` pick the pool predicted to meet them with most
  headroom, else the fastest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.adaptive.content import content_of
from gateway.adaptive.model import PROMPT_BINS, LatencyModel, Prediction, prediction_for, segment_of, template_key
from gateway.features import RequestFeatures
from gateway.rules import AdaptiveConfig, RoutingRules
from gateway.snapshot import POOL_NAMES, SPECULATIVE, Snapshot, other_pool, pool_load

_BIN1, _BIN2, _BIN3 = PROMPT_BINS  # prompt_bin, inlined in the memo's key


@dataclass(slots=True)  # not frozen: made per request, and a frozen __init__ costs ~2x; never mutated
class Choice:
    pool: str
    reason: str
    predictions: tuple[Prediction, ...]
    explored: bool = False

    def __init__(self, pool: str, reason: str, predictions: tuple[Prediction, ...], explored: bool = False) -> None:
        # written out: see gateway.features.RequestFeatures.__init__
        self.pool, self.reason, self.predictions, self.explored = pool, reason, predictions, explored

    @property
    def predicted(self) -> Prediction | None:
        return prediction_for(self.predictions, self.pool)


MEMO_LIMIT = 4096  # predictions kept per model (a model lives until the next refresh, a second at most)
# A request's predicted deviations are read in steps (1/ACCEPTANCE_STEPS in log acceptance length, 2 % of
# time per token; 1/LENGTH_STEPS in log output length), so requests alike ask the memo the same question
ACCEPTANCE_STEPS = 50
LENGTH_STEPS = 20


def predictions(features: RequestFeatures, snapshot: Snapshot, rules: RoutingRules) -> tuple[Prediction, ...]:
    """Both pools' predictions for this request (empty for a pool the model has never seen).

    Each pool's prediction reads the whole prompt and what the pool's chosen replica is expected to hold of it
    where the gateway saw that (``features.cached_tokens``, the prefix index), each held token saving the
    pool's learned prefill rate, so leaving the pool that holds a conversation's history costs its re-prefill.
    Memoized on the model by everything they depend on: the request's segment, template, prompt bin (and
    each pool's cached tokens, where known),
    ``max_tokens`` and ``n``, its predicted acceptance and length deviations (in steps: the predictions use
    the stepped values) or what is known of it, the objective, the externality and both pools' loads. The
    model is immutable, so a remembered answer is the one :meth:`LatencyModel.predict` would give again."""
    model = snapshot.model
    if model is None:
        return ()
    objective = features.objective or rules.objective
    externality, extra = rules.adaptive.externality, features.n - 1
    prompt = features.prompt_tokens
    size: object = 0 if prompt < _BIN1 else 1 if prompt < _BIN2 else 2 if prompt < _BIN3 else 3
    cached = features.cached_tokens
    if cached is not None:  # a prompt each pool is expected to hold part of (the prefix index)
        held = [cached.get(name, 0) for name in POOL_NAMES]
        size = (size, *held)
    else:
        held = [0] * len(POOL_NAMES)
    loads = [pool_load(snapshot, name) + extra for name in POOL_NAMES]
    truth = features.known  # only the simulator's perfect-predictor sets it: (acceptance rate, output tokens)
    rate: float | None = None
    output: int | None = None
    if truth is not None:
        rate, output = truth
    log_acceptance = None if rate is None else _known_log_acceptance(rate, snapshot, model)
    length: int | None = None  # the predictor's length deviation in steps; None: no content read
    acceptance = 0
    if rate is None or output is None:  # something to estimate (always but in the simulator)
        content = content_of(features)
        if content is not None and model.predictor is not None:
            deviation = model.predictor.estimate(content)
            acceptance = round(deviation[0] * ACCEPTANCE_STEPS)
            length = round(deviation[1] * LENGTH_STEPS)
    asked: object = (acceptance, length) if truth is None else (log_acceptance, output, acceptance, length)
    key = (features.task, features.copy, features.template, size, features.max_tokens, asked, objective, externality,
           *loads)  # fmt: skip
    memo = model.memo
    found = memo.get(key)
    if found is not None:
        return found
    segment = segment_of(features.task, features.copy)
    template = template_key(segment, features.template)
    if output is None:
        # both pools'; the length deviation centred on the segment's (fixed per model: the memo key holds it), and
        # none where no content was read (the segment's lengths as they are)
        centred = 0.0 if length is None else model.length_deviation(segment, length / LENGTH_STEPS)
        tokens = model.expected_tokens(segment, features.max_tokens, centred)
    else:
        tokens = (float(min(output, features.max_tokens)), math.inf)
    # a known acceptance replaces segment, template and content (None: the draft length not known yet, and the
    # segment's stands); an unknown one is estimated
    shift = acceptance / ACCEPTANCE_STEPS if rate is None else 0.0
    out = []
    for name, load, other_load, cached_here in zip(POOL_NAMES, loads, loads[::-1], held, strict=True):
        prediction = model.predict(
            name, segment, prompt, features.max_tokens, load, objective, externality, tokens, template, shift,
            log_acceptance, other_load, cached_here,
        )  # fmt: skip
        if prediction is not None:
            out.append(prediction)
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    memo[key] = found = tuple(out)
    return found


def _known_log_acceptance(rate: float, snapshot: Snapshot, model: LatencyModel) -> float | None:
    """A known per-token acceptance ``rate`` (only the simulator's perfect-predictor knows it) as the log
    acceptance length on the speculative pool: ``(1 - a^(k+1)) / (1 - a)`` tokens a step, with ``k`` the
    speculative pool's draft length as its counters tell it (drafted tokens per draft), else as the largest
    acceptance length it reported; None where the draft length is not known yet."""
    pool = snapshot.pool(SPECULATIVE)
    k = 0  # an int, as round() and ceil() give it (mypyc keeps int and float apart)
    if pool.acceptance_rate and pool.acceptance_length:
        k = round((pool.acceptance_length - 1.0) / pool.acceptance_rate)
    else:
        found = model.pools.get(SPECULATIVE)
        k = math.ceil(found.acceptance_max - 1.0 - 1e-9) if found is not None else 0
    if k < 1:
        return None
    steps = k + 1.0 if rate >= 1.0 else (1.0 - rate ** (k + 1)) / (1.0 - max(rate, 0.0))
    return math.log(steps)


def is_warm(snapshot: Snapshot, config: AdaptiveConfig) -> bool:
    model = snapshot.model
    if model is None:
        return False
    pools, least = model.pools, config.min_samples
    for name in POOL_NAMES:  # a loop, not all(genexpr): once per request
        found = pools.get(name)
        if found is None or found.samples < least:
            return False
    return True


def choose_fastest(features: RequestFeatures, snapshot: Snapshot, rules: RoutingRules) -> Choice | None:
    """The faster pool for this request, or None while the model is warming up."""
    config = rules.adaptive
    if not is_warm(snapshot, config):
        return None
    preds = predictions(features, snapshot, rules)
    if len(preds) < 2:
        return None
    if features.slo_ttft_ms or features.slo_e2e_ms:
        slo = _slo_choice(features, preds)
        if slo is not None:
            return Choice(slo.pool, "fastest: slo", preds)
    if model_shares_hardware(snapshot):
        home = _one_device_memo(features, snapshot, rules, preds)
        if home is not None:
            return Choice(home, "fastest: one device", preds)
    first, second = preds
    gap = (second.cost_s - first.cost_s) / max(first.cost_s + second.cost_s, 1e-9)
    temperature = config.split_temperature * unseen_share(snapshot)
    # temperature 0: every request on the pools is this gateway's own, counted as it is sent: no one to herd with
    share_first = _sigmoid(gap / temperature) if temperature > 1e-9 else 1.0 if gap > 0 else 0.0 if gap < 0 else 0.5
    draw = features.draw
    explore = config.explore_share
    if draw < explore:
        pool = first.pool if share_first >= 0.5 else second.pool
        alternative = other_pool(pool)
        if _uncertain(snapshot, alternative, preds, config, segment_of(features.task, features.copy)):
            return Choice(alternative, "fastest: explore", preds, explored=True)
        draw = draw / explore
    else:
        draw = (draw - explore) / (1.0 - explore)
    pool = first.pool if draw < share_first else second.pool
    return Choice(pool, "fastest", preds)


def model_shares_hardware(snapshot: Snapshot) -> bool:
    """Whether the model learned that the pools slow each other (a cross term above 0: one device)."""
    model = snapshot.model
    return model is not None and bool(model.other_cross)


def _one_device_memo(
    features: RequestFeatures, snapshot: Snapshot, rules: RoutingRules, preds: tuple[Prediction, ...]
) -> str | None:  # fmt: skip
    """:func:`_one_device`, remembered per predictions tuple: the predictions memo hands requests alike the same
    tuple, and the answer depends on nothing else but the loads, which are in that memo's key. The tuple is
    kept beside the answer, so a reused ``id`` is never mistaken for it."""
    model = snapshot.model
    assert model is not None
    memo = model.device_memo
    found = memo.get(id(preds))
    if found is not None and found[0] is preds:
        return found[1]
    home = _one_device(features, snapshot, rules, preds)
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    memo[id(preds)] = (preds, home)
    return home


def _one_device(
    features: RequestFeatures, snapshot: Snapshot, rules: RoutingRules, preds: tuple[Prediction, ...]
) -> str | None:  # fmt: skip
    """On pools that share a device, a request-by-request split cannot see what it costs: one more request on a
    pool that is already busy adds nothing to the other's slowdown, so no request lets a pool drain. Here
    the pool that would serve this request best with all the traffic and the other pool idle (its prediction
    at both pools' loads together, no slowdown) is compared with the split as it stands; when it is cheaper
    than either pool's split cost, the request goes there (and the other pool drains)."""
    model = snapshot.model
    assert model is not None
    extra = features.n - 1
    total = sum(pool_load(snapshot, name) for name in POOL_NAMES) + extra
    segment = segment_of(features.task, features.copy)
    template = template_key(segment, features.template)
    objective = features.objective or rules.objective
    best, best_cost = None, min(p.cost_s for p in preds)
    for prediction in preds:
        alone = model.predict(
            prediction.pool, segment, features.prompt_tokens, features.max_tokens, total, objective,
            rules.adaptive.externality, (prediction.output_tokens, math.inf), template,
            cached=features.cached_on(prediction.pool),
        )  # fmt: skip
        if alone is not None and alone.cost_s < best_cost:
            best, best_cost = prediction.pool, alone.cost_s
    return best


def unseen_share(snapshot: Snapshot) -> float:
    """The share of the pools' requests, as the engines last reported them, that this gateway did not send:
    what other gateway replicas are doing, which this one sees only a scrape late. It scales the split's
    temperature. A gateway whose own requests are all the engines run sees every booking at once, so its
    choices move the loads it reads and it cannot herd: it sends each request to the cheaper pool. Replicas
    that cannot see each other's newest requests split near balance, the more so the more traffic is theirs.
    Without engine stats nothing tells them apart: the whole temperature. With ``gateways`` known (Redis),
    at least ``1 - 1 / gateways``."""
    engine = own = 0.0
    for name in POOL_NAMES:  # a loop with early return: once per decision
        pool = snapshot.pools.get(name)
        if pool is None or pool.running is None:
            return 1.0
        engine += pool.running + (pool.waiting or 0.0)
        own += pool.inflight_base
    share = 1.0 - own / engine if engine > own else 0.0
    gateways = snapshot.gateways
    if gateways > 1 and share < 1.0 - 1.0 / gateways:
        share = 1.0 - 1.0 / gateways
    return share


def explore_during_warmup(
    features: RequestFeatures, snapshot: Snapshot, rules: RoutingRules, pool: str
) -> bool:  # fmt: skip
    """While warming up, send up to ``explore_share`` of requests to the pool the rules did not pick,
    when the model knows too little about it, so that both pools get samples."""
    if features.draw >= rules.adaptive.explore_share or features.slo_ttft_ms or features.slo_e2e_ms:
        return False
    model = snapshot.model
    return model is None or model.samples(other_pool(pool)) < rules.adaptive.min_samples


def _uncertain(
    snapshot: Snapshot, pool: str, preds: tuple[Prediction, ...], config: AdaptiveConfig, segment: str
) -> bool:  # fmt: skip
    """Whether ``pool``'s prediction for this request is worth refreshing: few samples behind it, the pool
    not observed for ``stale_s``, or this request's segment not seen on that pool for ``stale_s`` (traffic of
    the segment went to the other pool, so what the model believes about it there is getting old)."""
    model = snapshot.model
    assert model is not None
    found = model.pools.get(pool)
    if found is None:
        return True
    prediction = prediction_for(preds, pool)
    if prediction is None or prediction.samples < config.min_cell_samples:
        return True
    last = found.last_observed_s
    if last is None or model.built_s - last > config.stale_s:
        return True
    seen = found.segment_seen.get(segment)
    return seen is not None and model.built_s - seen > config.stale_s


def _slo_choice(features: RequestFeatures, preds: tuple[Prediction, ...]) -> Prediction | None:
    if not features.slo_ttft_ms and not features.slo_e2e_ms:
        return None
    best, best_headroom = None, -math.inf
    for prediction in preds:
        headroom = math.inf
        if features.slo_ttft_ms:
            headroom = min(headroom, 1.0 - prediction.ttft_s * 1000 / features.slo_ttft_ms)
        if features.slo_e2e_ms:
            headroom = min(headroom, 1.0 - prediction.e2e_s * 1000 / features.slo_e2e_ms)
        if headroom >= 0 and headroom > best_headroom:
            best, best_headroom = prediction, headroom
    return best


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-min(x, 60.0)))
    z = math.exp(max(x, -60.0))
    return z / (1.0 + z)
