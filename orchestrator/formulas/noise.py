"""Gradient noise scale (McCandlish et al. 2018, arXiv 1812.06162): the B_simple estimators and their EMA.

For a batch of B tokens, the per-token-mean gradient G_B has E|G_B|^2 = |G|^2 + tr(Sigma) / B,
with G the true gradient and Sigma the per-token gradient covariance. Two batch sizes give two
equations and so unbiased estimates of both unknowns (docs/design.md 5):

    |G|^2 ~= (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    S     ~= (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)
    B_simple = S / |G|^2          (ratio of separately smoothed estimates, never averaged ratios)

The same two equations hold for any fixed linear map of the gradient. AdamW moves the weights
along P g, with P = diag(1 / (sqrt(v_hat) + eps)) from its second moment before the update (which
the update's own samples do not touch), so E|P G_B|^2 = |P G|^2 + tr(P Sigma P) / B, and `estimate`
on the preconditioned norms gives B_simple_adam = tr(P Sigma P) / |P G|^2 (gns/b_simple_adam;
workloads/train/adam_precondition.py takes the norms). Whether it is closer than B_simple to
AdamW's critical batch size: docs/critical-batch.md ("Which noise scale to trust for Adam").

The critical batch size from a sweep's runs is orchestrator/analysis/critical_batch.py's.

Pure math on Python floats and numpy: no torch, Ray, DeepSpeed or MLflow.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple


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


def adam_memory_filled(step: float, beta2: float) -> bool:
    """Whether AdamW's second moment has averaged over its memory, 1 / (1 - beta2) updates, after
    `step` steps: the noise scale of the preconditioned gradient is measured from there on. Before,
    v_hat rests on a few gradients, and a coordinate whose few squared gradients happened to be
    small gets an enormous 1 / sqrt(v_hat): the first estimates are that coordinate's noise (on
    linear regression, |P G|^2 of -1.6e5 after one step against about 3 later), and they would hold
    the EMA for many times its length."""
    return step * (1.0 - beta2) >= 1.0 - 1e-9  # not step >= 1 / (1 - beta2): 1 / (1 - 0.8) is 5.000000000000001


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

    Where the average belongs on a curve against tokens: `centre`, the same weighted mean of the
    positions of its inputs (the tokens the weights had seen when each update's gradients were
    taken). The average of inputs that change linearly with position is exactly their value at
    the centre, so a smoothed value logged there has no first-order lag; logged at the newest
    input it would trail a trend by about ema_tokens. What is left is of second order: the
    curvature times the spread of the weights (about ema_tokens^2).
    """

    def __init__(self, ema_tokens: float):
        if not ema_tokens > 0:
            raise ValueError(f"ema_tokens must be > 0, got {ema_tokens}")
        self.ema_tokens = float(ema_tokens)
        self._g_squared = 0.0
        self._trace_sigma = 0.0
        self._position = 0.0
        self.tokens = 0
        """Tokens of the updates averaged so far."""

    def update(self, g_squared: float, trace_sigma: float, tokens: int, at: Optional[float] = None) -> None:
        """One update's estimates; `tokens` its size, `at` the tokens its weights had seen
        (None: the tokens averaged so far, right when every update since the start is averaged)."""
        if not (math.isfinite(g_squared) and math.isfinite(trace_sigma)):
            return
        at = self.tokens if at is None else at
        decay = math.exp(-tokens / self.ema_tokens)
        self._g_squared = decay * self._g_squared + (1 - decay) * g_squared
        self._trace_sigma = decay * self._trace_sigma + (1 - decay) * trace_sigma
        self._position = decay * self._position + (1 - decay) * at
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
    def centre(self) -> Optional[float]:
        """The EMA's centre of mass in tokens seen: where its values are logged."""
        return self._corrected(self._position)

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
            "position": self._position,
            "tokens": self.tokens,
        }

    def load_state_dict(self, state: Dict[str, float]) -> None:
        self.ema_tokens = float(state["ema_tokens"])
        self._g_squared = float(state["g_squared"])
        self._trace_sigma = float(state["trace_sigma"])
        self._position = float(state.get("position", 0.0))  # absent in checkpoints of older versions
        self.tokens = int(state["tokens"])
