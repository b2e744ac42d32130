"""What a sweep answers, computed from its trials: `analyse` gives the typed `answer.Answer` that
report.json, the tables, the Python API and the printed answer read (pure: no MLflow; the report
pipeline, orchestrator/reporting/pipeline.py, reads the trials and writes the answer).

Rules, so that a reader can check every number (batch sizes, budgets and positions in tokens; a
loss sits at the tokens the weights that produced it had seen, so the first is at 0):
- Finished: ended FINISHED with the whole (rounded) budget seen. Stopped: ended early by the
  scheduler (tagged with its rung) or killed. Failed: FAILED. Final-loss comparisons use
  finished trials only; `sweep` and `report` both apply `Trial.outcome`.
- Swept axes: the config keys whose values differ between trials (derived keys and the seed
  aside). A configuration is one value of every axis but the batch size; its seeds are
  replicates. Configurations that differ only in the learning rate form an lr scan.
- Final loss: the last eval/loss when every finished trial has one, else the end of the monotone
  fit of train/loss. The best learning rate per batch size by final loss is the minimum of a
  quadratic in log lr through the best configuration of a scan and its neighbours (a neighbour
  that failed brackets it, the parabola then takes the other side); a best at the lowest or
  highest lr tried is flagged.
- Curves are read through a monotone (isotonic) fit of train/loss, so no smoothing window moves
  a crossing, and only where the schedule cannot fake progress (schedules.stable_end_tokens:
  before wsd's decay, all of constant, the first half of cosine and linear, with a warning).
  Otherwise every run would reach the lowest targets in its final anneal, whatever its B.
- Warmup: steps are counted from the start level L_a, the lowest loss any run had at the end of
  its warmup, to the target. Every run crosses L_a after its warmup, so no warmup steps enter
  S_j (with a constant lr after warmup, the model's steps between two losses are exactly
  S_min (1 + B_noise / B)); targets must lie below L_a. Without warmup steps count from 0.
- Targets when none are given (steps_to_target.choose_targets): L_end = the worst, over batch
  sizes, of the best median loss over the last END_SHARE of the trusted part;
  L_end + f (L_a - L_end) for f in TARGET_FRACTIONS.
- S_j: per configuration the mean over seeds of log steps (every seed must reach the target);
  the fewest over lr from a parabola in the lr of the speed 1 / S through the best and its
  neighbours (critical_batch.best_over: a configuration that failed or never reaches the target
  brackets the best but has no value); the best lr scan over the other axes. A best at an edge
  of the lrs tried is flagged and makes S_j an upper bound.
- Fit (critical_batch.fit): S = S_min (1 + B_crit / B) in log steps, each point weighted by the
  inverse variance of its seed mean (seed deviations pooled within the batch size); unweighted
  with one seed. Status: not resolved (fewer than MIN_BATCH_SIZES batch sizes reach the target),
  below (B_crit under the smallest B that does), above (over the largest), else resolved.
- Interval (two or more seeds): a 90% bootstrap (steps_to_target.Batch.resample) that redraws
  every configuration's seeds from its batch size's pooled deviations, jointly for all targets,
  moves each point by its lr interpolation's error scale, and redoes the interpolation, the
  choice of configuration and the fit in each resample.
  Lack of fit: F test of the weighted residuals against the seeds' own spread, flagged at
  p < LACK_OF_FIT_P. Trend (diagnostics.trend): the slope of log B_crit on log target loss over
  the resolved targets, with its bootstrap interval, beside the same slope of B_simple. The
  other notes that say when not to trust a number: diagnostics.notes.
- Primary target: the loss the sweep named (a bracket search's search.target_loss), else the
  lowest resolved one, else the first.
- B_simple at a target: per batch size the best configuration's gns/b_simple where its seeds
  reach it (mean), median over batch sizes.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from orchestrator.analysis import (
    branch_analysis,
    branch_cbs,
    launch_choice,
    loss_surface,
    lr_optimum,
    optimal_batch,
    steps_to_target,
    tradeoff,
)
from orchestrator.analysis.answer import Answer, BestLr, BestRow, Counts, LrScaling, TrialRow
from orchestrator.analysis.trials import (
    LR_KEY,
    SEED_KEY,
    Trial,
    by_batch,
    in_one_order,
    lr_scans,
    settings,
    swept_axes,
)

# ---------------------------------------------------------------- best configurations

LOSS_FORMS = (("log", "lin"), ("lin", "lin"))
"""The lr parabolas of the final loss: in log lr, or in the lr."""


def scored_scans(group: Sequence[Trial], axes: Sequence[str], metric: str):
    """Per lr scan of one batch size's trials (trials.lr_scans): (its configurations but those with a
    trial still running, each one's seeds' final losses (None: failed or stopped), each one's mean
    final loss over its seeds, NaN where a seed has none). How best_per_batch scores configurations,
    and what the report's heat map shows."""
    for scan in lr_scans(group, axes):
        scan = [c for c in scan if all(t.outcome != "incomplete" for t in c.trials)]
        finals = [[t.final(metric) if t.outcome == "finished" else None for t in c.trials] for c in scan]
        losses = [float(np.mean(f)) if all(x is not None for x in f) else math.nan for f in finals]
        yield scan, finals, losses


