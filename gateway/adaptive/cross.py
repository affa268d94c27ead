"""The cross term of a pool that shares hardware with the other: how its log time per token moves with the
other pool's busyness, learned with a guard so that pools on separate hardware keep 0 (used by
:mod:`gateway.adaptive.learner`; docs/adaptive.md, "Pools that share hardware")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gateway.adaptive.model import busy

CROSS_DECAY = 0.0005  # the cross term's sums fade by this per observation (~2,000 requests: hardware is fixed)
CROSS_MIN_SAMPLES = 30.0  # effective observations before a cross term can be used
CROSS_MIN_SPREAD = 10.0  # and this much spread in the other pool's busyness (squared deviations: about the
# observations on the rarer side, busy or idle): nearly all at one value, a few points would decide it
CROSS_Z = 3.0  # the cross term used is its estimate less this many standard errors (0 when that is below 0)
CROSS_MAX = 1.5  # and at most this (e^1.5: a pool 4.5x slower while the other works)
# Declared by the operator (rules `adaptive.shared_device`): both pools time-slice one device, so a pool runs about
# half as fast while the other works. The term starts from this prior and the data move it as their standard
# error allows (a normal prior: log 2 +- 0.35, i.e. 1.4x-2.8x at one standard deviation).
SHARED_PRIOR = math.log(2.0)
SHARED_PRIOR_SD = 0.35


def other_busy_share(run_share: float | None, decision_load: float | None, gateways: int = 1) -> float | None:
    """What a request's cross term learns against: the share of its life the other pool had at least one of
    this gateway's requests (``run_share``, its bookings' clock: exact for a lone gateway). With several
    gateways the others' requests show only in the engines' counts as the decision read them
    (``decision_load``, read through :func:`~gateway.adaptive.model.busy`): at least that."""
    if run_share is None:
        return None if decision_load is None else busy(decision_load)
    if gateways > 1 and decision_load is not None:
        return max(run_share, busy(decision_load))
    return run_share


@dataclass
class Cross:
    """How a pool's log time per token moves with the other pool's load: a least-squares fit of the residual
    ``y`` (the per-token prediction's error with the cross term put back) on ``(1, u, x)`` -- ``u`` the pool's
    own load position, ``x`` the other pool's busyness -- over sums that fade by CROSS_DECAY per observation. The own
    load is in the fit because both loads rise together with traffic: a misfit of the own load curve must not
    read as the other pool's doing.

    ``used`` is what predictions and the curve's targets apply: the estimate less CROSS_Z standard errors,
    never below 0, and 0 until CROSS_MIN_SAMPLES effective observations with the other pool's load varying.
    On separate hardware it stays 0 and nothing changes."""

    sums: list[float] = field(default_factory=lambda: [0.0] * 10)  # n, u, x, y, uu, ux, xx, uy, xy, yy
    used: float = 0.0
    last_fit: tuple[float, float, float] | None = None  # as of the last refresh: estimate, standard error, spread
    last_declared: bool = False  # the last refresh had the operator's declaration (a kept value is then its own)

    def step(self, u: float, x: float, y: float) -> None:
        keep = 1.0 - CROSS_DECAY
        s = self.sums
        for i, value in enumerate((1.0, u, x, y, u * u, u * x, x * x, u * y, x * y, y * y)):
            s[i] = s[i] * keep + value

    def estimate(self) -> tuple[float, float] | None:
        """The fitted coefficient of ``x`` and its standard error, or None where the data cannot tell."""
        n, su, sx, sy, suu, sux, sxx, suy, sxy, syy = self.sums
        if n < CROSS_MIN_SAMPLES:
            return None
        # centred sums: the intercept solved out
        cuu, cux, cxx = suu - su * su / n, sux - su * sx / n, sxx - sx * sx / n
        cuy, cxy, cyy = suy - su * sy / n, sxy - sx * sy / n, syy - sy * sy / n
        det = cuu * cxx - cux * cux
        if cxx < CROSS_MIN_SPREAD or det <= 1e-6 * cuu * cxx:  # it barely moved, or moved only with the own load
            return None
        beta_u = (cxx * cuy - cux * cxy) / det
        beta_x = (cuu * cxy - cux * cuy) / det
        residual = cyy - beta_u * cuy - beta_x * cxy
        variance = max(residual, 0.0) / max(n - 3.0, 1.0)
        return beta_x, math.sqrt(variance * cuu / det)

    def refresh(self, declared: bool = False) -> float:
        """Sets ``used`` from the data, or keeps it while the data cannot tell (hardware does not change: a
        policy that learned to keep one pool idle, or both pools busy for a long time, leaves the other pool's
        busyness without spread; the term is not forgotten for that). Before CROSS_MIN_SAMPLES: 0.

        ``declared`` (the operator says the pools share one device): the term is :data:`SHARED_PRIOR` until the
        data can tell, then the prior and the estimate weighted by their precisions (no discount: the coupling
        is known to exist, only its size is learned)."""
        found = self.estimate()
        self.last_fit = None
        if found is not None:
            n, sx, sxx = self.sums[0], self.sums[2], self.sums[6]
            self.last_fit = (*found, sxx - sx * sx / n)
            if declared:
                prior_w, data_w = SHARED_PRIOR_SD**-2, max(found[1], 1e-6) ** -2
                posterior = (SHARED_PRIOR * prior_w + found[0] * data_w) / (prior_w + data_w)
                self.used = min(max(posterior, 0.0), CROSS_MAX)
            else:
                self.used = min(max(found[0] - CROSS_Z * found[1], 0.0), CROSS_MAX)
        elif declared:
            self.used = self.used if self.last_declared else SHARED_PRIOR
        elif self.sums[0] < CROSS_MIN_SAMPLES:
            self.used = 0.0
        self.last_declared = declared
        return self.used
