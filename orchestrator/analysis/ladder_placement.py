"""Where a ladder's next rung starts (pure): its first round placed from what the finished rungs
predict, so a ladder costs fewer trials than independent sweeps of its rungs (docs/ladders.md).

The finished rungs' laws (analysis/ladder.py) predict, at the new rung's (N, D), B_opt, B_crit and
lr_opt. Of the sweep's batch sizes the rung runs those from B_opt / WINDOW_BELOW (where the loss
has flattened, so the B_opt rule's reference is measured: docs/ladders.md "The B_opt rule") up to
WINDOW_ABOVE x the larger of B_opt and B_crit (past the knee, so B_crit is bracketed from above);
at least MIN_BATCHES, the ones nearest the predicted B_opt in log when the window holds fewer. Each
batch size's first round is the predicted best lr there, lr_opt (B / B_opt)^eta when the lr law has
a B term, divided and multiplied by the bracket's step (lr_bracket.initial_from_rule), and then
bracketed as today. No placement (None) while the finished rungs cannot fit the B_opt and lr laws:
such a rung runs the sweep's own space.

"B_opt" here is the recommendation's batch: the largest batch within the ladder's tolerance
(ladder.tolerance). Where the finished rungs' loss surfaces resolve a loss-optimal batch B*, that
is the tolerance point of the trade-off (about 2.4 B* at 0.5 % on the published runs and the
basin worlds), so the window runs from about B* / 3 to 5 B*: both sides of the basin the new
rung's surface needs, and no more; where they do not (the loss falls to the smallest batch), it
is the B_opt law's, as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from orchestrator.analysis import ladder, lr_bracket, optimal_batch
from orchestrator.analysis.trials import Trial

WINDOW_BELOW = 8.0
WINDOW_ABOVE = 2.0
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
    """How many finished rungs the laws were fitted to."""

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
    rec = fitted.recommendation
    if rec is None or rec.tokens_per_update is None or rec.lr is None:
        return None
    b_opt, lr_opt = rec.tokens_per_update.value, rec.lr.value
    b_crit = rec.b_crit.value if rec.b_crit is not None else None
    low, high = b_opt / WINDOW_BELOW, WINDOW_ABOVE * max(b_opt, b_crit or 0.0)
    batches = sorted(b for b in grid if low <= b <= high)
    if len(batches) < MIN_BATCHES:
        batches = sorted(sorted(grid, key=lambda b: abs(math.log(b / b_opt)))[:MIN_BATCHES])
    eta = rec.lr_batch_exponent or 0.0
    lrs = {int(b): tuple(lr_bracket.initial_from_rule(lr_opt * (b / b_opt) ** eta, step)) for b in batches}
    return Placement(tuple(lrs), lrs, b_opt, b_crit, lr_opt, eta, len(fitted.rungs))
