"""Rendering of `orchestrator report`: the analysis's answer (`sweep_analysis.analyse`) as text. The
answer paragraph, the tables and the summary as a document of blocks (report_format.py turns it
into Markdown and HTML; report_branch.py renders a branch study's part); `summary_lines` is what
`report` and the end of `sweep` print. No MLflow, no files: the report pipeline (pipeline.py)
reads the trials and writes what this module renders.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from orchestrator.analysis.answer import Answer, Counts, TargetFit, Trend
from orchestrator.analysis.trials import BATCH_KEY, LR_KEY
from orchestrator.formulas.schedules import TRUSTED_SHARE
from orchestrator.reporting import report_branch, report_tradeoff
from orchestrator.reporting.report_format import TOK, G, S, aligned, cell, lr_text, table

AXIS_LABELS = {
    "batch.tokens_per_update": "batch size",
    "optim.lr": "lr",
    "schedule.warmup_tokens": "warmup",
    "schedule.decay": "decay",
    "schedule.min_lr_ratio": "min lr ratio",
    "schedule.wsd_decay_share": "wsd decay share",
    "optim.weight_decay": "weight decay",
}
TOKEN_KEYS = {"batch.tokens_per_update", "schedule.warmup_tokens"}


def _setting(key: str, value: Any) -> str:
    """A swept value as the reader wants it: token counts as 16Ki, numbers short, text as is."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return cell(value, "tok") if key in TOKEN_KEYS else cell(value)


def _label(key: str) -> str:
    return AXIS_LABELS.get(key, key)


def _describe(settings: Dict[str, Any]) -> str:
    return ", ".join(f"{_label(k)} {_setting(k, v)}" for k, v in settings.items() if k != BATCH_KEY)


def _stopped(counts: Counts) -> str:
    rungs = ", ".join(f"{n} at the {cell(float(t), 'tok')}-token rung" for t, n in counts.stopped_rungs.items())
    return f"{counts.stopped} stopped early" + (f" ({rungs})" if rungs else "")


def answer(result: Answer) -> str:
    """One paragraph: the best configuration, early stopping, B_crit with its status, interval
    and trend beside B_simple, and the edges of the swept ranges."""
    best, p, n = result.best, result.primary, len(result.trials)
    if best:
        seeds = f", mean of {best.seeds} seeds" if best.seeds > 1 else ""
        trained = f", trained at lr {_setting(LR_KEY, best.settings[LR_KEY])}" if best.settings.get(LR_KEY) else ""
        others = {k: v for k, v in best.settings.items() if k != LR_KEY}
        text = (
            f"Best configuration: B = {cell(best.batch, 'tok')} tokens per update"
            f"{', ' + _describe(others) if _describe(others) else ''}: "
            f"final {result.loss_metric} {cell(best.final_loss)} (run {best.run_name}{trained}{seeds})."
        )
        named = result.lrs_by(result.lr_criterion).get(best.batch)
        if named and named.lr is not None:  # the table's lr for this batch size, by the same criterion
            text += (
                f" Best interpolated lr at B = {cell(best.batch, 'tok')} by {CRITERIA[result.lr_criterion]}: "
                f"{lr_text(named.lr, named.edge)}."
            )
        rec = result.recommendation
        smallest = len(result.best_per_batch) > 1 and best.batch == min(r.batch for r in result.best_per_batch)
        if smallest and not (rec and rec.found):
            text += " That is the smallest batch tried: on these runs the loss keeps falling towards smaller batches."
    else:
        text = "No trial reached its budget, so there is no best configuration."
    text += f" {result.counts.finished} of {n} trials reached the budget; {_stopped(result.counts)}."
    if p is None:
        return text + " No loss level to measure the critical batch size at."
    text += " " + critical_batch_sentence(p)
    if p.status == "resolved":  # what B_crit is for, once
        text += (
            " (B_crit is what more data-parallel hardware buys: up to about it, a larger batch reaches that loss in "
            "proportionally fewer steps; at B_crit, in twice the fewest steps for twice the fewest tokens.)"
        )
    text += _trend_sentence(result.trend)
    scaling = result.lr_scaling
    if scaling.alpha is not None:
        text += (
            f" The best learning rate scales as B^{round(scaling.alpha, 2) + 0.0:.2f} ({scaling.points} batch sizes)."
        )
    return text + _edge_warning(result)


