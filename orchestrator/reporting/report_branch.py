"""A branch study's part of the report (orchestrator/analysis/branch_analysis.py's `BranchStudy`): the
method and the power law in sentences, the table of branch points, the suggested ramp; as printed
lines and as document blocks."""

from __future__ import annotations

import shlex
from typing import Any, Dict, List, Optional, Sequence, Tuple

from orchestrator.analysis import branch_ramp, branch_schedule
from orchestrator.analysis.answer import BranchStudy, ScheduleChoice
from orchestrator.reporting.report_format import TOK, G, S, aligned, cell, table

BRANCH_COLUMNS = [
    ("branch point (tokens)", "tokens", TOK),
    ("status", "status", S),
    ("critical batch", "shown", S),
    ("90% interval", "interval", S),
    ("B_simple there", "b_simple", TOK),
    ("factor-1 loss", "reference_loss", G),
    ("excess loss by batch", "excess_shown", S),
]
SCRATCH_COLUMN = ("from-scratch B_crit at that loss", "scratch_shown", S)
GROWTH = {
    "rising": "The critical batch size grows along training (the exponent's interval is above 0).",
    "plateau": "The growth is not resolved: the exponent's 90% interval holds 0, so the critical batch size may "
    "have levelled off (Merrill et al.'s plateau) or grow at any rate within it; the ramp grows no further than the "
    "measured points.",
    "falling": "The critical batch size falls along training (the exponent's interval is below 0); the ramp "
    "follows the measured points only.",
    "not resolved": "Two resolved points give no interval: the growth is not resolved, and the ramp follows the "
    "measured points only.",
}
"""What the power law's growth means for the reader (analysis/branch_ramp.growth)."""


def columns(branch: BranchStudy) -> List[Tuple[str, str, str]]:
    """The branch table's columns; the from-scratch B_crit after B_simple with branch.compare_with."""
    if not branch.compared_with:
        return BRANCH_COLUMNS
    return [*BRANCH_COLUMNS[:5], SCRATCH_COLUMN, *BRANCH_COLUMNS[5:]]


def _scratch_cell(scratch: Optional[Dict[str, Any]]) -> str:
    if not scratch or scratch["b_crit"] is None:
        return f"- ({scratch['status']})" if scratch else "-"
    mark = {"above": "> ", "below": "< "}.get(scratch["status"], "")
    low, high = scratch["b_crit_interval"] or (None, None)
    span = f" [{cell(low, TOK)} - {cell(high, TOK)}]" if low and high else ""
    return f"{mark}{cell(scratch['b_crit'], TOK)}{span} at {scratch['target_loss']:.4g}"


