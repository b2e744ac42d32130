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


def per_token_sq_norm(raw_sq_norm: float, loss_multiplier: float, real_tokens: float) -> float:
    """Squared norm of a micro-batch's per-token-mean gradient, from the squared norm of the
    gradient its backward produced for (summed token loss x loss_multiplier). The multiplier is
    what the trainer scales the summed loss by (D / N, token weighting) times the loss scale
    DeepSpeed applies inside backward (fp16; 1 otherwise)."""
    return raw_sq_norm / (loss_multiplier * real_tokens) ** 2


class NoiseScaleEMA:
    """Separate bias-corrected EMAs of |G|^2 and tr(Sigma); B_simple is their ratio.

    The average forgets per token, not per update: an update of B tokens multiplies the old
    average's weight by exp(-B / ema_tokens). Runs at every batch size then smooth over the same
    stretch of training, and a change in the gradient statistics shows up after the same number
    of tokens whatever B is. Bias correction (as in Adam) divides by 1 - exp(-T / ema_tokens)
    after T tokens, so the first value is the first input. A non-finite input (e.g. from an
    overflowed fp16 step) is skipped, tokens and all, so one bad update cannot poison the average.
    """

    def __init__(self, ema_tokens: float):
        if not ema_tokens > 0:
            raise ValueError(f"ema_tokens must be > 0, got {ema_tokens}")
        self.ema_tokens = float(ema_tokens)
        self._g_squared = 0.0
        self._trace_sigma = 0.0
        self.tokens = 0
        """Tokens of the updates averaged so far."""

    def update(self, g_squared: float, trace_sigma: float, tokens: int) -> None:
        if not (math.isfinite(g_squared) and math.isfinite(trace_sigma)):
            return
        decay = math.exp(-tokens / self.ema_tokens)
        self._g_squared = decay * self._g_squared + (1 - decay) * g_squared
        self._trace_sigma = decay * self._trace_sigma + (1 - decay) * trace_sigma
        self.tokens += int(tokens)

    def _corrected(self, raw: float) -> Optional[float]:
        return raw / -math.expm1(-self.tokens / self.ema_tokens) if self.tokens else None

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
        return {
            "ema_tokens": self.ema_tokens,
            "g_squared": self._g_squared,
            "trace_sigma": self._trace_sigma,
            "tokens": self.tokens,
        }

    def load_state_dict(self, state: Dict[str, float]) -> None:
        self.ema_tokens = float(state["ema_tokens"])
        self._g_squared = float(state["g_squared"])
        self._trace_sigma = float(state["trace_sigma"])
        self.tokens = int(state["tokens"])


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


def best_config(steps: Sequence[Sequence[Optional[float]]]) -> Optional[Tuple[int, float]]:
    """(index, mean steps) of the configuration that reaches a target in the fewest steps on
    average over its seeds; a configuration with a seed that never reached it is out."""
    means = [(i, float(np.mean(s))) for i, s in enumerate(steps) if s and all(x is not None for x in s)]
    return min(means, key=lambda m: m[1]) if means else None


def bootstrap_b_crit(
    steps_by_batch: Dict[float, Sequence[Sequence[float]]], n: int = 1000, seed: int = 0, level: float = 0.9
) -> Tuple[float, float]:
    """Percentile bootstrap interval of B_crit over replicate seeds.

    steps_by_batch[B][c] = the steps each seed of configuration c (at batch size B) took to reach
    the target. Within a batch size, the seeds' deviations from their configuration's mean (in
    log steps, scaled by sqrt(K / (K - 1)) so that K values do not understate their spread) are
    pooled over the configurations: with 2 to 4 seeds a configuration alone says too little
    about its spread, and intervals drawn from it alone cover far less often than they claim
    (83% for a nominal 90% with 3 seeds on synthetic sweeps; pooled, 90%). Every resample gives
    each configuration as many pooled deviations as it has seeds, takes per batch size the
    configuration with the fewest mean steps (so the choice of the best learning rate is redone,
    its luck included), and refits S = S_min + E_min / B. The interval holds the middle `level`
    of the resampled B_crit (ranked, so an infinite B_crit from S_min = 0 counts as the largest).
    It says how far the answer moves if the sweep were rerun with other seeds; it does not cover
    the choice of batch sizes, targets or schedule.
    """
    batches = sorted(steps_by_batch)
    if len(batches) < 2:
        raise ValueError(f"need at least two batch sizes, got {batches}")
    rng = np.random.default_rng(seed)
    best = []
    for b in batches:  # [n] best mean steps per resample
        configs = [np.log(np.asarray(s, np.float64)) for s in steps_by_batch[b]]
        if not configs or any(len(c) == 0 or not np.isfinite(c).all() for c in configs):
            raise ValueError(f"batch size {b}: every configuration needs positive, finite steps for every seed")
        pool = np.concatenate(
            [(c - c.mean()) * math.sqrt(len(c) / (len(c) - 1)) for c in configs if len(c) > 1] or [[0.0]]
        )
        means = [np.exp(c.mean() + pool[rng.integers(0, len(pool), size=(n, len(c)))]).mean(axis=1) for c in configs]
        best.append(np.min(means, axis=0))
    values = np.sort([fit_critical_batch(batches, row)[2] for row in np.stack(best, axis=1)])
    values = values[~np.isnan(values)]
    tail = (1 - level) / 2
    low = values[int(math.floor(tail * (len(values) - 1)))]
    high = values[int(math.ceil((1 - tail) * (len(values) - 1)))]
    return float(low), float(high)


def smooth(tokens: Sequence[float], values: Sequence[float], width: float) -> np.ndarray:
    """Centred moving average over a window of `width` tokens (points within width / 2 on either
    side). A window in tokens, not in logged points, averages the same number of tokens for every
    batch size, so curves of all batch sizes carry the same noise and none crosses a target early
    by luck more than another; centred, so it does not shift a crossing later."""
    t = np.asarray(tokens, np.float64)
    v = np.asarray(values, np.float64)
    if t.shape != v.shape or t.ndim != 1:
        raise ValueError(f"tokens and values must be equal-length 1-d sequences, got {t.shape} and {v.shape}")
    lo = np.searchsorted(t, t - width / 2, side="left")
    hi = np.searchsorted(t, t + width / 2, side="right")
    cum = np.concatenate([[0.0], np.cumsum(v)])
    return (cum[hi] - cum[lo]) / (hi - lo)


def steps_to_reach(
    tokens: Sequence[float],
    losses: Sequence[float],
    tokens_per_update: float,
    target_loss: float,
) -> Optional[Tuple[float, float]]:
    """(optimizer steps, tokens) at which a loss curve (smooth it first) first reaches
    target_loss, or None. Linear interpolation between the two points around the crossing."""
    t = np.asarray(tokens, dtype=np.float64)
    loss = np.asarray(losses, dtype=np.float64)
    if t.shape != loss.shape or t.ndim != 1:
        raise ValueError(f"tokens and losses must be equal-length 1-d sequences, got {t.shape} and {loss.shape}")
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