def critical_batch_sentence(p: TargetFit) -> str:
    """'At loss 3.2 the critical batch size is B_crit = 700 tokens (90% interval ...).'"""
    status, target = p.status, f"{p.target_loss:.4g}"
    shown = [note for note in p.notes if not note.startswith(("not resolved", "below", "above"))]
    if status == "resolved":
        lo_hi = p.b_crit_interval
        parts = ["resolved"] + (
            [f"90% interval over seeds {cell(lo_hi[0], 'tok')} - {cell(lo_hi[1], 'tok')}"] if lo_hi else []
        )
        parts += [f"{len(p.points)} batch sizes", *shown]
        b_crit = cell(p.b_crit, TOK)
        text = f"At loss {target} the critical batch size is B_crit = {b_crit} tokens ({'; '.join(parts)})"
    elif status in ("below", "above"):
        sign, where = ("<", "under the smallest") if status == "below" else (">", "over the largest")
        parts = [f"{len(p.points)} batch sizes", *shown]
        text = (
            f"At loss {target} B_crit {sign} {cell(p.b_crit_bound, TOK)} tokens: {where} batch size swept, so "
            f"only a bound ({'; '.join(parts)})"
        )
    else:
        why = next((note.removeprefix("not resolved: ") for note in p.notes if note.startswith("not resolved")), "")
        text = f"Critical batch size at loss {target}: not resolved ({why})"
    return text + (
        f"; measured B_simple at that loss: {cell(p.b_simple, 'tok')} tokens."
        if p.b_simple
        else "; B_simple not measured."
    )


def _trend_sentence(trend: Trend) -> str:
    """How B_crit and B_simple move as the target loss falls (negative slopes: they rise)."""
    slope = trend.b_crit_slope
    if slope is None:
        return ""
    interval = trend.b_crit_slope_interval
    band = f" (90% interval {interval[0]:+.2f} to {interval[1]:+.2f})" if interval else ""
    settled = interval and (interval[0] > 0 or interval[1] < 0)
    way = ("rises" if slope < 0 else "falls") if settled or not interval else "does not clearly move"
    text = f" Across {len(trend.targets)} targets B_crit {way} as the loss falls: "
    text += f"d log B_crit / d log loss = {slope:+.2f}{band}"
    if trend.b_simple_slope is not None:
        text += f"; B_simple's is {trend.b_simple_slope:+.2f}"
    if settled:  # the slope in the words a researcher uses: the fall in loss that doubles (halves) it
        fall = 1 - 2 ** (-1 / abs(slope))
        text += f"; B_crit about {'doubles' if slope < 0 else 'halves'} for each {fall:.0%} fall in loss"
    return text + "." + (f" {trend.note}." if trend.note else "")


def what_to_run(result: Answer) -> List[str]:
    """The recommendation (analysis/launch_choice.py) as sentences, and how to launch it; [] without one."""
    rec = result.recommendation
    if rec is None:
        return []
    head = f"What to run at this budget: B = {cell(rec.tokens_per_update, TOK)} tokens per update, lr {rec.lr:.3g}"
    if rec.launchable:
        head += " (recommended.yaml in the report's folder: `orchestrator plan` it, then `orchestrator train` it)"
    head += "."
    return [head, *rec.rule]