def best_per_batch(usable: Sequence[Trial], axes: Sequence[str], metric: str) -> List[BestRow]:
    """Per batch size the best configuration by mean final loss over its seeds, and the best lr
    by a quadratic in log lr through it (module docstring). A configuration with a trial that
    failed or was stopped counts as worse than any; one still running is left out."""
    rows = []
    for b, group in by_batch(usable).items():
        scored = []  # (loss, lr optimum, scan, index)
        for scan, finals, losses in scored_scans(group, axes, metric):
            if scan and any(math.isfinite(x) for x in losses):
                lrs = [c.lr or 1.0 for c in scan]
                opt = lr_optimum.best_over(lrs, np.array(losses), maximize=False, forms=LOSS_FORMS)
                scored.append((float(losses[opt.index]), opt, scan, finals))
        if not scored:
            continue
        loss, opt, scan, finals = min(scored, key=lambda s: s[0])
        chosen = scan[int(opt.index)]
        best = min(chosen.trials, key=lambda t: t.final(metric))
        spread = float(np.std(finals[int(opt.index)])) if len(chosen.trials) > 1 else None
        rows.append(
            BestRow(
                batch=b,
                settings=settings(best, axes),
                final_loss=loss,
                spread=spread,
                seeds=len(chosen.trials),
                lr=float(opt.position) if chosen.lr else None,
                lr_edge=opt.flag_word(),
                run_id=best.run_id,
                run_name=best.name,
                configurations=sum(len(s[2]) for s in scored),
                edges=_edges(best, group, axes),
            )
        )
    return rows


def _edges(best: Trial, tried: Sequence[Trial], axes: Sequence[str]) -> Dict[str, str]:
    """Numeric axes whose best value is the lowest or highest of the values tried (three or more
    for axes but the lr, two or more for the lr): the optimum may lie outside the swept range."""
    edges = {}
    for key in axes:
        try:
            values = sorted({float(t.params[key]) for t in tried})
            mine = float(best.params[key])
        except (KeyError, TypeError, ValueError):
            continue
        if len(values) >= (2 if key == LR_KEY else 3) and mine in (values[0], values[-1]):
            edges[key] = "lowest" if mine == values[0] else "highest"
    return edges


def lr_scaling(best: Sequence[BestLr], axes: Sequence[str]) -> LrScaling:
    """The power law lr_opt ~ coef * B^alpha through the interpolated best lrs that are interior."""
    if LR_KEY not in axes:
        return LrScaling(None, None, 0, "the learning rate was not swept")
    points = [(r.batch, r.lr) for r in best if r.lr and r.edge is None]
    if len({b for b, _ in points}) < 3:
        note = f"the lr power law needs 3 batch sizes with an interior best lr; {len(points)} have one"
        return LrScaling(None, None, len(points), note)
    x, y = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    alpha, log_coef = np.polyfit(x, y, 1)
    return LrScaling(float(math.exp(log_coef)), float(alpha), len(points), None)


