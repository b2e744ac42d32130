"""What another batch size costs at one (N, D): the penalty curve around the loss-optimal batch B*,
the two points a recommendation gives (B* itself, and the largest batch within a tolerance) and the
trade-off table report.json and the trade-off figure read (pure: numpy). A single sweep builds the
curve from its own loss surface (loss_surface.py), a ladder from its laws at the target
(ladder.py); docs/critical-batch.md ("Two points, one choice") says how to choose between them.

The curve: the share of the loss lost at batch B, at the best lr for B, against B* at its best lr,

    ln(1 + penalty(B)) = a u^2 + b u^3,   u = ln(B / B*),

the form of a loss surface's floor (loss_surface.py: a cubic in ln B), written through what a reader
can check: the penalties at B* / 2 and 2 B*, p_half and p_double (ln 2 = h):

    a = (ln(1 + p_half) + ln(1 + p_double)) / (2 h^2),   b = (ln(1 + p_double) - ln(1 + p_half)) / (2 h^3).

It is read from B* / 2^SPAN to 2^SPAN B* (the span a grid around B* measures, and where the cubic
is trusted). Every number comes with its resamples, paired by index with the resamples of B* and
the penalties it was made from, and so with a 90% interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from orchestrator.analysis.ladder_laws import Value, interval_of

HALF = math.log(2.0)
SPAN = 2
"""The curve and its table run from B* / 2^SPAN to 2^SPAN B*."""
TABLE_STEP = 0.5
"""The table's batch sizes are B* x 2^(k TABLE_STEP)."""

LrAt = Callable[[float, Optional[np.ndarray]], Tuple[Optional[float], Optional[np.ndarray]]]
"""(B, B's resamples or None) -> (the lr to run at B, its resamples): the lr law's B term (a ladder) or
the surface's floor (a single sweep)."""


@dataclass(frozen=True, eq=False)
class Curve:
    """The penalty curve (module docstring): its point estimate and resamples [R]."""

    log_b_star: float
    a: float
    b: float
    draws_log_b_star: np.ndarray
    draws_a: np.ndarray
    draws_b: np.ndarray

    @classmethod
    def of(cls, b_star: Tuple[float, np.ndarray], half: Tuple[float, np.ndarray], double: Tuple[float, np.ndarray]):
        """From (value, resamples) of B*, p_half and p_double; resamples are paired by index."""

        def shape(h, d):
            lh, ld = np.log1p(h), np.log1p(d)
            return (lh + ld) / (2 * HALF**2), (ld - lh) / (2 * HALF**3)

        a, b = shape(half[0], double[0])
        draws_a, draws_b = shape(np.asarray(half[1]), np.asarray(double[1]))
        return cls(math.log(b_star[0]), float(a), float(b), np.log(b_star[1]), draws_a, draws_b)

    @property
    def b_star(self) -> float:
        return math.exp(self.log_b_star)

    def _log_penalty(self, u, a, b):
        return a * u * u + b * u**3

    def penalty(self, batch: float) -> Tuple[float, np.ndarray]:
        """(share of the loss lost at `batch`, its resamples [R], each against its own B*)."""
        u = math.log(batch) - self.log_b_star
        draws_u = math.log(batch) - self.draws_log_b_star
        return (
            float(np.expm1(self._log_penalty(u, self.a, self.b))),
            np.expm1(self._log_penalty(draws_u, self.draws_a, self.draws_b)),
        )

    def tolerance_point(self, tolerance: float) -> Tuple[float, np.ndarray, bool]:
        """(the largest batch above B* whose penalty is within `tolerance`, its resamples, whether the
        penalty stays within it up to 2^SPAN B*, so that the value is a bound)."""
        u = np.linspace(0.0, SPAN * HALF, 401)
        limit = math.log1p(tolerance)

        def crossing(log_b_star, a, b):
            curve = self._log_penalty(u, np.asarray(a)[..., None], np.asarray(b)[..., None])  # [..., U]
            over = curve > limit
            first = np.argmax(over, axis=-1)
            beyond = ~over.any(axis=-1)
            j = np.clip(first, 1, len(u) - 1)
            lo = np.take_along_axis(curve, (j - 1)[..., None], -1)[..., 0]
            hi = np.take_along_axis(curve, j[..., None], -1)[..., 0]
            with np.errstate(divide="ignore", invalid="ignore"):
                w = np.clip((limit - lo) / (hi - lo), 0.0, 1.0)
            at = np.where(beyond, u[-1], u[j - 1] + w * (u[j] - u[j - 1]))
            return np.exp(log_b_star + at), beyond

        value, beyond = crossing(self.log_b_star, self.a, self.b)
        draws, _ = crossing(self.draws_log_b_star, self.draws_a, self.draws_b)
        return float(value), draws, bool(beyond)

    def batches(self) -> np.ndarray:
        """The table's batch sizes: B* x 2^(k TABLE_STEP) from B* / 2^SPAN to 2^SPAN B*."""
        k = np.arange(-SPAN / TABLE_STEP, SPAN / TABLE_STEP + 1)
        return np.exp(self.log_b_star + k * TABLE_STEP * HALF)