def _edge_warning(result: Answer) -> str:
    """'The best lr is the highest tried at 3 of 5 batch sizes: ...' for the lr the report names
    and for every other swept axis, per side."""
    counts: Dict[Tuple[str, str], int] = {}
    for r in result.best_lr:
        if r.edge in ("lowest", "highest"):
            counts["optim.lr", r.edge] = counts.get(("optim.lr", r.edge), 0) + 1
    for row in result.best_per_batch:
        for key, side in row.edges.items():
            if key != "optim.lr":
                counts[key, side] = counts.get((key, side), 0) + 1
    n = len(result.best_lr) or len(result.best_per_batch)
    return "".join(
        f" The best {_label(key)} is the {side} tried at {k} of {n} batch sizes: "
        f"the optimum may lie {'below' if side == 'lowest' else 'above'} the swept range"
        + (" (search.algorithm: bracket extends it)." if key == "optim.lr" else ".")
        for (key, side), k in sorted(counts.items())
    )


CRITERIA = {"final_loss": "final loss", "steps": "fewest steps to the primary target"}


def per_batch_table(result: Answer) -> Tuple[List[str], List[List[str]]]:
    """Header and rows: per batch size the one best lr (its criterion named), the best value of
    every other swept axis and its final loss."""
    axes = [k for k in result.axes if k not in (BATCH_KEY, LR_KEY)]
    lrs = result.lrs_by(result.lr_criterion)
    header = ["batch size", f"best lr ({CRITERIA[result.lr_criterion]})", *map(_label, axes)]
    header += [f"final {result.loss_metric}", "seeds", "run"]
    rows = [
        [
            cell(r.batch, "tok"),
            lr_text(lrs[r.batch].lr, lrs[r.batch].edge) if r.batch in lrs else "-",
            *(_setting(k, r.settings.get(k)) for k in axes),
            cell(r.final_loss) + (f" ± {cell(r.spread, '{:.2g}')}" if r.spread is not None else ""),
            str(r.seeds),
            r.run_name,
        ]
        for r in result.best_per_batch
    ]
    return header, rows


def summary_lines(result: Answer) -> List[str]:
    """What `report` and the end of `sweep` print: the answer and the best configuration per batch
    size (for a branch study: the critical batch size along training and the ramp it suggests)."""
    if result.branch:
        return report_branch.lines(result.branch)
    header, rows = per_batch_table(result)
    swept = ", ".join(map(_label, result.axes)) or "nothing"
    lines = [answer(result), f"best configuration per batch size (swept: {swept}):"]
    return lines + aligned(header, rows) + what_to_run(result)[:1]


TARGET_COLUMNS = [
    ("target loss", "target_loss", G),
    ("status", "status", S),
    ("B_crit", "shown", S),
    ("90% interval", "interval", S),
    ("B_simple", "b_simple", TOK),
    ("S_min", "s_min", G),
    ("E_min", "e_min", TOK),
    ("lack of fit p", "lof", "{:.2g}"),
    ("batch sizes", "n", S),
    ("notes", "note", S),
]
COST_COLUMNS = [
    ("batch size", "batch", TOK),
    ("steps from L_a", "steps", "{:,.1f}"),
    ("tokens from L_a", "tokens", "{:,.0f}"),
    ("tokens from start", "tokens_to_target", "{:,.0f}"),
    ("wall time (s)", "wall_s", "{:.1f}"),
    ("lr of fewest steps", "lr_shown", S),
    ("seeds", "seeds", S),
    ("B_simple", "b_simple", TOK),
    ("clipped", "clipped", "{:.0%}"),
    ("run", "run_name", S),
]
TRIAL_COLUMNS = [
    ("run", "run_name", S),
    ("outcome", "outcome", S),
    ("batch", "batch", TOK),
    ("lr", "lr", G),
    ("seed", "seed", S),
    ("warmup", "warmup_tokens", S),
    ("decay", "decay", S),
    ("final train", "final_train", G),
    ("final eval", "final_eval", G),
    ("tokens", "tokens", "{:,}"),
    ("stopped at", "stopped_at", TOK),
    ("wall (s)", "wall_s", "{:.1f}"),
]


def _b_crit_cell(f: TargetFit) -> str:
    if f.status == "resolved":
        return cell(f.b_crit, TOK)
    if f.status in ("below", "above"):
        return ("< " if f.status == "below" else "> ") + cell(f.b_crit_bound, TOK)
    return "-"