def counts(usable: Sequence[Trial]) -> Counts:
    """How the trials ended; for those the scheduler stopped, at which rungs (tokens -> count)."""
    stopped = [t for t in usable if t.outcome == "stopped"]
    rungs: Dict[int, int] = {}
    for t in stopped:
        if t.stopped_at is not None:
            rungs[t.stopped_at] = rungs.get(t.stopped_at, 0) + 1
    return Counts(
        finished=sum(t.outcome == "finished" for t in usable),
        stopped=len(stopped),
        stopped_rungs=dict(sorted(rungs.items())),
        failed=sum(t.outcome == "failed" for t in usable),
        incomplete=sum(t.outcome == "incomplete" for t in usable),
    )


def optimizer_forms(trials: Sequence[Trial]) -> Dict[str, Dict[str, int]]:
    """How many runs gave beta2 and weight decay per step, or in tokens (docs/configuration.md);
    an SGD run (optim.name=sgd) has no beta2."""
    forms: Dict[str, Dict[str, int]] = {"beta2": {}, "weight_decay": {}}
    for t in trials:
        for name, token_key in (
            ("beta2", "optim.beta2_half_life_tokens"),
            ("weight_decay", "optim.weight_decay_timescale_share"),
        ):
            if name == "beta2" and t.params.get("optim.name") == "sgd":
                continue
            form = "tokens" if t.number(token_key) else "per step"
            forms[name][form] = forms[name].get(form, 0) + 1
    return forms


# ---------------------------------------------------------------- the whole answer


def analyse(
    trials: Sequence[Trial],
    target_losses: Optional[Sequence[float]] = None,
    lr_criterion: str = "final_loss",
    smoothing_tokens: float = 0.0,
    primary_target: Optional[float] = None,
    branch_tolerance: Union[float, branch_cbs.Tolerance] = branch_cbs.DEFAULT_TOLERANCE,
    compare_with: Optional[Tuple[str, Sequence[Trial]]] = None,
    loss_tolerance: float = optimal_batch.DEFAULT_TOLERANCE,
) -> Answer:
    """The report's numbers. lr_criterion: which best lr per batch size the report names,
    `final_loss` or `steps` (fewest steps to the primary target). primary_target: a loss the
    user named (a bracket search's search.target_loss), reported at and made the primary.
    compare_with: a branch study's `branch.compare_with`, (the sweep's name, its runs).
    loss_tolerance: the share of the loss the recommendation trades for a larger batch."""
    if lr_criterion not in ("final_loss", "steps"):
        raise ValueError(f"lr_criterion {lr_criterion!r}: final_loss or steps")
    given = [t for t in trials if t.batch and t.train]  # the report's rows, in the order given
    if not given:
        raise ValueError("no run has both batch.tokens_per_update and a train/loss curve")
    usable = in_one_order(given)  # what is computed reads one order
    axes = swept_axes(usable)
    finished = [t for t in usable if t.outcome == "finished"]
    metric = "eval/loss" if finished and all(t.eval for t in finished) else "train/loss"
    best = best_per_batch(usable, axes, metric)
    study = steps_to_target.study(usable, axes, target_losses, smoothing_tokens, primary_target)
    if lr_criterion == "steps":  # the lr of fewest steps to the primary target
        best_lr = [BestLr(p.batch, p.lr, p.lr_edge) for p in (study.primary.points if study.primary else ())]
    else:
        best_lr = [BestLr(r.batch, r.lr, r.lr_edge) for r in best]
    name, scratch = compare_with or (None, ())
    branch = branch_analysis.study(trials, branch_tolerance, scratch, name)  # None unless a branch study
    read = set(usable) | ({t for t in trials if branch_analysis.is_branch(t)} if branch else set())
    return Answer(
        branch=branch,
        loss_metric=metric,
        axes=tuple(axes),
        targets_chosen=not target_losses,
        primary_target=primary_target,
        start_level=study.start_level,
        smoothing_tokens=smoothing_tokens,
        lr_criterion=lr_criterion,
        counts=counts(usable),
        best_per_batch=tuple(best),
        best_lr=tuple(best_lr),
        lr_scaling=lr_scaling(best_lr, axes),
        critical_batch=study.critical_batch,
        primary=study.primary,
        trend=study.trend,
        optimizer=optimizer_forms(usable),
        trials=tuple(row(t, metric) for t in given),
        skipped=tuple(t.name for t in trials if t not in read),
        recommendation=None
        if branch
        else what_to_run(usable, best, best_lr, axes, metric, loss_tolerance, lr_criterion),
    )