def table_rows(points: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per branch point, its cells as the report shows them."""
    out = []
    for p in points:
        mark = {"above": "> ", "below": "< "}.get(p["status"], "")
        low, high = p["cbs_interval"] or (None, None)
        interval = (
            f"{cell(low, TOK) if low else '...'} - {cell(high, TOK) if high else '...'}" if p["cbs_interval"] else "-"
        )
        excess = ", ".join(f"{cell(b, TOK)}: {e:+.1%}" for b, e in zip(p["batches"], p["excess"]))
        shown = mark + cell(p["cbs"], TOK) if p["cbs"] else "-"
        scratch = _scratch_cell(p.get("b_crit_scratch"))
        out.append({**p, "shown": shown, "interval": interval, "excess_shown": excess, "scratch_shown": scratch})
    return out


def sentences(branch: BranchStudy) -> List[str]:
    """The method and the power law, as sentences."""
    words = [
        f"Branches of {branch.base_run or 'the base run'} (B = {branch.base_batch:,} tokens per update) at "
        f"k x B with the lr x k^alpha; the critical batch size at a branch point is the largest branch batch whose "
        f"{branch.loss} is {branch.rule} (interpolated in log B; "
        "'>': every factor within, '<': factor 2 already beyond). Interval: 90%, from the eval loss's standard error, "
        "the seeds and the gap between the factors that bracket the crossing (Merrill et al. 2025, 'Critical Batch "
        "Size Revisited')."
    ]
    if branch.compared_with:
        words.append(
            f"From-scratch B_crit: the steps-to-target fit of sweep {branch.compared_with!r} at the base run's "
            "train loss at each branch point (an average along the path to that loss, not the value at the point)."
        )
    fit = branch.fit
    if fit:
        span = fit["exponent_interval"]
        within = f" (90% interval {span[0]:.2f} to {span[1]:.2f})" if span else " (2 points: no interval)"
        words.append(
            f"Power law over the {fit['points']} resolved points: critical batch ~ {fit['coef']:,.0f} tokens x "
            f"(tokens / {fit['t_ref']:,.0f})^{fit['exponent']:.2f}{within}. {GROWTH[fit['growth']]}"
        )
    else:
        words.append("Power law: fewer than 2 resolved branch points.")
    words += [f"Note: {note}." for note in branch.notes]
    return words


SCHEDULE_COLUMNS = [
    ("schedule", "name", S),
    ("batches", "batches", S),
    ("updates", "updates", TOK),
    ("predicted loss vs the base", "excess_shown", S),
    ("upper end", "high_shown", S),
]


def schedule_rows(choice: ScheduleChoice) -> List[Dict[str, Any]]:
    """One row per arm of the comparison (branch_schedule.compare), its cells as the report shows them."""

    def pct(x: Optional[float]) -> str:
        return "- (not measured)" if x is None else f"{x:+.2%}"

    return [
        {
            "name": arm.name + (" (chosen)" if arm.name == choice.chosen else ""),
            "batches": " -> ".join(f"{b:,}" for _, b in arm.ramp),
            "updates": arm.updates,
            "excess_shown": pct(arm.excess),
            "high_shown": pct(arm.excess_high),
        }
        for arm in choice.arms
    ]


def schedule_sentence(choice: ScheduleChoice) -> str:
    """How the schedules are compared, and the choice with its reason."""
    return (
        "Schedules against the fixed batches: each predicted at the budget from the branches' gaps (a stretch at "
        "k x B costs the factor-k branch's excess there, times its length over the branch's, never less than one "
        "branch's; gains are not counted; before the first branch point a larger batch is taken to make no more "
        f"progress per update than the base); the upper end adds {branch_schedule.Z_UPPER:.4g} standard errors to "
        f"every gap."
        + (
            " A fixed batch marked trained is measured instead: branch.compare_with's best run at that batch and the "
            "budget, its final eval loss over the base run's, the upper end "
            f"{branch_schedule.Z_UPPER:.4g} standard errors of that difference above."
            if any(a.trained for a in choice.arms)
            else ""
        )
        + f" Chosen, the fewest updates whose upper end is within {choice.tolerance:.1%} of the best fixed "
        f"batch ({choice.best_fixed}): {choice.chosen}; {choice.why}."
    )


def _comparison(branch: BranchStudy) -> List[tuple]:
    choice = branch.schedule_choice
    return [] if choice is None else [("p", schedule_sentence(choice)), table(schedule_rows(choice), SCHEDULE_COLUMNS)]


def lines(branch: BranchStudy) -> List[str]:
    """A branch study's answer: the table, the power law, the schedules against the fixed batches, the
    one to train with."""
    header, cells = table(table_rows(branch.points), columns(branch))[1:]
    out = ["Critical batch size along training:", *sentences(branch), *aligned(header, cells)]
    for kind, *rest in _comparison(branch):
        out += [rest[0]] if kind == "p" else aligned(*rest)
    advice = branch.advice
    if advice == "base":
        return out + [no_ramp(branch)]
    if advice == "fixed":
        return out + [f"Train at a fixed {_fixed_batch(branch):,} tokens per update: {command(branch)}"]
    out += [
        f"Suggested batch ramp (doubles where the critical batch size passes {branch_ramp.THRESHOLD:g} x the batch):"
    ]
    out += ["  " + line for line in branch.ramp_yaml.splitlines()]
    return out + [f"  or: {command(branch)}"]


def _fixed_batch(branch: BranchStudy) -> int:
    return int(branch.schedule_choice.chosen_ramp[0][1]) if branch.schedule_choice else branch.base_batch


def no_ramp(branch: BranchStudy) -> str:
    """Why neither a ramp nor a larger fixed batch is suggested."""
    if len(branch.ramp) > 1:  # the comparison chose the base over it
        reason = (
            "the ramp the critical batch size suggests is not predicted within the tolerance of the best fixed batch"
        )
    else:
        reason = (
            f"the measured critical batch size (a resolved point read at the lower end of its 90% interval) does "
            f"not pass {branch_ramp.THRESHOLD:g} x the batch early enough to double within the budget"
        )
    return f"No batch ramp suggested: {reason}; train at the base's {branch.base_batch:,} tokens per update."


def command(branch: BranchStudy) -> str:
    """The advice as one command to paste: the ramp's keys, or a fixed batch and its lr, each override
    quoted for the shell."""
    if branch.advice == "fixed":
        lr = branch.schedule_choice.chosen_lr if branch.schedule_choice else None
        keys = [f"batch.tokens_per_update={_fixed_batch(branch)}"] + ([f"optim.lr={lr:.4g}"] if lr else [])
        return "orchestrator train CONFIG " + shlex.join(keys)
    return "orchestrator train CONFIG " + shlex.join(branch.ramp_overrides)


def blocks(branch: BranchStudy) -> List[tuple]:
    """The same as document blocks, for summary.md and summary.html."""
    out = [("h2", "Critical batch size along training (branches)")]
    out += [("p", sentence) for sentence in sentences(branch)]
    out += [table(table_rows(branch.points), columns(branch)), *_comparison(branch)]
    advice = branch.advice
    if advice == "base":
        return out + [("p", no_ramp(branch))]
    if advice == "fixed":
        return out + [("p", f"Train at a fixed {_fixed_batch(branch):,} tokens per update:"), ("code", command(branch))]
    out += [("p", "Suggested batch ramp, to paste into a train config:"), ("pre", branch.ramp_yaml)]
    return out + [("p", "or on the command line:"), ("code", command(branch))]
