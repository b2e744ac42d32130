"""Rendering of `orchestrator report`: the analysis result (`analysis.analyse`) as text. The
answer paragraph, the tables, the summary as a document of blocks and that document as Markdown
and HTML; `summary_lines` is what `sweep` prints when it ends. No MLflow, no files: report.py
reads the trials and writes what this module renders.
"""

from __future__ import annotations

import html
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from orchestrator.schedules import TRUSTED_SHARE
from orchestrator.trials import BATCH_KEY, LR_KEY

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


def _n(x: Any, fmt: str = "{:.4g}") -> str:
    """A table cell: '-' when missing, 'inf' when infinite; fmt "tok" for token counts."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    from orchestrator.plots import fmt_tokens

    return fmt_tokens(round(x)) if fmt == "tok" else fmt.format(x)


def _setting(key: str, value: Optional[str]) -> str:
    """A swept value as the reader wants it: token counts as 16Ki, numbers short, text as is."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return value or "-"
    return _n(number, "tok") if key in TOKEN_KEYS else _n(number)


def _label(key: str) -> str:
    return AXIS_LABELS.get(key, key)


def _describe(settings: Dict[str, Optional[str]]) -> str:
    return ", ".join(f"{_label(k)} {_setting(k, v)}" for k, v in settings.items() if k != BATCH_KEY)


def _stopped(result: Dict[str, Any]) -> str:
    stopped = result["stopped"]
    rungs = ", ".join(f"{n} at the {_n(float(t), 'tok')}-token rung" for t, n in stopped["rungs"].items())
    return f"{stopped['count']} stopped early" + (f" ({rungs})" if rungs else "")


def answer(result: Dict[str, Any]) -> str:
    """One paragraph: the best configuration, early stopping, B_crit with its status, interval
    and trend beside B_simple, and the edges of the swept ranges."""
    best, p, n = result["best"], result["primary"], len(result["trials"])
    if best:
        seeds = f", mean of {best['seeds']} seeds" if best["seeds"] > 1 else ""
        text = (
            f"Best configuration: B = {_n(best['batch'], 'tok')} tokens per update, "
            f"{_describe(best['settings']) or 'the base config'}: "
            f"final {result['loss_metric']} {_n(best['final_loss'])} (run {best['run_name']}{seeds})."
        )
    else:
        text = "No trial reached its budget, so there is no best configuration."
    text += f" {result['finished']} of {n} trials reached the budget; {_stopped(result)}."
    if p is None:
        return text + " No loss level to measure the critical batch size at."
    text += " " + critical_batch_sentence(p)
    text += _trend_sentence(result["trend"])
    alpha, scaling = result["lr_scaling"]["alpha"], result["lr_scaling"]
    if alpha is not None:
        text += f" The best learning rate scales as B^{round(alpha, 2) + 0.0:.2f} ({scaling['points']} batch sizes)."
    return text + _edge_warning(result)


def critical_batch_sentence(p: Dict[str, Any]) -> str:
    """'At loss 3.2 the critical batch size is B_crit = 700 tokens (90% interval ...).'"""
    status, target = p["status"], f"{p['target_loss']:.4g}"
    shown = [note for note in p["notes"] if not note.startswith(("not resolved", "below", "above"))]
    if status == "resolved":
        lo_hi = p["b_crit_interval"]
        parts = ["resolved"] + (
            [f"90% interval over seeds {_n(lo_hi[0], 'tok')} - {_n(lo_hi[1], 'tok')}"] if lo_hi else []
        )
        parts += [f"{len(p['points'])} batch sizes", *shown]
        text = (
            f"At loss {target} the critical batch size is B_crit = {_n(p['b_crit'], 'tok')} tokens ({'; '.join(parts)})"
        )
    elif status in ("below", "above"):
        sign, where = ("<", "under the smallest") if status == "below" else (">", "over the largest")
        parts = [f"{len(p['points'])} batch sizes", *shown]
        text = (
            f"At loss {target} B_crit {sign} {_n(p['b_crit_bound'], 'tok')} tokens: {where} batch size swept, so only "
            f"a bound ({'; '.join(parts)})"
        )
    else:
        why = next((note.removeprefix("not resolved: ") for note in p["notes"] if note.startswith("not resolved")), "")
        text = f"Critical batch size at loss {target}: not resolved ({why})"
    return text + (
        f"; measured B_simple at that loss: {_n(p['b_simple'], 'tok')} tokens."
        if p["b_simple"]
        else "; B_simple not measured."
    )