def what_to_run(
    usable: Sequence[Trial],
    best: Sequence[BestRow],
    best_lr: Sequence[BestLr],
    axes: Sequence[str],
    metric: str = "eval/loss",
    tolerance: float = optimal_batch.DEFAULT_TOLERANCE,
    lr_criterion: str = "final_loss",
) -> Optional[launch_choice.Recommendation]:
    """launch_choice.for_sweep on the best configuration per batch size with the one lr the answer
    names there (`best_lr`, by the answer's lr_criterion: final loss unless the command asked for
    fewest steps; a full run at this budget is judged by its final loss, and the lr of fewest steps
    to a loss can cost final loss: docs/benchmarks.md#recommended_run), the power law through those
    lrs when there is one, and whole sequences per worker as the unit; None for trials of several
    model sizes or budgets (a ladder recommends for its target instead)."""
    if any(len({t.params.get(key) for t in usable}) > 1 for key in ("model.params", "train.total_tokens")):
        return None
    named = {r.batch: r for r in best_lr}
    rows = [
        {
            "batch": r.batch,
            "final_loss": r.final_loss,
            "lr": named[r.batch].lr if r.batch in named else None,
            "run_id": r.run_id,
        }
        for r in best
    ]
    scaling = lr_scaling(list(best_lr), axes)
    law = (scaling.coef, scaling.alpha) if scaling.alpha is not None else None
    seq_len, workers = usable[0].number("data.seq_len"), usable[0].number("cluster.num_workers")
    found, why = sweep_tradeoff(usable, metric, rows, law, tolerance)
    unit = int(seq_len * (workers or 1)) if seq_len else None
    return launch_choice.for_sweep(rows, law, unit, tolerance, found, why, lr_criterion)


def sweep_tradeoff(usable: Sequence[Trial], metric: str, rows, law, tolerance: float):
    """(the trade-off of the sweep's own loss surface at its budget, why there is none): its B*,
    the penalties around it, the lr of each batch from the sweep's lr law (launch_choice.lr_at, as the
    recommendation reads it), its predicted loss (loss_surface.py, tradeoff.py)."""
    surface = loss_surface.fit(loss_surface.Grid.of(usable, metric))
    if surface is None:
        return None, "too few finished configurations for a loss surface"
    if surface.status != "resolved":
        return None, surface.notes[0]
    s = surface.summary()
    tokens = usable[0].number("train.total_tokens")
    return tradeoff.tradeoff(
        s.curve(), lambda b, _: (launch_choice.lr_at(b, rows, law)[0], None), tokens, tolerance, s.loss()
    ), None


def row(t: Trial, metric: str) -> TrialRow:
    return TrialRow(
        run_id=t.run_id,
        run_name=t.name,
        status=t.status,
        outcome=t.outcome,
        batch=t.batch,
        lr=t.lr,
        seed=t.params.get(SEED_KEY),
        warmup_tokens=t.params.get("schedule.warmup_tokens"),
        decay=t.params.get("schedule.decay"),
        final_loss=t.final(metric),
        final_train=t.final("train/loss"),
        final_eval=t.final("eval/loss"),
        tokens=t.tokens_seen,
        stopped_at=t.stopped_at,
        wall_s=t.duration_s,
    )
