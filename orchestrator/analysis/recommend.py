"""What to run: a sweep's answer turned into one batch size and learning rate for a full run at
the sweep's budget (pure; reporting/recommended.py writes it as `recommended.yaml`).

The rule, stated once for a sweep and for a ladder's target (orchestrator/analysis/ladder.py):
- **The batch size** is B_opt (orchestrator/analysis/optimal_batch.py): the largest batch size
  whose final loss at the budget is within a tolerance (0.5 %) of the best batch size's. At equal
  tokens the smallest batch is nearly always best, so "the best" is no useful answer; B_opt is
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

from orchestrator.analysis import optimal_batch


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
        }


def for_sweep(
    rows: Sequence[Mapping[str, Any]],
    lr_law: Optional[Tuple[float, float]],
    unit: Optional[int],
    tolerance: float = optimal_batch.DEFAULT_TOLERANCE,
) -> Optional[Recommendation]:
    """From the report's best row per batch size (`batch`, `final_loss`, `lr`, `run_id`), the lr
    law (coef, alpha) of lr = coef B^alpha or None, and `unit` = seq_len x num_workers tokens (None:
    the runs logged no seq_len, so B is rounded to a whole token and no file can be written); None
    when no batch size has a final loss."""
    found = optimal_batch.b_opt(rows, tolerance)
    if found.batch is None:
        return None
    scored = sorted((r for r in rows if r.get("final_loss") is not None), key=lambda r: r["batch"])
    step = unit or 1
    batch = max(step, int(found.batch // step) * step)
    below = [r for r in scored if r["batch"] <= batch] or scored[:1]
    template = below[-1]
    lr, lr_from = _lr_at(batch, scored, lr_law)
    words = [
        f"B = {batch:,} tokens per update: the largest batch size whose final loss is within {tolerance:.1%} of the "
        f"best batch size's ({found.reference_batch:,} tokens, loss {found.reference_loss:.4g}); B_opt "
        + (
            f"{found.batch:,.0f} rounded down to whole sequences per worker ({unit:,} tokens)."
            if unit
            else f"{found.batch:,.0f} rounded down to a whole token (the runs logged no data.seq_len)."
        )
    ]
    if found.status == "above":
        words.append(
            f"Every batch size tried, up to {scored[-1]['batch']:,}, is within the tolerance: B_opt is at least that, "
            "and larger batch sizes were not tried."
        )
    how = {
        "power law": "the power law of the best lr (by final loss) in B",
        "interpolated": "the best lrs (by final loss) of the batch sizes tried around it, interpolated in log-log",
        "tried": "the best lr (by final loss) at that batch size",
    }[lr_from]
    words.append(f"lr {lr:.3g}: {how}. Warmup and schedule: the best configuration at {template['batch']:,} tokens.")
    return Recommendation(batch, lr, str(template["run_id"]), found, lr_from, words, launchable=unit is not None)


def _lr_at(batch: int, rows: Sequence[Mapping[str, Any]], lr_law: Optional[Tuple[float, float]]) -> Tuple[float, str]:
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
