"""`batch.schedule: adaptive`: the rule by which a run doubles its batch from its own noise scale
(pure; the worker applies it at each update, workloads/train/train_loop.py).

The critical batch size grows as the loss falls (McCandlish et al. 2018); a run can follow it with
the gradient noise scale it measures anyway (AdaptDL/Pollux; Gray et al. 2024). The rule: after an
update, when the run's smoothed noise scale times `calibration` has stayed at or above
`threshold` x the current batch for `patience` updates in a row, the batch doubles from the next
update on, up to `max_tokens_per_update`. Doubling only at threshold 2 keeps the batch between
half the (calibrated) noise scale and it, as the branch study's ramp does; the patience is the
hysteresis: the noise scale is an EMA of noisy estimates, and a single high reading must not
double the batch (it never halves, so a wrong doubling is never undone). A change comes at a whole
update of the current batch that is also whole updates of the new one (at most one update late),
so every change point is whole updates of every batch after it and, with the budget whole updates
of the largest, every ramp the run may take ends at the same budget; D stays, b and A are solved
per batch as a ramp's are. The decisions are the run's state: they are checkpointed, so a resumed run
makes the same ones, and the realised ramp can be replayed as a `batch.ramp`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

THRESHOLD = 2.0
"""Double when the calibrated noise scale reaches this many times the current batch."""
PATIENCE = 4
"""Updates in a row at or above the threshold before a doubling."""


@dataclass(frozen=True)
class AdaptiveRule:
    max_tokens_per_update: int
    calibration: float = 1.0
    """The critical batch size over B_simple (1: trust B_simple; a branch study measures it)."""
    threshold: float = THRESHOLD
    patience: int = PATIENCE


@dataclass
class AdaptiveState:
    """What the rule has decided and how far it is towards the next decision (checkpointed)."""

    ramp: List[Tuple[int, int]] = field(default_factory=list)
    """(from_tokens, tokens_per_update) of every batch the run has trained at, in order."""
    above: int = 0
    """Updates in a row at or above the threshold."""

    def to_json(self) -> Dict[str, Any]:
        return {"ramp": [list(step) for step in self.ramp], "above": self.above}

    @classmethod
    def from_json(cls, data: Optional[Dict[str, Any]]) -> "AdaptiveState":
        if not data:
            return cls()
        return cls([(int(t), int(b)) for t, b in data["ramp"]], int(data["above"]))


def decide(
    rule: AdaptiveRule, state: AdaptiveState, tokens: int, batch: int, b_simple: Optional[float]
) -> Optional[int]:
    """After the update that brought the run to `tokens` at `batch` tokens per update, with the
    smoothed noise scale `b_simple` (None or NaN: not measured yet): the batch to train at from
    here on when it doubles now (recorded in `state.ramp`), else None."""
    reading = rule.calibration * b_simple if b_simple is not None and math.isfinite(b_simple) else None
    state.above = state.above + 1 if reading is not None and reading >= rule.threshold * batch else 0
    if state.above < rule.patience or 2 * batch > rule.max_tokens_per_update:
        return None
    if tokens % (2 * batch):  # not whole updates of the new batch yet: the next update is (the count holds)
        return None
    state.above = 0
    state.ramp.append((tokens, 2 * batch))
    return 2 * batch


def fastest_ramp(rule: AdaptiveRule, base: int, budget: int) -> List[Tuple[int, int]]:
    """The ramp of a run whose calibrated noise scale is always past the threshold: it doubles as
    soon as the rule lets it (after `patience` updates at each batch, at whole updates of the
    next), up to the cap, with one update of the new batch left before `budget`. The fewest
    optimizer steps an adaptive run can take: what `plan` predicts before the run measures anything."""
    past_every_threshold = 2 * rule.threshold * rule.max_tokens_per_update / rule.calibration
    state, tokens, batch = AdaptiveState([(0, base)]), 0, base
    while tokens + batch <= budget:
        tokens += batch
        if tokens + 2 * batch <= budget:
            batch = decide(rule, state, tokens, batch, past_every_threshold) or batch
    return state.ramp
