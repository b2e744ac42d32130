"""B_opt: the largest batch size whose final loss at the budget is within a tolerance of the best
batch size's. Pure arithmetic, one rule for a ladder's rungs and for a single sweep's answer.

At equal tokens the smallest batch size is nearly always best (more updates), so "the minimum" is
not a useful answer; what a team wants is the largest batch (the fewest, most parallel updates)
that costs at most a stated share of loss. The rule:

- the reference is the lowest final loss over the batch sizes (each at its own best learning rate);
- B_opt is the largest batch size whose loss is at most (1 + tolerance) x the reference, moved
  towards the next larger batch size by linear interpolation of the loss *in B* to where it crosses
  that threshold. A factor-2 grid of batch sizes would otherwise quantise B_opt by up to a factor
  2; linear in B because at small B the loss rises linearly in B / B_noise to first order
  (McCandlish et al. 2018: an update at B is worth 1 / (1 + B_noise / B) of one at B -> 0), where
  an interpolation in log B puts the crossing up to 6% low;
- when every batch size up to the largest tried is within the tolerance, B_opt is only bounded
  from below by the largest (status `above`).

The tolerance is relative to the loss (0.5% by default: on a cross-entropy near 3 nats that is
0.015 nats, about the spread of final losses between seeds of small models). The answer depends on
the smallest batch size tried, since the reference is measured there: sweep down to B_opt / 8 or
below, where the loss has flattened, or B_opt comes out higher by about the smallest batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

DEFAULT_TOLERANCE = 0.005
"""Relative to the best batch size's final loss."""


@dataclass(frozen=True)
class OptimalBatch:
    """The rule's answer for one sweep (or one rung of a ladder)."""

    batch: Optional[float]
    """B_opt in tokens per update (a lower bound when status is `above`); None without losses."""
    status: str
    """resolved | above (every batch size up to the largest is within the tolerance) | none."""
    reference_batch: Optional[int]
    reference_loss: Optional[float]
    threshold: Optional[float]
    tolerance: float

    def to_json(self) -> Dict[str, Any]:
        return {
            "b_opt": self.batch,
            "status": self.status,
            "reference_batch": self.reference_batch,
            "reference_loss": self.reference_loss,
            "threshold": self.threshold,
            "tolerance": self.tolerance,
        }


def b_opt(rows: Sequence[Mapping[str, Any]], tolerance: float = DEFAULT_TOLERANCE) -> OptimalBatch:
    """B_opt from per-batch-size rows with `batch` (tokens per update) and `final_loss` (at the
    best lr), such as the JSON of sweep_analysis.best_per_batch's rows (BestRow.to_json); rows
    without a finite loss are skipped."""
    points = sorted(
        (int(r["batch"]), float(r["final_loss"]))
        for r in rows
        if r.get("final_loss") is not None and math.isfinite(float(r["final_loss"]))
    )
    if not points:
        return OptimalBatch(None, "none", None, None, None, tolerance)
    batches, losses = map(np.asarray, zip(*points))
    batch, above = b_opt_of(batches, losses, tolerance)
    best = int(np.argmin(losses))
    return OptimalBatch(
        batch=float(batch),
        status="above" if bool(above) else "resolved",
        reference_batch=int(batches[best]),
        reference_loss=float(losses[best]),
        threshold=float(threshold_of(losses[best], tolerance)),
        tolerance=tolerance,
    )


def threshold_of(reference: Any, tolerance: float) -> Any:
    """(1 + tolerance) x the reference, for a positive loss; the same distance above a negative one."""
    return reference + tolerance * np.abs(reference)


def b_opt_of(batches: Sequence[float], losses: np.ndarray, tolerance: float) -> Tuple[np.ndarray, np.ndarray]:
    """The rule over the last axis of `losses` [..., J] at ascending `batches` [J] (NaN: no loss at
    that batch size): (B_opt [...], above [...]). NaN where a row has no loss at all. Vectorised
    so that a bootstrap's resamples go through the same rule as the answer."""
    b = np.asarray(batches, np.float64)
    y = np.asarray(losses, np.float64)
    if b.ndim != 1 or y.shape[-1] != len(b) or np.any(np.diff(b) <= 0):
        raise ValueError(f"batches must ascend, one per column of losses; got {list(b)} for {y.shape}")
    finite = np.isfinite(y)
    any_finite = finite.any(axis=-1)
    with np.errstate(invalid="ignore"):
        reference = np.nanmin(np.where(finite, y, np.inf), axis=-1)
        threshold = threshold_of(reference, tolerance)
        inside = finite & (y <= threshold[..., None])
    columns = np.arange(len(b))
    last_inside = np.max(np.where(inside, columns, -1), axis=-1)
    last_finite = np.max(np.where(finite, columns, -1), axis=-1)
    # The first batch size with a loss after the last one inside: the crossing lies between them.
    after = finite & (columns > last_inside[..., None])
    nxt = np.min(np.where(after, columns, len(b)), axis=-1)
    above = any_finite & (last_inside == last_finite)
    j, k = np.clip(last_inside, 0, len(b) - 1), np.clip(nxt, 0, len(b) - 1)
    y_j = np.take_along_axis(y, j[..., None], -1)[..., 0]
    y_k = np.take_along_axis(y, k[..., None], -1)[..., 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.clip((threshold - y_j) / (y_k - y_j), 0.0, 1.0)
    crossing = b[j] + np.where(above, 0.0, share) * (b[k] - b[j])
    return np.where(any_finite, crossing, np.nan), above
