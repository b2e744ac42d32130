"""A branch study's runs as the measurement of orchestrator/analysis/branch_cbs.py: which runs are
branches (their batch.ramp switches at the branch point and they stop at train.stop_at_tokens),
their end losses with the eval's standard error, B_simple of the base run at each branch point,
the from-scratch B_crit at the base's loss there (`branch.compare_with`, whose fixed batches trained
to the study's budget are measured arms of the schedule choice), and the report's `branch_cbs`,
`branch_fit` and suggested ramp. Pure: reads Trials, no MLflow."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from orchestrator.analysis import branch_cbs, branch_ramp, branch_schedule, steps_to_target
from orchestrator.analysis import critical_batch as cb
from orchestrator.analysis.answer import BranchStudy, ScheduleChoice, TargetFit
from orchestrator.analysis.trials import RAMP_CHANGE_KEY, Trial, in_one_order, swept_axes

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
        at, stop = t.number(BRANCH_AT_KEY, int), t.number("train.stop_at_tokens", int)
        (tokens, loss), se = t.eval[-1], dict(t.eval_se).get(t.eval[-1][0], 0.0)
        if tokens != stop:
            continue  # no evaluation at its end: not comparable with the other branches
        seed = t.number("train.seed", int) or 0
        ends.append(branch_cbs.BranchEnd(at, t.number(RAMP_CHANGE_KEY, int), loss, se, seed, _at(base, at)))
    return ends


def _at(base: Optional[Trial], tokens: int) -> Optional[float]:
    """The base run's B_simple at the branch point: its last point at or before it."""
    points = [v for t, v in (base.b_simple if base else []) if t <= tokens]
    return points[-1] if points else None


def loss_at(trials: Sequence[Trial], tokens: int) -> Optional[float]:
    """The train loss a branch point was at: the monotone fit of the base run's train/loss there
    (with `branch.from`, where no base is among the trials, the factor-1 branch's at its start)."""
    base = base_of(trials)
    if base is not None:
        curve = base.train
    else:
        starts = [t for t in trials if is_branch(t) and t.number(BRANCH_AT_KEY, int) == tokens]
        first = min(starts, key=lambda t: t.number(RAMP_CHANGE_KEY, int), default=None)
        curve = first.train if first else []
    if not curve:
        return None
    fitted = cb.monotone(*map(np.asarray, zip(*curve)))
    return float(np.interp(tokens, *fitted))


def from_scratch(points: List[Dict[str, Any]], trials: Sequence[Trial], scratch: Sequence[Trial]) -> None:
    """`branch.compare_with`: beside each branch point, the from-scratch sweep's B_crit at the
    loss the base run was at there (its steps-to-target study with those losses as targets)."""
    usable = [t for t in scratch if t.batch and t.train and not t.ramped]
    levels = {p["tokens"]: loss_at(trials, p["tokens"]) for p in points}
    targets = sorted({v for v in levels.values() if v is not None})
    fits = steps_to_target.study(usable, swept_axes(usable), targets).critical_batch if usable and targets else ()
    by_target = {f.target_loss: f for f in fits}
    for p in points:
        p["b_crit_scratch"] = _scratch_entry(by_target.get(levels[p["tokens"]]))


def _scratch_entry(fit: Optional[TargetFit]) -> Optional[Dict[str, Any]]:
    """What a branch point shows of a from-scratch fit: a bound stands in for an unresolved B_crit."""
    if fit is None:
        return None
    return {
        "target_loss": fit.target_loss,
        "status": fit.status,
        "b_crit": fit.b_crit if fit.b_crit is not None else fit.b_crit_bound,
        "b_crit_interval": list(fit.b_crit_interval) if fit.b_crit_interval else None,
    }


def study(
    trials: Sequence[Trial],
    tolerance: Union[float, branch_cbs.Tolerance] = branch_cbs.DEFAULT_TOLERANCE,
    scratch: Sequence[Trial] = (),
    scratch_name: Optional[str] = None,
) -> Optional[BranchStudy]:
    """The critical batch size along training from a branch study's runs (None: no branches);
    `scratch`: the runs of the from-scratch sweep `scratch_name` to compare with."""
    trials, scratch = in_one_order(trials), in_one_order(scratch)  # the bootstraps draw by position
    ends = branch_ends(trials)
    if not ends:
        return None
    tolerance = branch_cbs.tolerance_of(tolerance)
    along = branch_cbs.critical_batch_along(ends, tolerance)
    if scratch:
        from_scratch(along, trials, scratch)
    fit = branch_ramp.power_law_fit(along)
    base = base_of(trials)
    branch = next(t for t in trials if is_branch(t))
    run = base or branch
    base_batch = branch.number("batch.ramp.0.tokens_per_update", int)
    total, seq_len, workers = (
        run.number(k, int) for k in ("train.total_tokens", "data.seq_len", "cluster.num_workers")
    )
    ramp = branch_ramp.suggested_ramp(along, fit, base_batch, total, seq_len, workers)
    alpha = branch.number("batch.ramp_lr_scaling") or 0.0
    eval_tokens = run.number("train.eval_tokens", int) or 0
    needed = branch_cbs.eval_tokens_needed(ends, tolerance, eval_tokens) if eval_tokens else None
    notes = []
    if needed:
        notes.append(
            f"the eval loss's standard error is more than 1/{branch_cbs.SE_PER_TOLERANCE} of the tolerance "
            f"({tolerance.words()}): eval noise can move a branch across it; raise train.eval_tokens from "
            f"{eval_tokens:,} to at least {needed:,}"
        )
    notes += _interval_notes(
        one_seed=all(n <= 1 for p in along for n in p["seeds"]), eval_se=any(e.loss_se > 0 for e in ends)
    )
    notes += _unplaced(along)
    return BranchStudy(
        loss="eval/loss at the end of each branch",
        tolerance=tolerance.value,
        tolerance_kind=tolerance.kind,
        compare=tolerance.compare,
        rule=tolerance.words(),
        base_batch=base_batch,
        base_run=base.name if base else None,
        points=tuple(along),
        fit=fit,
        ramp=tuple(ramp),
        lr_scaling=alpha,
        ramp_yaml=branch_ramp.ramp_yaml(ramp, alpha),
        ramp_override=branch_ramp.ramp_override(ramp),
        ramp_overrides=branch_ramp.ramp_overrides(ramp, alpha),
        compared_with=scratch_name if scratch else None,
        notes=tuple(notes),
        schedule_choice=_schedule_choice(trials, ends, ramp, base_batch, total, alpha, scratch),
    )