def _trend_sentence(trend: Dict[str, Any]) -> str:
    """How B_crit and B_simple move as the target loss falls (negative slopes: they rise)."""
    slope = trend["b_crit_slope"]
    if slope is None:
        return ""
    interval = trend["b_crit_slope_interval"]
    band = f" (90% interval {interval[0]:+.2f} to {interval[1]:+.2f})" if interval else ""
    settled = interval and (interval[0] > 0 or interval[1] < 0)
    way = ("rises" if slope < 0 else "falls") if settled or not interval else "does not clearly move"
    text = f" Across {len(trend['targets'])} targets B_crit {way} as the loss falls: "
    text += f"d log B_crit / d log loss = {slope:+.2f}{band}"
    if trend["b_simple_slope"] is not None:
        text += f"; B_simple's is {trend['b_simple_slope']:+.2f}"
    return text + "." + (f" {trend['note']}." if trend["note"] else "")


def _edge_warning(result: Dict[str, Any]) -> str:
    """'The best lr is the highest tried at 3 of 5 batch sizes: ...' for the lr the report names
    and for every other swept axis, per side."""
    counts: Dict[Tuple[str, str], int] = {}
    for r in result["best_lr"]:
        if r["edge"] in ("lowest", "highest"):
            counts["optim.lr", r["edge"]] = counts.get(("optim.lr", r["edge"]), 0) + 1
    for r in result["best_per_batch"]:
        for key, side in r["edges"].items():
            if key != "optim.lr":
                counts[key, side] = counts.get((key, side), 0) + 1
    n = len(result["best_lr"]) or len(result["best_per_batch"])
    return "".join(
        f" The best {_label(key)} is the {side} tried at {k} of {n} batch sizes: "
        f"the optimum may lie {'below' if side == 'lowest' else 'above'} the swept range"
        + (" (search.algorithm: bracket extends it)." if key == "optim.lr" else ".")
        for (key, side), k in sorted(counts.items())
    )


CRITERIA = {"final_loss": "final loss", "steps": "fewest steps to the primary target"}