def _settings_from(source) -> str:
    """Where the analysis settings came from (report_inputs.settings), when any is not a default."""
    named = {k: v for k, v in (source.settings if source else {}).items() if v != "default"}
    if not named:
        return ""
    return " Settings: " + "; ".join(f"{k.replace('_', ' ')} from {v}" for k, v in named.items()) + "."


def overview(result: Answer) -> str:
    """What was read: how many trials, of what, swept over what, how they ended."""
    metric, counts = result.loss_metric, result.counts
    swept = ", ".join(map(_label, result.axes)) or "nothing"
    return (
        f"{len(result.trials)} trials of {_where(result)}; "
        f"swept: {swept}. Final losses compare the {counts.finished} trials that reached the budget, "
        f"on {metric}; "
        f"{_stopped(counts)}, {counts.failed} failed, {counts.incomplete} incomplete. "
        f"Optimizer constants: {_forms(result.optimizer)}." + _settings_from(result.source)
    )


BEST_RUNS_FIGURE = "loss_vs_tokens_best.png"
"""The decision figure where the sweep's loss surface gives no trade-off: the recommendation is then
B_opt, read off the best final loss per batch size, which this figure draws along training."""
BEST_RUNS_CAPTION = (
    "The best configuration's run at each batch size, loss against tokens: the final losses the choice of "
    "batch size compares (the table below gives their means over seeds)."
)


def document(result: Answer, name: str, images: Sequence[str], ladder: Sequence[tuple] = ()) -> List[tuple]:
    """The summary as blocks: ("h1".."h3", text), ("p", text), ("pre", YAML), ("code", a command),
    ("table", header, rows), ("img", file). A table without rows is left out. `ladder`: a ladder's
    blocks (report_ladder.part), which replace the single-sweep answer: its rungs are never pooled.
    A single sweep's opens with the answer, what to run and the decision figure (the trade-off's where
    its loss surface has one, else BEST_RUNS_FIGURE); `images` follow in their order under Figures."""
    if result.branch:
        return _branch_document(result, name, images)
    if ladder:
        figures = [("img", f) for f in images]
        trials = table([t.to_json() for t in result.trials], TRIAL_COLUMNS)
        doc = [("h1", f"Report: {name}"), ("p", overview(result)), *ladder, ("h2", "Figures of every run"), *figures]
        return doc + [("h2", "All trials"), trials] + _skipped(result)
    scaling = result.lr_scaling
    targets = [
        {
            "target_loss": f.target_loss,
            "status": f.status,
            "shown": _b_crit_cell(f),
            "interval": " - ".join(cell(x, TOK) for x in f.b_crit_interval or []),
            "b_simple": f.b_simple,
            "s_min": f.s_min,
            "e_min": f.e_min,
            "lof": f.lack_of_fit.p,
            "n": len(f.points),
            "note": "; ".join(f.notes) or "-",
        }
        for f in result.critical_batch
    ]
    how = "chosen automatically" if result.targets_chosen else "given"
    if result.primary_target is not None:
        how += f", and {result.primary_target:.4g}, the primary, named by the sweep (search.target_loss)"
    law = scaling.note if scaling.alpha is None else f"lr_opt ~ {scaling.coef:.3g} x B^{scaling.alpha:.3f}"
    start = result.start_level
    found = result.recommendation.found if result.recommendation else None
    decision = report_tradeoff.FIGURE if found else BEST_RUNS_FIGURE
    doc = [
        ("h1", f"Report: {name}"),
        ("p", answer(result)),
        *([("h2", "What to run"), ("p", " ".join(what_to_run(result)))] if result.recommendation else []),
        *(report_tradeoff.blocks(found, "The batch-size trade-off") if found else []),
        *([("p", BEST_RUNS_CAPTION), ("img", decision)] if not found and decision in images else []),
        ("p", overview(result)),
        ("h2", "Best configuration per batch size"),
        (
            "p",
            "Per batch size, the configuration (one value of every swept axis) with the lowest final loss, "
            "averaged over its seeds (± their standard deviation). The best lr is one number per batch size, "
            f"by {CRITERIA[result.lr_criterion]}: the vertex of a parabola through the best lr tried and its "
            "neighbours (<= or >=: the best is the lowest or highest tried, so the optimum may lie beyond).",
        ),
        ("table", *per_batch_table(result)),
        ("h2", "Critical batch size"),
        (
            "p",
            f"Target losses {how}. Steps are read from a monotone (isotonic) fit of each run's train/loss, so no "
            "smoothing window moves them, and only where the schedule cannot fake progress: before the decay of "
            f"wsd, anywhere for constant, in the first {TRUSTED_SHARE:.0%} of the budget for cosine and linear. "
            + (f"They are counted from L_a = {start:.4g}, " if start is not None else "They are counted from L_a, ")
            + "the lowest loss any run had at the end of its warmup, so no warmup step is in them. Per batch size "
            "the fewest steps over lr come from a parabola in the lr through the best configuration and its "
            "neighbours; S = S_min + E_min / B is fitted in log steps, weighted by each point's seed spread, and "
            "B_crit = E_min / S_min. Status: resolved, below or above (B_crit outside the batch sizes swept: only "
            "a bound), not resolved (fewer than 3 batch sizes reach the target). The interval is a bootstrap over "
            "seeds that redoes the choice of the best lr in every resample: how far B_crit would move with other "
            "seeds. The lack-of-fit p-value tests the hyperbola against the seeds' own spread. B_simple is the "
            "measured gradient noise scale where those trials reach the target "
            "(rules: orchestrator/analysis/sweep_analysis.py).",
        ),
        *([table(targets, TARGET_COLUMNS)] if targets else []),
    ]
    for f in (f for f in result.critical_batch if f.points):  # a target no batch size reaches has no costs
        points = [{**p.to_json(), "lr_shown": lr_text(p.lr, p.lr_edge)} for p in f.points]
        doc += [("h3", f"Cost to reach loss {f.target_loss:.4g}"), table(points, COST_COLUMNS)]
    doc += [
        ("h2", "Learning rate vs batch size"),
        ("p", f"Best lr per batch size ({CRITERIA[result.lr_criterion]}), interior ones only: {law}."),
        ("h2", "Figures"),
        *[("img", f) for f in images if f != decision],  # the decision figure is near the top
        ("h2", "All trials"),
        table([t.to_json() for t in result.trials], TRIAL_COLUMNS),
    ]
    return doc + _skipped(result)


