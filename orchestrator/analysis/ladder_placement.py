"""Where a ladder's next rung starts (pure): its first round placed from what the finished rungs
predict, so a ladder costs fewer trials than independent sweeps of its rungs (docs/ladders.md).

The finished rungs' laws (analysis/ladder.py) predict, at the new rung's (N, D), B_opt, B_crit and
lr_opt; while they are too few for the laws, the finished rung nearest in compute stands in (its own
B_opt, B_crit, best lr and the slope of its best lrs in B), so every rung after the first is placed.
Of the sweep's batch sizes the rung runs those from B_opt / WINDOW_BELOW (where the loss has
flattened, so the B_opt rule's reference is measured: docs/ladders.md "The B_opt rule") up to the
larger of B_OPT_ABOVE x B_opt and B_CRIT_ABOVE x B_crit (past the knee, so B_crit is bracketed from
above); at least MIN_BATCHES, the ones nearest the predicted B_opt in log when the window holds
fewer. Each batch size's first round is the predicted best lr there, lr_opt (B / B_opt)^eta when
the lr law has a B term, divided and multiplied by the bracket's step (lr_bracket.initial_from_rule),
and then bracketed as today. No placement (None) while no finished rung has a B_opt and a best lr:
such a rung runs the sweep's own space.

"B_opt" here is the recommendation's batch: the largest batch within the ladder's tolerance
(ladder.tolerance). Where the rungs' loss surfaces resolve a loss-optimal batch B*, that is the
tolerance point of the trade-off (about 2.4 B* at 0.5 % on the published runs and the basin
worlds), so the window runs from about B* / 3 to 2.2 B*: both sides of the basin the new rung's
surface needs, and no more (docs/benchmarks.md "replay_search" compares the window's edges on the
published runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from orchestrator.analysis import ladder, ladder_rungs, lr_bracket, optimal_batch
from orchestrator.analysis.trials import Trial
from orchestrator.formulas import cost

WINDOW_BELOW = 8.0
B_OPT_ABOVE = 0.9
B_CRIT_ABOVE = 2.0
MIN_BATCHES = 3


@dataclass(frozen=True)
class Placement:
    """A rung's first round, and what placed it."""

    batches: Tuple[int, ...]
    lrs: Dict[int, Tuple[float, ...]]
    """The first round's learning rates per batch size."""
    b_opt: float
    b_crit: Optional[float]
    lr_opt: float
    lr_batch_exponent: float
    rungs: int
    """How many finished rungs the laws were fitted to (1: the nearest finished rung stood in)."""

    def lr_at(self, batch: float) -> float:
        return self.lr_opt * (batch / self.b_opt) ** self.lr_batch_exponent


def place(
    finished: Sequence[Trial],
    params: float,
    tokens: float,
    grid: Sequence[int],
    step: float = 2.0,
    tolerance: float = optimal_batch.DEFAULT_TOLERANCE,
) -> Optional[Placement]:
    """The first round of the rung (params, tokens) over the batch sizes of `grid`, from the
    `finished` rungs' trials; None when they predict no B_opt or lr_opt."""
    try:
        fitted = ladder.analyse(finished, (params, tokens), tolerance)
    except ValueError:  # no usable rung yet
        return None
    predicted = _from_laws(fitted) or _from_nearest(fitted.rungs, params, tokens)
    if predicted is None:
        return None
    b_opt, b_crit, lr_opt, eta, rungs = predicted
    low, high = b_opt / WINDOW_BELOW, max(B_OPT_ABOVE * b_opt, B_CRIT_ABOVE * (b_crit or 0.0))
    batches = sorted(b for b in grid if low <= b <= high)
    if len(batches) < MIN_BATCHES:
        batches = sorted(sorted(grid, key=lambda b: abs(math.log(b / b_opt)))[:MIN_BATCHES])
    lrs = {int(b): tuple(lr_bracket.initial_from_rule(lr_opt * (b / b_opt) ** eta, step)) for b in batches}
    return Placement(tuple(lrs), lrs, b_opt, b_crit, lr_opt, eta, rungs)


Predicted = Tuple[float, Optional[float], float, float, int]
"""B_opt, B_crit (None: not resolved), lr_opt, the lr's exponent in B, rungs it came from."""


def _from_laws(fitted: ladder.Ladder) -> Optional[Predicted]:
    rec = fitted.recommendation
    if rec is None or rec.tokens_per_update is None or rec.lr is None:
        return None
    b_crit = rec.b_crit.value if rec.b_crit is not None else None
    return rec.tokens_per_update.value, b_crit, rec.lr.value, rec.lr_batch_exponent or 0.0, len(fitted.rungs)


def _from_nearest(rungs: Sequence[ladder_rungs.Rung], params: float, tokens: float) -> Optional[Predicted]:
    """The finished rung nearest the new one in compute, read as a prediction for it: its B_opt,
    B_crit and best lr there, and the slope of its best lrs in B (ladder_rungs.LrNear)."""
    compute = cost.training_compute(params, tokens)
    usable = [r for r in rungs if r.compute and r.b_opt.value and r.lr_opt.value]
    if not usable:
        return None
    r = min(usable, key=lambda r: abs(math.log(r.compute / compute)))
    b_crit = r.b_crit.value if r.b_crit.status == "resolved" else None
    return r.b_opt.value, b_crit, r.lr_opt.value, r.draws.lr_near.slope, 1
