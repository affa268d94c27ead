"""The learner's mutable state: cells, load curves and each pool's state (:mod:`gateway.adaptive.learner`
updates them and freezes them into :mod:`gateway.adaptive.model`'s immutable objects)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from gateway.adaptive.cross import Cross
from gateway.adaptive.model import NODES, Curve

INITIAL_VAR = 0.25  # log-seconds squared before any residual is seen (sigma 0.5, a factor of 1.65)
MERGE_DISTANCE = 0.5  # curve points nearer than this (in log2(1 + load)) are one point
TEMPLATES = 1024  # per pool: the system-prompt templates whose residuals are kept (least recently seen go first)
SLOPE_PRIOR_WEIGHT = 0.2  # the slope's prior counts as this much squared deviation (a few observations)
SLOPE_DECAY = 0.01  # the slope's sums fade by this per observation: it follows the traffic
TREND_PRIOR_WEIGHT = 0.2  # a trend's prior (0) counts as this much spread of x (PoolState.prefill: 0.45k tokens once)
TREND_DECAY = 0.01  # a trend's sums fade by this per observation
_K = TypeVar("_K", int, str)


@dataclass
class Cell:
    value: float = 0.0
    weight: float = 0.0

    def step(self, target: float, share: float, floor: float, cap: float) -> None:
        if share <= 0:
            return
        weight = self.weight
        rate = 1.0 / (weight + 1.0)  # max() and min() as conditionals: twice or more per observation
        rate = (floor if floor > rate else rate) * share
        self.value += rate * (target - self.value)
        weight += share
        self.weight = cap if cap < weight else weight


@dataclass
class Slope:
    """A regression through 0 of a pool's log-tpot residual on the request's predicted deviation, shrunk to
    a prior: ``(sum d t + W prior) / (sum d^2 + W)``, the sums fading by SLOPE_DECAY per observation."""

    dt: float = 0.0
    dd: float = 0.0

    def value(self, prior: float) -> float:
        return (self.dt + SLOPE_PRIOR_WEIGHT * prior) / (self.dd + SLOPE_PRIOR_WEIGHT)

    def step(self, deviation: float, residual: float) -> None:
        keep = 1.0 - SLOPE_DECAY
        self.dt = self.dt * keep + deviation * residual
        self.dd = self.dd * keep + deviation * deviation


@dataclass
class Trend:
    """A least-squares slope with an intercept, ``sum (x - mean x)(y - mean y) / (sum (x - mean x)^2 + W)``
    (shrunk towards 0 by W = TREND_PRIOR_WEIGHT), the sums fading by TREND_DECAY per observation.

    The intercept takes any constant bias of ``y`` (a residual over a model that is itself still learning),
    so the slope reads only how ``y`` moves with ``x``."""

    n: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def step(self, x: float, y: float) -> None:
        keep = 1.0 - TREND_DECAY
        self.n = self.n * keep + 1.0
        self.x = self.x * keep + x
        self.y = self.y * keep + y
        self.xx = self.xx * keep + x * x
        self.xy = self.xy * keep + x * y

    @property
    def spread(self) -> float:
        """The centred sum of squares of ``x``: the evidence behind the slope."""
        return self.xx - self.x * self.x / self.n if self.n > 0 else 0.0

    def value(self) -> float:
        if self.n <= 0:
            return 0.0
        return (self.xy - self.x * self.y / self.n) / (self.spread + TREND_PRIOR_WEIGHT)

    def take(self, slope: float, spread: float) -> None:
        """Set the slope (learned elsewhere and blended) keeping the spread of ``x`` this one saw, or taking
        ``spread`` when it saw none."""
        if self.spread <= 0:
            self.n, self.x, self.y, self.xx = 1.0, 0.0, 0.0, spread
        self.xy = slope * (self.spread + TREND_PRIOR_WEIGHT) + self.x * self.y / self.n


@dataclass
class CurveState:
    values: list[float] = field(default_factory=lambda: [0.0] * NODES)
    weights: list[float] = field(default_factory=lambda: [0.0] * NODES)
    # where each node's observations lie on average (in log2(1 + load)): a node's value belongs there
    positions: list[float] = field(default_factory=lambda: [float(i) for i in range(NODES)])
    _cache: list[float] | None = field(default=None, repr=False)

    def filled(self) -> list[float]:
        """:meth:`fill`, cached: observations learn against the curve as it was at the last refresh (every
        learner.REFILL_EVERY observations, every freeze, and when a node is seen for the first time). This keeps
        :meth:`Learner.observe` at a few microseconds."""
        if self._cache is None:
            self._cache = self.fill()
        return self._cache

    def refresh(self) -> None:
        self._cache = None

    def fill(self) -> list[float]:
        """The curve's value at every node: the line through the visited nodes' (position, value) points,
        flat below the first, continued beyond the last with the slope of the last two (never falling);
        then made non-decreasing.

        A node's value is the mean of the observations near it, and its position is where they lay: when
        requests were seen at loads between two nodes, the value belongs there, not at the node. Drawing the
        line through those points keeps the slope the observations show (how much one more request slows
        the pool down, which is what splits load between the pools); reading each value at its own node
        would flatten every interval in which requests were seen at one load only.
        """
        points = self._points()
        if len(points) <= 1:
            return [points[0][1] if points else 0.0] * NODES
        out = [0.0] * NODES
        k, last = 0, len(points) - 1
        for i in range(NODES):
            u = float(i)
            if u <= points[0][0]:
                out[i] = points[0][1]
                continue
            while k < last - 1 and u > points[k + 1][0]:
                k += 1
            p0, v0, _ = points[k]
            p1, v1, _ = points[k + 1]
            slope = (v1 - v0) / (p1 - p0)
            out[i] = v0 + slope * (u - p0) if u <= p1 else v1 + max(slope, 0.0) * (u - p1)
        for i in range(1, NODES):
            out[i] = max(out[i], out[i - 1])
        return out

    def _points(self) -> list[tuple[float, float, float]]:
        """(position, value, weight) of the visited nodes in position order, points closer than
        MERGE_DISTANCE merged by weight (their difference says nothing about a slope)."""
        raw = sorted((self.positions[i], self.values[i], w) for i, w in enumerate(self.weights) if w > 0)
        points: list[tuple[float, float, float]] = []
        for position, value, weight in raw:
            if points and position - points[-1][0] < MERGE_DISTANCE:
                p, v, w = points[-1]
                total = w + weight
                points[-1] = ((p * w + position * weight) / total, (v * w + value * weight) / total, total)
            else:
                points.append((position, value, weight))
        return monotone(points)

    def predict(self, u: float, filled: list[float]) -> float:
        """The filled curve at load position ``u`` (:func:`load_position`, computed once per observation)."""
        i = min(int(u), NODES - 2)
        f = u - i
        return filled[i] * (1 - f) + filled[i + 1] * f

    def step(self, u: float, target: float, floor: float, cap: float) -> float:
        """Move the two nodes around load position ``u`` towards ``target``, each by its share of the observation;
        returns the error of the interpolated prediction before the step.

        Each node is a running average of the observations near it (soft binning), not a coefficient of
        the interpolation: a node between two observed loads is then never left underdetermined. The node's
        position is the same running average of where those observations lay (see :meth:`fill`).
        """
        filled = self.filled()
        i = int(u)
        if i > NODES - 2:
            i = NODES - 2
        f = u - i
        error = target - (filled[i] * (1 - f) + filled[i + 1] * f)
        values, weights, positions = self.values, self.weights, self.positions
        for j, share in ((i, 1.0 - f), (i + 1, f)):
            if share <= 1e-9:
                continue
            weight = weights[j]
            if weight <= 0:
                values[j], positions[j] = target, u
                self._cache = None  # a new node: the neighbours' fill changes
            else:  # min(max(share / (weight + share), floor * share), 1.0), as conditionals
                rate = share / (weight + share)
                least = floor * share
                if least > rate:
                    rate = least
                if rate > 1.0:
                    rate = 1.0
                values[j] += rate * (target - values[j])
                positions[j] += rate * (u - positions[j])
            weight += share
            weights[j] = cap if cap < weight else weight
        return error

    def freeze(self) -> Curve:
        self._cache = None
        return Curve(tuple(self.filled()), tuple(self.weights))


@dataclass
class PoolState:
    ttft: CurveState = field(default_factory=CurveState)
    tpot: CurveState = field(default_factory=CurveState)
    ttft_offsets: dict[int, Cell] = field(default_factory=dict)
    tpot_offsets: dict[str, Cell] = field(default_factory=dict)
    acceptance: dict[str, Cell] = field(default_factory=dict)
    # per "segment#template": what the template's requests leave over after the segment's tpot offset (in the
    # offset's units), least recently seen first, at most TEMPLATES
    templates: dict[str, Cell] = field(default_factory=dict)
    mean_log_acceptance: Cell = field(default_factory=Cell)
    ttft_var: float = INITIAL_VAR
    tpot_var: float = INITIAL_VAR
    samples: float = 0.0
    last_observed_s: float | None = None
    segment_seen: dict[str, float] = field(default_factory=dict)  # the clock at each segment's last step
    slope: Slope = field(default_factory=Slope)
    acceptance_max: float = 0.0  # the largest acceptance length reported
    cross: Cross = field(default_factory=Cross)
    # seconds a thousand prompt tokens held in the replica's prefix cache save of the first token's time: the
    # trend of the whole prompt's predicted time less the time seen, on the thousands held (requests whose
    # expected hit the gateway read, none held included)
    prefill: Trend = field(default_factory=Trend)

    @property
    def slope_prior(self) -> float:
        return -1.0 if self.mean_log_acceptance.weight > 0 else 0.0


def monotone(points: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """The points with their values replaced by the weighted least-squares non-decreasing fit (pool
    adjacent violators): a point above the next is averaged with it, by weight, until no point is; each
    point keeps its position and weight. A light point at a low load with a high value (one slow request
    seen there) thus barely moves the well-known points after it, where a running maximum would have lifted
    the whole curve above it to its value."""
    blocks: list[list[float]] = []  # [value, weight, points in the block]
    for _, value, weight in points:
        blocks.append([value, weight, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks[-1]
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    values = [v for v, _, n in blocks for _ in range(int(n))]
    return [(position, value, weight) for (position, _, weight), value in zip(points, values, strict=True)]


def cell_of(cells: dict[_K, Cell], key: _K) -> Cell:
    """``cells[key]``, made on first use (without building a throw-away default on every call)."""
    cell = cells.get(key)
    if cell is None:
        cell = cells[key] = Cell()
    return cell


def template_cell(cells: dict[str, Cell], key: str) -> Cell:
    """``cells[key]`` (made on first use) moved to the most recently seen end; past TEMPLATES, the least
    recently seen template is dropped: request data keys this table, so it must stay bounded."""
    cell = cells.pop(key, None)
    if cell is None:
        cell = Cell()
        if len(cells) >= TEMPLATES:
            del cells[next(iter(cells))]
    cells[key] = cell
    return cell
