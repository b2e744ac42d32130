"""What to run: a sweep's answer turned into one batch size and learning rate for a full run at
the sweep's budget (pure; reporting/recommended.py writes it as `recommended.yaml`).

The rule, stated once for a sweep and for a ladder's target (orchestrator/analysis/ladder.py):
- **Two points, one choice** (docs/critical-batch.md). Where the sweep's loss surface
  (loss_surface.py) has a loss-optimal batch B* inside the batch sizes tried (the loss rises on
  both sides, as in real language-model sweeps), the report gives B* (its lr, its predicted loss)
  and the largest batch whose predicted penalty against B* is within the tolerance (0.5 % by
  default: `loss_tolerance`, `report --loss-tolerance`), what it costs and the optimizer steps it
  saves (tradeoff.py); the recommendation is that tolerance point. Where the loss keeps falling to
  the smallest batch tried (small models, and the McCandlish model), there is no B* to measure
  against: the batch size is B_opt (orchestrator/analysis/optimal_batch.py), the largest batch size
  whose final loss at the budget is within the tolerance of the best batch size's. Either way it is
  the largest batch, the fewest and most parallel updates, that costs at most a stated share of
  loss, which is the budget question a full run asks. (B_crit at the loss the runs end at answers
  a different one, how many steps a batch saves; the report gives it beside.) It is rounded down
  to a whole number of sequences per worker (seq_len x num_workers), so it stays within the
  tolerance and splits on the sweep's cluster; where every batch size tried is within the
  tolerance, B_opt is only bounded below and the largest tried is recommended (said so).
- **The learning rate** at that batch size, by final loss whatever the sweep searched by (a full
  run at this budget is judged by its final loss): the power law of the best lr in B when the report
  has one (three or more interior best lrs), else the best lrs of the two batch sizes tried
  around it, interpolated in log-log, else the best lr of the nearest one.
- **Warmup and schedule** are those of the best configuration at the batch size tried nearest
  below it (the sweep measured them there, not elsewhere).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from orchestrator.analysis import optimal_batch, tradeoff


@dataclass(frozen=True)
class Recommendation:
    """One full run at the sweep's budget, and why."""

    tokens_per_update: int
    lr: float
    template_run: str
    """The run whose config the recommended one is (its warmup, schedule, model, data): the best
    configuration at the batch size tried nearest below the recommended one."""
    b_opt: optimal_batch.OptimalBatch
    lr_from: str
    """How the lr was read: `power law`, `interpolated` or `tried`."""
    rule: List[str] = field(default_factory=list)
    """The rule and the numbers, as sentences for the file's header and the report."""
    launchable: bool = False
    """The runs logged this project's train config (data.seq_len among their params), so the
    template run's params make recommended.yaml; tables from another trainer do not."""
    tolerance: float = optimal_batch.DEFAULT_TOLERANCE
    """The share of the loss traded for a larger batch."""
    found: Optional[tradeoff.Tradeoff] = None
    """The two points and the trade-off, where the loss surface has a loss-optimal batch."""

    @property
    def point(self) -> str:
        """Which point tokens_per_update is, in words."""
        if self.found is None:
            return "B_opt: the largest batch size within the tolerance of the best batch size's loss"
        return tradeoff.point_words(self.tolerance)

    def overrides(self) -> Dict[str, Any]:
        """Train-config keys to set on the template run's config."""
        return {"batch.tokens_per_update": self.tokens_per_update, "optim.lr": self.lr}

    def to_json(self) -> Dict[str, Any]:
        return {
            "tokens_per_update": self.tokens_per_update,
            "lr": self.lr,
            "lr_from": self.lr_from,
            "template_run": self.template_run,
            "b_opt": self.b_opt.to_json(),
            "rule": list(self.rule),
            "launchable": self.launchable,
            # The two points (null where the surface has no B*). tokens_per_update and lr above are
            # the launchable point, rounded to whole sequences per worker: plain numbers; the
            # intervals are the tolerance point's below, before rounding. The lr has none: a single
            # sweep's lr law is a fit through its best lrs, with no resamples.
            "tolerance": self.tolerance,
            "point": self.point,
            "loss_optimal": self.found.loss_optimal.to_json() if self.found else None,
            "predicted_loss_penalty": _value(self.found.tolerance_point.predicted_loss_penalty) if self.found else None,
            "steps_saved": _value(self.found.tolerance_point.steps_saved) if self.found else None,
            "tolerance_point": _value(self.found.tolerance_point.tokens_per_update) if self.found else None,
            "tradeoff": [row.to_json() for row in self.found.rows] if self.found else [],
        }


