"""Gradient noise scale and critical batch size (McCandlish et al. 2018, arXiv 1812.06162).

For a batch of B tokens, the per-token-mean gradient G_B has E|G_B|^2 = |G|^2 + tr(Sigma) / B,
with G the true gradient and Sigma the per-token gradient covariance. Two batch sizes give two
equations and so unbiased estimates of both unknowns (DESIGN.md section 5):

    |G|^2 ~= (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    S     ~= (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)
    B_simple = S / |G|^2          (ratio of separately smoothed estimates, never averaged ratios)

The critical batch size from a sweep fits S_j = S_min + E_min / B_j (optimizer steps S_j and
tokens E_j = S_j B_j to reach a target loss) and takes B_crit = E_min / S_min.

Pure math on Python floats and numpy: no torch, Ray, DeepSpeed or MLflow.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence, Tuple

import numpy as np


def estimate(small_sq_norm_mean: float, b_small: float, big_sq_norm: float, b_big: float) -> Tuple[float, float]:
    """Unbiased (|G|^2, tr(Sigma)) from the mean squared norm of small-batch (b_small tokens)
    per-token-mean gradients and the squared norm of the big-batch (b_big tokens) gradient.

    Either estimate may come out negative on one update (it is a difference of noisy numbers);
    smooth before dividing (NoiseScaleEMA).
    """
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
    g_squared = (b_big * big_sq_norm - b_small * small_sq_norm_mean) / (b_big - b_small)
    trace_sigma = (small_sq_norm_mean - big_sq_norm) / (1.0 / b_small - 1.0 / b_big)
    return float(g_squared), float(trace_sigma)


class NoiseScaleEMA:
    """Separate bias-corrected EMAs of |G|^2 and tr(Sigma); B_simple is their ratio.

    Bias correction (as in Adam) divides by 1 - decay^n, so the first value is the first input
    rather than (1 - decay) times it. A non-finite input (e.g. from an overflowed fp16 step) is
    skipped, so one bad update cannot poison the average.
    """

    def __init__(self, decay: float):
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self._g_squared = 0.0
        self._trace_sigma = 0.0
        self.count = 0

    def update(self, g_squared: float, trace_sigma: float) -> None:
        if not (math.isfinite(g_squared) and math.isfinite(trace_sigma)):
            return
        self._g_squared = self.decay * self._g_squared + (1 - self.decay) * g_squared
        self._trace_sigma = self.decay * self._trace_sigma + (1 - self.decay) * trace_sigma
        self.count += 1

    def _corrected(self, raw: float) -> Optional[float]:
        return raw / (1 - self.decay**self.count) if self.count else None

    @property
    def g_squared(self) -> Optional[float]:
        return self._corrected(self._g_squared)

    @property
    def trace_sigma(self) -> Optional[float]:
        return self._corrected(self._trace_sigma)

    @property
    def b_simple(self) -> Optional[float]:
        """ema(tr(Sigma)) / ema(|G|^2) in tokens; None before the first update or while ema(|G|^2) <= 0."""
        g2, s = self.g_squared, self.trace_sigma
        if g2 is None or s is None or g2 <= 0:
            return None
        return s / g2

    def state_dict(self) -> Dict[str, float]:
        """Plain floats, for a checkpoint's client state."""
        return {"decay": self.decay, "g_squared": self._g_squared, "trace_sigma": self._trace_sigma, "count": self.count}

    def load_state_dict(self, state: Dict[str, float]) -> None:
        self.decay = float(state["decay"])
        self._g_squared = float(state["g_squared"])
        self._trace_sigma = float(state["trace_sigma"])
        self.count = int(state["count"])


# ---------------------------------------------------------------- critical batch size