def _where(result: Answer) -> str:
    src = result.source
    return f"{src.kind} {src.run_id or ''} in {src.uri}" if src else "?  in ?"


def _skipped(result: Answer) -> List[tuple]:
    if not result.skipped:
        return []
    return [("p", "Skipped (no batch.tokens_per_update or no train/loss): " + ", ".join(result.skipped))]


def _branch_document(result: Answer, name: str, images: Sequence[str]) -> List[tuple]:
    """A branch study's summary: its answer (report_branch.blocks), the runs it read and the
    figures. One base run answers no from-scratch question, so none of its tables is shown."""
    base = result.best
    runs = f"the base run {base.run_name} (final {result.loss_metric} {cell(base.final_loss)})" if base else "branches"
    read = (
        f"Runs of {_where(result)}: {runs} and its branches, each read as one branch (the table above), "
        "not as a point of a from-scratch fit (branch.compare_with compares with a sweep of batch sizes)."
        + _settings_from(result.source)
    )
    doc = [("h1", f"Report: {name}"), *report_branch.blocks(result.branch), ("p", read), ("h2", "Figures")]
    return doc + [("img", f) for f in images] + _skipped(result)


def _forms(forms: Dict[str, Dict[str, int]]) -> str:
    """'beta2 per step (15 runs), weight decay in tokens (15 runs)'."""
    words = {"beta2": "beta2", "weight_decay": "weight decay"}
    return ", ".join(
        f"{words[name]} " + " and ".join(f"{form} ({n} runs)" for form, n in sorted(counts.items()))
        for name, counts in forms.items()
        if counts
    )