def per_batch_table(result: Dict[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """Header and rows: per batch size the one best lr (its criterion named), the best value of
    every other swept axis and its final loss."""
    axes = [k for k in result["axes"] if k not in (BATCH_KEY, LR_KEY)]
    lrs = {r["batch"]: r for r in result["best_lr"]}
    header = ["batch size", f"best lr ({CRITERIA[result['lr_criterion']]})", *map(_label, axes)]
    header += [f"final {result['loss_metric']}", "seeds", "run"]
    rows = [
        [
            _n(r["batch"], "tok"),
            _lr_cell(lrs.get(r["batch"])),
            *(_setting(k, r["settings"].get(k)) for k in axes),
            _n(r["final_loss"]) + (f" ± {_n(r['spread'], '{:.2g}')}" if r["spread"] is not None else ""),
            str(r["seeds"]),
            r["run_name"],
        ]
        for r in result["best_per_batch"]
    ]
    return header, rows


def _lr_cell(row: Optional[Dict[str, Any]]) -> str:
    """The best lr, with <= or >= when it is the lowest or highest tried (a bound)."""
    if not row or row["lr"] is None:
        return "-"
    return {"lowest": "<= ", "highest": ">= "}.get(row["edge"], "") + _n(row["lr"], "{:.3g}")


def summary_lines(result: Dict[str, Any]) -> List[str]:
    """What `sweep` prints when it ends: the answer and the best configuration per batch size
    (for a branch study: the critical batch size along training and the ramp it suggests)."""
    if result.get("branch"):
        return branch_lines(result["branch"])
    header, rows = per_batch_table(result)
    swept = ", ".join(map(_label, result["axes"])) or "nothing"
    lines = [answer(result), f"best configuration per batch size (swept: {swept}):"]
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [header, *rows]]
    return lines


G, S, TOK = "{:.4g}", "{}", "tok"  # cell formats: number, text, token count
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


def _branch_columns(branch: Dict[str, Any]) -> List[Tuple[str, str, str]]:
    """The branch table's columns; the from-scratch B_crit after B_simple with branch.compare_with."""
    if not branch.get("compared_with"):
        return BRANCH_COLUMNS
    return [*BRANCH_COLUMNS[:5], SCRATCH_COLUMN, *BRANCH_COLUMNS[5:]]


def _scratch_cell(scratch: Optional[Dict[str, Any]]) -> str:
    if not scratch or scratch["b_crit"] is None:
        return f"- ({scratch['status']})" if scratch else "-"
    mark = {"above": "> ", "below": "< "}.get(scratch["status"], "")
    low, high = scratch["b_crit_interval"] or (None, None)
    span = f" [{_n(low, TOK)} - {_n(high, TOK)}]" if low and high else ""
    return f"{mark}{_n(scratch['b_crit'], TOK)}{span} at {scratch['target_loss']:.4g}"


def _branch_rows(points: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    rows = []
    for p in points:
        mark = {"above": "> ", "below": "< "}.get(p["status"], "")
        low, high = p["cbs_interval"] or (None, None)
        interval = (
            f"{_n(low, TOK) if low else '...'} - {_n(high, TOK) if high else '...'}" if p["cbs_interval"] else "-"
        )
        excess = ", ".join(f"{_n(b, TOK)}: {e:+.1%}" for b, e in zip(p["batches"], p["excess"]))
        shown = mark + _n(p["cbs"], TOK) if p["cbs"] else "-"
        scratch = _scratch_cell(p.get("b_crit_scratch"))
        rows.append({**p, "shown": shown, "interval": interval, "excess_shown": excess, "scratch_shown": scratch})
    return rows


def _branch_text(branch: Dict[str, Any]) -> List[str]:
    """The method and the power law, as sentences."""
    words = [
        f"Branches of {branch['base_run'] or 'the base run'} (B = {branch['base_batch']:,} tokens per update) at "
        f"k x B with the lr x k^alpha; the critical batch size at a branch point is the largest branch batch whose "
        f"{branch['loss']} is within {branch['tolerance']:.1%} of the factor-1 branch's (interpolated in log B; "
        "'>': every factor within, '<': factor 2 already beyond). Interval: 90%, from the eval loss's standard error "
        "and the seeds (Merrill et al. 2025, 'Critical Batch Size Revisited')."
    ]
    if branch.get("compared_with"):
        words.append(
            f"From-scratch B_crit: the steps-to-target fit of sweep {branch['compared_with']!r} at the base run's "
            "train loss at each branch point (an average along the path to that loss, not the value at the point)."
        )
    fit = branch["fit"]
    if fit:
        span = fit["exponent_interval"]
        within = f" (90% interval {span[0]:.2f} to {span[1]:.2f})" if span else " (2 points: no interval)"
        words.append(
            f"Power law over the {fit['points']} resolved points: critical batch ~ {fit['coef']:,.0f} tokens x "
            f"(tokens / {fit['t_ref']:,.0f})^{fit['exponent']:.2f}{within}."
        )
    else:
        words.append("Power law: fewer than 2 resolved branch points.")
    words += [f"Note: {note}." for note in branch.get("notes", [])]
    return words


def branch_lines(branch: Dict[str, Any]) -> List[str]:
    """A branch study's answer: the table, the power law, the suggested ramp."""
    rows = _branch_rows(branch["points"])
    header, cells = _table(rows, _branch_columns(branch))[1:]
    widths = [max(len(c) for c in col) for col in zip(header, *cells)]
    lines = ["Critical batch size along training:", *_branch_text(branch)]
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [header, *cells]]
    lines += ["Suggested batch ramp (doubles where the critical batch size passes twice the batch):"]
    lines += ["  " + line for line in branch["ramp_yaml"].splitlines()]
    lines += [f"  or: orchestrator train CONFIG '{branch['ramp_override']}'"]
    return lines


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


def _table(rows: Sequence[Dict[str, Any]], columns: Sequence[Tuple[str, str, str]]) -> tuple:
    return ("table", [c[0] for c in columns], [[_n(row.get(key), fmt) for _, key, fmt in columns] for row in rows])


def _b_crit_cell(f: Dict[str, Any]) -> str:
    if f["status"] == "resolved":
        return _n(f["b_crit"], TOK)
    if f["status"] in ("below", "above"):
        return ("< " if f["status"] == "below" else "> ") + _n(f["b_crit_bound"], TOK)
    return "-"


def document(result: Dict[str, Any], name: str, images: Sequence[str]) -> List[tuple]:
    """The summary as blocks: ("h1".."h3", text), ("p", text), ("pre", text), ("table", header, rows), ("img", file)."""
    metric, src, scaling = result["loss_metric"], result.get("source", {}), result["lr_scaling"]
    targets = [
        {
            **f,
            "shown": _b_crit_cell(f),
            "lof": f["lack_of_fit"]["p"],
            "n": len(f["points"]),
            "note": "; ".join(f["notes"]) or "-",
            "interval": " - ".join(_n(x, TOK) for x in f["b_crit_interval"] or []),
        }
        for f in result["critical_batch"]
    ]
    how = "chosen automatically" if result["targets_chosen"] else "given"
    if result.get("primary_target") is not None:
        how += f", and {result['primary_target']:.4g}, the primary, named by the sweep (search.target_loss)"
    law = scaling["note"] if scaling["alpha"] is None else f"lr_opt ~ {scaling['coef']:.3g} x B^{scaling['alpha']:.3f}"
    swept = ", ".join(map(_label, result["axes"])) or "nothing"
    start = result["start_level"]
    if result.get("branch"):  # a branch study: its own answer first
        branch = result["branch"]
        doc_branch = [("h2", "Critical batch size along training (branches)")]
        doc_branch += [("p", text) for text in _branch_text(branch)]
        doc_branch += [_table(_branch_rows(branch["points"]), _branch_columns(branch))]
        doc_branch += [("p", "Suggested batch ramp, to paste into a train config:"), ("pre", branch["ramp_yaml"])]
    else:
        doc_branch = []
    doc = [
        ("h1", f"Report: {name}"),
        *doc_branch,
        ("p", answer(result)),
        (
            "p",
            f"{len(result['trials'])} trials of {src.get('kind', '?')} {src.get('run_id') or ''} "
            f"in {src.get('uri', '?')}; "
            f"swept: {swept}. Final losses compare the {result['finished']} trials that reached the budget, "
            f"on {metric}; "
            f"{_stopped(result)}, {result['failed']} failed, {result['incomplete']} incomplete. "
            f"Optimizer constants: {_forms(result['optimizer'])}.",
        ),
        ("h2", "Best configuration per batch size"),
        (
            "p",
            "Per batch size, the configuration (one value of every swept axis) with the lowest final loss, "
            "averaged over its seeds (± their standard deviation). The best lr is one number per batch size, "
            f"by {CRITERIA[result['lr_criterion']]}: the vertex of a parabola through the best lr tried and its "
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
            "measured gradient noise scale where those trials reach the target (rules: orchestrator/analysis.py).",
        ),
        _table(targets, TARGET_COLUMNS),
    ]
    for f in targets:
        points = [{**p, "lr_shown": _lr_cell({"lr": p["lr"], "edge": p["lr_edge"]})} for p in f["points"]]
        doc += [("h3", f"Cost to reach loss {f['target_loss']:.4g}"), _table(points, COST_COLUMNS)]
    doc += [
        ("h2", "Learning rate vs batch size"),
        ("p", f"Best lr per batch size ({CRITERIA[result['lr_criterion']]}), interior ones only: {law}."),
        ("h2", "Figures"),
        *[("img", f) for f in images],
        ("h2", "All trials"),
        _table(result["trials"], TRIAL_COLUMNS),
    ]
    if result["skipped"]:
        doc.append(("p", "Skipped (no batch.tokens_per_update or no train/loss): " + ", ".join(result["skipped"])))
    return doc


def _forms(forms: Dict[str, Dict[str, int]]) -> str:
    """'beta2 per step (15 runs), weight decay in tokens (15 runs)'."""
    words = {"beta2": "beta2", "weight_decay": "weight decay"}
    return ", ".join(
        f"{words[name]} " + " and ".join(f"{form} ({n} runs)" for form, n in sorted(counts.items()))
        for name, counts in forms.items()
        if counts
    )


def to_markdown(doc: Sequence[tuple]) -> str:
    lines = []
    for kind, *rest in doc:
        if kind == "table":
            lines += ["| " + " | ".join(rest[0]) + " |", "|" + " --- |" * len(rest[0])]
            lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rest[1]]
        elif kind == "img":
            lines.append(f"![{rest[0]}]({rest[0]})")
        elif kind == "pre":
            lines.append(f"```yaml\n{rest[0].rstrip()}\n```")
        else:
            lines.append(rest[0] if kind == "p" else "#" * int(kind[1]) + " " + rest[0])
        lines.append("")
    return "\n".join(lines)


def to_html(doc: Sequence[tuple], title: str) -> str:
    e = html.escape

    def cells(row: Sequence[Any], tag: str) -> str:
        return "<tr>" + "".join(f"<{tag}>{e(str(c))}</{tag}>" for c in row) + "</tr>"

    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>body{{font-family:"
        "sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:right}img{max-width:100%}</style></head><body>"
    ]
    for kind, *rest in doc:
        if kind == "table":
            parts.append("<table>" + cells(rest[0], "th") + "".join(cells(r, "td") for r in rest[1]) + "</table>")
        elif kind == "img":
            parts.append(f"<p><img src='{e(rest[0])}' alt='{e(rest[0])}'></p>")
        else:
            parts.append(f"<{kind}>{e(rest[0])}</{kind}>")
    return "\n".join(parts + ["</body></html>"])


def json_safe(x: Any) -> Any:
    """Plain JSON: numpy scalars to Python, non-finite floats to null."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    x = x.item() if isinstance(x, np.generic) else x
    return None if isinstance(x, float) and not math.isfinite(x) else x