@dataclass(frozen=True)
class Row:
    """One batch size of the trade-off at the target (report.json's `tradeoff`)."""

    tokens_per_update: float
    lr: Optional[float]
    predicted_loss_penalty: float
    """The share of the loss lost against B* at its best lr (0.004: 0.4 % above)."""
    interval: Optional[Tuple[float, float]]
    steps: float
    """Optimizer steps of the budget at this batch size."""

    def to_json(self) -> Dict[str, Any]:
        return {
            "tokens_per_update": self.tokens_per_update,
            "lr": self.lr,
            "predicted_loss_penalty": self.predicted_loss_penalty,
            "interval": list(self.interval) if self.interval else None,
            "steps": self.steps,
        }


@dataclass(frozen=True)
class LossOptimal:
    """The loss-optimal point: B*, the lr to run there, the loss it is predicted to reach."""

    tokens_per_update: Value
    lr: Optional[Value]
    predicted_loss: Optional[Value]

    def to_json(self) -> Dict[str, Any]:
        return {
            "tokens_per_update": self.tokens_per_update.to_json(),
            "lr": self.lr.to_json() if self.lr else None,
            "predicted_loss": self.predicted_loss.to_json() if self.predicted_loss else None,
        }


@dataclass(frozen=True)
class TolerancePoint:
    """The largest batch whose predicted penalty is within the tolerance, and what it costs and saves."""

    tokens_per_update: Value
    lr: Optional[Value]
    predicted_loss_penalty: Value
    steps_saved: Value
    """Optimizer steps fewer than at B*, over the budget."""
    beyond: bool
    """The penalty stays within the tolerance up to 2^SPAN B*: tokens_per_update is that bound."""


@dataclass(frozen=True)
class Tradeoff:
    """The two points and the table at one (N, D)."""

    tolerance: float
    loss_optimal: LossOptimal
    tolerance_point: TolerancePoint
    rows: Tuple[Row, ...]
    curve: Curve
    tokens: float
    """The budget the steps count."""


def tradeoff(
    curve: Curve,
    lr_at: LrAt,
    tokens: float,
    tolerance: float,
    predicted_loss: Optional[Value] = None,
) -> Tradeoff:
    """The trade-off at a budget of `tokens` (module docstring)."""
    b_star_draws = np.exp(curve.draws_log_b_star)
    lr_star, lr_star_draws = lr_at(curve.b_star, b_star_draws)
    optimal = LossOptimal(
        Value(curve.b_star, interval_of(b_star_draws)), _value(lr_star, lr_star_draws), predicted_loss
    )
    batch, batch_draws, beyond = curve.tolerance_point(tolerance)
    lr, lr_draws = lr_at(batch, batch_draws)
    penalty, penalty_draws = curve.penalty(batch)
    saved = tokens / curve.b_star - tokens / batch
    saved_draws = tokens / b_star_draws - tokens / batch_draws
    point = TolerancePoint(
        Value(batch, interval_of(batch_draws)),
        _value(lr, lr_draws),
        Value(penalty, interval_of(penalty_draws)),
        Value(saved, interval_of(saved_draws)),
        beyond,
    )
    rows = []
    for b in curve.batches():
        p, draws = curve.penalty(float(b))
        rows.append(Row(float(b), lr_at(float(b), None)[0], p, interval_of(draws), tokens / float(b)))
    return Tradeoff(tolerance, optimal, point, tuple(rows), curve, tokens)


def _value(value: Optional[float], draws: Optional[np.ndarray]) -> Optional[Value]:
    """A value with the interval of its resamples (none without them); None without a value."""
    if value is None:
        return None
    return Value(value, interval_of(draws) if draws is not None else None)


def point_words(tolerance: float) -> str:
    """Which point a recommendation's batch is, in words."""
    return f"the largest batch whose predicted penalty against B* is within {tolerance:.2%}"


def words(t: Tradeoff, fmt_batch: str = ",.0f") -> Sequence[str]:
    """The two points in two sentences (90% intervals in brackets)."""
    o, p = t.loss_optimal, t.tolerance_point

    def v(x: Optional[Value], fmt: str) -> str:
        if x is None or x.value is None:
            return "none"
        inside = f" [{format(x.interval[0], fmt)}, {format(x.interval[1], fmt)}]" if x.interval else ""
        return format(x.value, fmt) + inside

    bound = f" (at least: the penalty stays within {t.tolerance:.2%} up to {2**SPAN}x B*)" if p.beyond else ""
    return (
        f"Loss-optimal: B* = {v(o.tokens_per_update, fmt_batch)} tokens per update, lr {v(o.lr, '.3g')}"
        + (f", predicted loss {v(o.predicted_loss, '.4g')}." if o.predicted_loss else "."),
        f"Within {t.tolerance:.2%} of its loss: B = {v(p.tokens_per_update, fmt_batch)}{bound}, "
        f"lr {v(p.lr, '.3g')}, predicted penalty {v(p.predicted_loss_penalty, '.2%')}, "
        f"{v(p.steps_saved, ',.0f')} optimizer steps fewer than at B*.",
    )