def _schedule_choice(
    trials: Sequence[Trial],
    ends: Sequence[branch_cbs.BranchEnd],
    ramp: Sequence[Dict[str, int]],
    base_batch: int,
    total: int,
    alpha: float,
    scratch: Sequence[Trial] = (),
) -> Optional[ScheduleChoice]:
    """The ramp against the fixed batches (branch_schedule.compare), on the base run's train-loss
    curve, with the fixed batches `scratch` (branch.compare_with's sweep) trained to the budget
    measured (trained_fixed); None without the base run in the study (branch.from) or its curve."""
    base = base_of(trials)
    if base is None or not base.train:
        return None
    lengths = {
        t.number(BRANCH_AT_KEY, int): t.number("train.stop_at_tokens", int) - t.number(BRANCH_AT_KEY, int)
        for t in trials
        if is_branch(t)
    }
    pairs = [(s["from_tokens"], s["tokens_per_update"]) for s in ramp]
    curve = tuple(zip(*base.train))
    lr, trained = base.number("optim.lr"), trained_fixed(base, scratch, total)
    return branch_schedule.choice_of(ends, lengths, curve, pairs, base_batch, total, lr, alpha, trained)


def trained_fixed(base: Trial, scratch: Sequence[Trial], total: int) -> List[branch_schedule.Trained]:
    """The fixed batches of `scratch` trained from the start to the study's budget: at each batch its
    run with the lowest final eval loss (the sweep's answer there, as a user would take it), over the
    base run's final eval loss, with the two evaluations' standard errors combined; none without the
    base's evaluation at the budget."""
    reference = _final_eval(base, total)
    if reference is None:
        return []
    best: Dict[int, tuple] = {}
    for t in scratch:
        if t.outcome != "finished" or t.ramped or not t.batch or t.number("train.total_tokens", int) != total:
            continue
        end = _final_eval(t, total)
        if end is not None and (t.batch not in best or end[0] < best[t.batch][1][0]):
            best[int(t.batch)] = (t, end)
    return [
        branch_schedule.Trained.of(batch, t.number("optim.lr"), loss, se, *reference)
        for batch, (t, (loss, se)) in sorted(best.items())
    ]


def _final_eval(t: Trial, total: int) -> Optional[tuple]:
    """(eval loss, its standard error) at `total` tokens, the run's last evaluation; None without one there."""
    if not t.eval or t.eval[-1][0] != total:
        return None
    return t.eval[-1][1], dict(t.eval_se).get(total, 0.0)


def _unplaced(along: Sequence[Dict[str, Any]]) -> List[str]:
    """Points whose 90 % interval is unbounded on both sides: their value is read (the ramp, the
    power law), but the study cannot place them."""
    lost = [p["tokens"] for p in along if p["cbs_interval"] == [None, None]]
    if not lost:
        return []
    where = ", ".join(f"{t:,}" for t in lost[:-1]) + (" and " if len(lost) > 1 else "") + f"{lost[-1]:,}"
    return [
        f"the study cannot place the critical batch size at {where} tokens: the 90% interval is unbounded on "
        "both sides (the branches' noise is as large as their excess); more train.eval_tokens or search.seeds "
        "would narrow it"
    ]


def _interval_notes(one_seed: bool, eval_se: bool) -> List[str]:
    """What the critical batch's interval leaves out: a branch's own training noise with one seed
    per branch (about the eval's standard error on the shipped study, 12 times it on issue 54's Adam
    world), everything but the factors' gap without an eval standard error either."""
    held = ["the eval loss's standard error"] if eval_se else []
    held += [] if one_seed else ["the spread over seeds"]
    held.append("the gap between the factors")
    words = ("no eval/loss_se was logged: " if not eval_se else "") + "the interval holds " + " and ".join(held)
    if one_seed:
        return [
            f"every branch ran one seed; {words}, not a branch's own training noise: about the eval's on "
            "branches.yaml's study (0.31 % between two seeds, the eval's 0.3 %), 12x it on issue 54's Adam world; "
            "search.seeds 2 or more measures it"
        ]
    return [] if eval_se else [words]