def fit_critical_batch(batch_sizes: Sequence[float], steps: Sequence[float]) -> Tuple[float, float, float]:
    """(S_min, E_min, B_crit) from least squares of steps = S_min + E_min * (1/B).

    A line in x = 1/B, solved in closed form. Both coefficients must be >= 0 to mean anything
    (a negative S_min or E_min is noise): when the free fit breaks that, the best fit with the
    offending coefficient fixed at 0 is taken, which is the exact non-negative least-squares
    solution for two unknowns. B_crit = E_min / S_min (inf when S_min = 0).
    """
    b = np.asarray(batch_sizes, dtype=np.float64)
    y = np.asarray(steps, dtype=np.float64)
    if b.shape != y.shape or b.ndim != 1:
        raise ValueError(f"batch_sizes and steps must be equal-length 1-d sequences, got {b.shape} and {y.shape}")
    if np.any(b <= 0):
        raise ValueError("batch sizes must be > 0")
    if len(np.unique(b)) < 2:
        raise ValueError(f"need at least two distinct batch sizes, got {sorted(set(b.tolist()))}")
    x = 1.0 / b
    x_mean, y_mean = x.mean(), y.mean()
    e_min = float(np.sum((x - x_mean) * (y - y_mean)) / np.sum((x - x_mean) ** 2))
    s_min = float(y_mean - e_min * x_mean)
    if s_min < 0 or e_min < 0:
        candidates = [(0.0, max(float(np.dot(x, y) / np.dot(x, x)), 0.0)), (max(float(y_mean), 0.0), 0.0)]
        s_min, e_min = min(candidates, key=lambda c: float(np.sum((c[0] + c[1] * x - y) ** 2)))
    if s_min > 0:
        b_crit = e_min / s_min
    else:
        b_crit = math.inf if e_min > 0 else math.nan
    return s_min, e_min, b_crit


def bootstrap_b_crit(batch_sizes: Sequence[float], steps: Sequence[float], n: int = 1000, seed: int = 0) -> Tuple[float, float]:
    """90% bootstrap interval (5th, 95th percentile) of B_crit, resampling the points.

    Resamples with fewer than two distinct batch sizes cannot be fitted and are skipped; if
    none can (tiny inputs), the interval collapses to the point estimate. Percentiles are taken
    by rank, so infinite B_crit values (S_min = 0) are handled.
    """
    b = np.asarray(batch_sizes, dtype=np.float64)
    y = np.asarray(steps, dtype=np.float64)
    point = fit_critical_batch(b, y)[2]  # also validates the inputs
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n):
        idx = rng.integers(0, len(b), size=len(b))
        if len(np.unique(b[idx])) >= 2:
            b_crit = fit_critical_batch(b[idx], y[idx])[2]
            if not math.isnan(b_crit):
                values.append(b_crit)
    if not values:
        return point, point
    ranked = np.sort(values)
    low = ranked[int(math.floor(0.05 * (len(ranked) - 1)))]
    high = ranked[int(math.ceil(0.95 * (len(ranked) - 1)))]
    return float(low), float(high)


def steps_to_reach(
    tokens: Sequence[float],
    losses: Sequence[float],
    tokens_per_update: float,
    target_loss: float,
    window: int = 1,
) -> Optional[Tuple[float, float]]:
    """(optimizer steps, tokens) at which the loss curve first reaches target_loss, or None.

    Linear interpolation between the two logged points around the crossing. window > 1
    smooths the curve first with a centred moving average (centred, so no lag shifts the
    crossing later; the window shrinks at the ends).
    """
    t = np.asarray(tokens, dtype=np.float64)
    loss = np.asarray(losses, dtype=np.float64)
    if t.shape != loss.shape or t.ndim != 1:
        raise ValueError(f"tokens and losses must be equal-length 1-d sequences, got {t.shape} and {loss.shape}")
    if len(t) == 0:
        return None
    if window > 1:
        half = window // 2
        loss = np.array([loss[max(0, i - half) : i + half + 1].mean() for i in range(len(loss))])
    hits = np.nonzero(loss <= target_loss)[0]
    if len(hits) == 0:
        return None
    i = int(hits[0])
    if i == 0:
        reached = float(t[0])
    else:
        # loss[i-1] > target >= loss[i], so the fraction is in (0, 1].
        frac = (loss[i - 1] - target_loss) / (loss[i - 1] - loss[i])
        reached = float(t[i - 1] + frac * (t[i] - t[i - 1]))
    return reached / tokens_per_update, reached


def power_law_fit(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, float]:
    """(coef, alpha) of y ~ coef * x^alpha, by least squares in log-log (e.g. lr_opt vs B)."""
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"xs and ys must be equal-length 1-d sequences, got {x.shape} and {y.shape}")
    if np.any(x <= 0) or np.any(y <= 0):
        raise ValueError("a power-law fit needs positive xs and ys")
    if len(np.unique(x)) < 2:
        raise ValueError("need at least two distinct xs")
    alpha, log_coef = np.polyfit(np.log(x), np.log(y), 1)
    return float(math.exp(log_coef)), float(alpha)
