"""The arithmetic of the critical batch size (pure: numpy and scipy, no MLflow, no Ray).

Steps to a target are read from a monotone fit of a loss curve (isotonic regression: no window
to choose, so no constant moves the crossing). The empirical model of McCandlish et al. (2018),
S = S_min + E_min / B = S_min (1 + B_crit / B), is fitted to the steps S_j of each batch size
B_j in log steps (seed noise is multiplicative), weighted by each point's seed spread, by
profiling B_crit over a log grid (S_min then has a closed form), so B_crit = 0 or infinity are
edges of the grid, never a division by zero. Everything that takes a vector of points also takes
a matrix of bootstrap resamples, one per row. The best over learning rate at one batch size is
orchestrator/analysis/lr_optimum.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
from scipy import optimize, stats

GRID_DECADES = 3.0
"""The profile grid reaches this many decades below the smallest and above the largest B."""
GRID_POINTS_PER_DECADE = 80


# ---------------------------------------------------------------- curves


def monotone(tokens: Sequence[float], losses: Sequence[float]) -> Tuple[np.ndarray, np.ndarray]:
    """The non-increasing least-squares fit of a loss curve, as (positions, values) of its
    blocks: each block of pooled points sits at the mean position of its points, so that linear
    interpolation between blocks is a continuous, strictly decreasing curve."""
    t = np.asarray(tokens, np.float64)
    y = np.asarray(losses, np.float64)
    if t.shape != y.shape or t.ndim != 1 or not len(t):
        raise ValueError(f"tokens and losses must be equal-length non-empty 1-d sequences, got {t.shape}, {y.shape}")
    fit = optimize.isotonic_regression(y, increasing=False)
    starts = np.asarray(fit.blocks[:-1])
    counts = np.diff(fit.blocks)
    centres = np.add.reduceat(t, starts) / counts
    return centres, fit.x[starts]


def value_at(curve: Tuple[np.ndarray, np.ndarray], tokens: float) -> float:
    """The monotone fit at `tokens` (flat beyond its first and last block)."""
    return float(np.interp(tokens, *curve))


def first_crossing(curve: Tuple[np.ndarray, np.ndarray], level: float) -> Optional[float]:
    """Tokens at which a monotone fit first reaches `level`, or None."""
    positions, values = curve
    hits = np.flatnonzero(values <= level)
    if not len(hits):
        return None
    i = int(hits[0])
    if i == 0:  # at or below the level from the first block on
        return float(positions[0])
    frac = (values[i - 1] - level) / (values[i - 1] - values[i])
    return float(positions[i - 1] + frac * (positions[i] - positions[i - 1]))


def smooth(tokens: Sequence[float], values: Sequence[float], width: float) -> np.ndarray:
    """Centred moving average over `width` tokens (points within width / 2 on either side); for
    the sensitivity benchmark, which pre-smooths curves to show the monotone fit needs none."""
    t, v = np.asarray(tokens, np.float64), np.asarray(values, np.float64)
    if width <= 0:
        return v
    lo = np.searchsorted(t, t - width / 2, side="left")
    hi = np.searchsorted(t, t + width / 2, side="right")
    cum = np.concatenate([[0.0], np.cumsum(v)])
    return (cum[hi] - cum[lo]) / (hi - lo)


# ---------------------------------------------------------------- the fit


@dataclass
class Fit:
    """S = S_min (1 + B_crit / B) fitted in log steps, per row."""

    s_min: np.ndarray
    b_crit: np.ndarray
    sse: np.ndarray
    """Weighted sum of squared residuals of log steps (chi-square when the weights are 1 / variance)."""
    at_grid_edge: np.ndarray
    """-1: B_crit at the low end of the profile grid (S does not fall with B); 1: the high end (S ~ 1/B)."""

    @property
    def e_min(self) -> np.ndarray:
        return self.s_min * self.b_crit


def profile_grid(batches: Sequence[float]) -> np.ndarray:
    lo, hi = math.log10(min(batches)) - GRID_DECADES, math.log10(max(batches)) + GRID_DECADES
    return np.logspace(lo, hi, int(round((hi - lo) * GRID_POINTS_PER_DECADE)) + 1)


def fit(batches: Sequence[float], steps: np.ndarray, weights: Optional[Sequence[float]] = None) -> Fit:
    """Weighted least squares of log S_j = log S_min + log(1 + B_crit / B_j) over rows of `steps`
    [..., J]: B_crit by profiling over a log grid and a parabola through the best three grid
    points, S_min in closed form at each B_crit."""
    b = np.asarray(batches, np.float64)
    if b.ndim != 1 or len(np.unique(b)) < 2 or np.any(b <= 0):
        raise ValueError(f"need at least two distinct positive batch sizes, got {list(b)}")
    y = np.log(np.asarray(steps, np.float64))
    if y.shape[-1] != len(b) or not np.isfinite(y).all():
        raise ValueError("steps must be positive and finite, one per batch size")
    w = np.ones(len(b)) if weights is None else np.asarray(weights, np.float64)
    grid = profile_grid(b)
    z = np.log1p(grid[:, None] / b[None, :])  # [G, J]
    sw = w.sum()

    def centred(v):  # minus its weighted mean over the batch sizes
        return v - ((v * w).sum(-1) / sw)[..., None]

    # SSE about the weighted mean, for every grid point at once: with y and z centred,
    # sum w (y - z)^2 = sum w y^2 - 2 (w y) . z + sum w z^2, one matrix product for all rows.
    yc, zc = centred(y), centred(z)
    sse = ((yc**2 * w).sum(-1))[..., None] - 2 * (yc * w) @ zc.T + (zc**2 * w).sum(-1)  # [..., G]
    g = np.argmin(sse, axis=-1)
    gi = np.clip(g, 1, len(grid) - 2)
    u = np.log(grid)
    s0, s1, s2 = (np.take_along_axis(sse, (gi + d)[..., None], -1)[..., 0] for d in (-1, 0, 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        step = u[1] - u[0]
        shift = 0.5 * step * (s0 - s2) / (s0 - 2 * s1 + s2)
    shift = np.where((g == gi) & np.isfinite(shift) & (np.abs(shift) <= step), shift, 0.0)
    b_crit = np.exp(u[g] + shift)
    r = y - np.log1p(b_crit[..., None] / b)
    mean = (r * w).sum(-1) / sw
    best_sse = ((r - mean[..., None]) ** 2 * w).sum(-1)
    edge = np.where(g == 0, -1, np.where(g == len(grid) - 1, 1, 0))
    return Fit(np.exp(mean), b_crit, best_sse, edge)


def lack_of_fit(sse: float, points: int, pure_error_dof: int) -> Optional[float]:
    """p-value of the fit's weighted residuals against the replicates' own spread: with weights
    1 / (variance of each point's mean), sse / (points - 2) is F(points - 2, dof) distributed when
    the hyperbola describes the points. None without the degrees of freedom to test."""
    if points <= 2 or pure_error_dof < 1 or not math.isfinite(sse):
        return None
    return float(stats.f.sf(sse / (points - 2), points - 2, pure_error_dof))


def widening(sse: float, points: int) -> float:
    """How much wider the seeds' interval must be to hold the points' scatter about the fit: the
    square root of the reduced chi-square, sse / (points - 2) with weights 1 / variance, where it
    exceeds 1 (Birge's ratio, the Particle Data Group's scale factor), else 1. Where the hyperbola
    is not the curves' shape, or the reading is biased by batch size, the scatter across batch
    sizes grows and the interval with it, instead of only a test failing."""
    if points <= 2 or not math.isfinite(sse):
        return 1.0
    return max(1.0, math.sqrt(sse / (points - 2)))


def widened(boot: np.ndarray, centre: float, factor: float) -> np.ndarray:
    """Bootstrap values spread `factor` times as far from `centre` in log."""
    return np.exp(math.log(centre) + factor * (np.log(boot) - math.log(centre)))


def slope(xs: Sequence[float], ys: np.ndarray) -> np.ndarray:
    """Least-squares slope of log y on log x, per row of ys [..., n]."""
    x = np.log(np.asarray(xs, np.float64))
    y = np.log(np.asarray(ys, np.float64))
    xc = x - x.mean()
    return ((y - y.mean(-1, keepdims=True)) * xc).sum(-1) / (xc**2).sum()


INTERVAL_LEVEL = 0.9
"""The report's intervals hold the middle 90% of the bootstrap."""


def percentile_interval(values: np.ndarray, level: float = INTERVAL_LEVEL) -> Tuple[float, float]:
    """The middle `level` of the bootstrap values, ranked (infinities count as the largest or smallest)."""
    v = np.sort(np.asarray(values, np.float64)[~np.isnan(values)])
    tail = (1 - level) / 2
    lo, hi = tail * (len(v) - 1), (1 - tail) * (len(v) - 1)
    return float(v[int(math.floor(lo + 1e-9))]), float(v[int(math.ceil(hi - 1e-9))])