def _value(v) -> Optional[dict]:
    return v.to_json() if v is not None else None


def for_sweep(
    rows: Sequence[Mapping[str, Any]],
    lr_law: Optional[Tuple[float, float]],
    unit: Optional[int],
    tolerance: float = optimal_batch.DEFAULT_TOLERANCE,
    found: Optional[tradeoff.Tradeoff] = None,
    no_b_star: Optional[str] = None,
    lr_criterion: str = "final_loss",
) -> Optional[Recommendation]:
    """From the report's best row per batch size (`batch`, `final_loss`, `lr`, `run_id`), the lr
    law (coef, alpha) of lr = coef B^alpha or None, and `unit` = seq_len x num_workers tokens (None:
    the runs logged no seq_len, so B is rounded to a whole token and no file can be written), and
    the trade-off of the sweep's loss surface where it has a B* (`found`); None when no batch size
    has a final loss; `no_b_star`: why it has none, in words."""
    rule = optimal_batch.b_opt(rows, tolerance)
    if rule.batch is None:
        return None
    scored = sorted((r for r in rows if r.get("final_loss") is not None), key=lambda r: r["batch"])
    step = unit or 1
    chosen = found.tolerance_point.tokens_per_update.value if found else rule.batch
    batch = max(step, int(chosen // step) * step)
    below = [r for r in scored if r["batch"] <= batch] or scored[:1]
    template = below[-1]
    lr, lr_from = lr_at(batch, scored, lr_law)
    rounded = (
        f"rounded down to whole sequences per worker ({unit:,} tokens)"
        if unit
        else "rounded down to a whole token (the runs logged no data.seq_len)"
    )
    if found:
        words = [*tradeoff.words(found), f"B = {batch:,} tokens per update: the second point, {rounded}."]
    else:
        words = [
            f"B = {batch:,} tokens per update: the largest batch size whose final loss is within {tolerance:.1%} of "
            f"the best batch size's ({rule.reference_batch:,} tokens, loss {rule.reference_loss:.4g}); B_opt "
            f"{rule.batch:,.0f} {rounded}."
        ]
    if found is None and no_b_star:
        words.append(f"No loss-optimal batch to measure the tolerance against: {no_b_star}.")
    if found is None and rule.status == "above":
        words.append(
            f"Every batch size tried, up to {scored[-1]['batch']:,}, is within the tolerance: B_opt is at least that, "
            "and larger batch sizes were not tried."
        )
    by = {"final_loss": "by final loss", "steps": "by fewest steps to the primary target"}[lr_criterion]
    how = {
        "power law": f"the power law of the best lr ({by}) in B",
        "interpolated": f"the best lrs ({by}) of the batch sizes tried around it, interpolated in log-log",
        "tried": f"the best lr ({by}) at that batch size",
    }[lr_from]
    words.append(f"lr {lr:.3g}: {how}. Warmup and schedule: the best configuration at {template['batch']:,} tokens.")
    return Recommendation(batch, lr, str(template["run_id"]), rule, lr_from, words, unit is not None, tolerance, found)


def lr_at(batch: float, rows: Sequence[Mapping[str, Any]], lr_law: Optional[Tuple[float, float]]) -> Tuple[float, str]:
    if lr_law is not None:
        coef, alpha = lr_law
        return float(coef * batch**alpha), "power law"
    tried = [(float(r["batch"]), float(r["lr"])) for r in rows if r.get("lr")]
    exact = [lr for b, lr in tried if b == batch]
    if exact:
        return exact[0], "tried"
    lower = [p for p in tried if p[0] < batch]
    upper = [p for p in tried if p[0] > batch]
    if lower and upper:
        (b0, lr0), (b1, lr1) = lower[-1], upper[0]
        share = math.log(batch / b0) / math.log(b1 / b0)
        return float(math.exp(math.log(lr0) + share * math.log(lr1 / lr0))), "interpolated"
    nearest = min(tried, key=lambda p: abs(math.log(p[0] / batch)))
    return nearest[1], "tried"
