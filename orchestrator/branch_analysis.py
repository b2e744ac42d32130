"""A branch study's runs as the measurement of orchestrator/branch_cbs.py: which runs are
branches (their batch.ramp switches at the branch point and they stop at train.stop_at_tokens),
their end losses with the eval's standard error, B_simple of the base run at each branch point,
and the report's `branch_cbs`, `branch_fit` and suggested ramp. Pure: reads Trials, no MLflow."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from orchestrator import branch_cbs
from orchestrator.trials import RAMP_CHANGE_KEY, Trial

BRANCH_AT_KEY = "batch.ramp.1.from_tokens"
BASE_KEY = "train.checkpoint_at_tokens.0"
"""A param only a branch study's base run has (its branch points, flattened)."""


def is_branch(t: Trial) -> bool:
    return (
        "train.stop_at_tokens" in t.params and BRANCH_AT_KEY in t.params and "train.start_from_checkpoint" in t.params
    )


def base_of(trials: Sequence[Trial]) -> Optional[Trial]:
    """The study's base run among `trials` (None when the study branched from another run)."""
    return next((t for t in trials if BASE_KEY in t.params), None)


def branch_ends(trials: Sequence[Trial]) -> List[branch_cbs.BranchEnd]:
    """The finished branches' eval losses at their ends, B_simple of the base at their branch points."""
    base = base_of(trials)
    ends = []
    for t in trials:
        if not is_branch(t) or t.outcome != "finished" or not t.eval:
            continue
        at, stop = int(float(t.params[BRANCH_AT_KEY])), int(float(t.params["train.stop_at_tokens"]))
        (tokens, loss), se = t.eval[-1], dict(t.eval_se).get(t.eval[-1][0], 0.0)
        if tokens != stop:
            continue  # no evaluation at its end: not comparable with the other branches
        seed = int(float(t.params.get("train.seed", 0)))
        ends.append(branch_cbs.BranchEnd(at, int(float(t.params[RAMP_CHANGE_KEY])), loss, se, seed, _at(base, at)))
    return ends


def _at(base: Optional[Trial], tokens: int) -> Optional[float]:
    """The base run's B_simple at the branch point: its last point at or before it."""
    points = [v for t, v in (base.b_simple if base else []) if t <= tokens]
    return points[-1] if points else None


def study(trials: Sequence[Trial], tolerance: float = branch_cbs.DEFAULT_TOLERANCE) -> Optional[Dict[str, Any]]:
    """The critical batch size along training from a branch study's runs (None: no branches)."""
    ends = branch_ends(trials)
    if not ends:
        return None
    along = branch_cbs.critical_batch_along(ends, tolerance)
    fit = branch_cbs.power_law_fit(along)
    base = base_of(trials)
    branch = next(t for t in trials if is_branch(t))
    p = (base or branch).params
    base_batch = int(float(branch.params["batch.ramp.0.tokens_per_update"]))
    total = int(float(p["train.total_tokens"]))
    ramp = branch_cbs.suggested_ramp(
        along, fit, base_batch, total, int(float(p["data.seq_len"])), int(float(p["cluster.num_workers"]))
    )
    alpha = float(branch.params.get("batch.ramp_lr_scaling", 0.0))
    return {
        "loss": "eval/loss at the end of each branch",
        "tolerance": tolerance,
        "base_batch": base_batch,
        "base_run": base.name if base else None,
        "points": along,
        "fit": fit,
        "ramp": ramp,
        "lr_scaling": alpha,
        "ramp_yaml": branch_cbs.ramp_yaml(ramp, alpha),
        "ramp_override": branch_cbs.ramp_override(ramp),
    }
