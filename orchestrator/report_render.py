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

from orchestrator import analysis

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
    return ", ".join(f"{_label(k)} {_setting(k, v)}" for k, v in settings.items() if k != analysis.BATCH_KEY)


def _stopped(result: Dict[str, Any]) -> str:
    stopped = result["stopped"]
    rungs = ", ".join(f"{n} at the {_n(float(t), 'tok')}-token rung" for t, n in stopped["rungs"].items())
    return f"{stopped['count']} stopped early" + (f" ({rungs})" if rungs else "")


def answer(result: Dict[str, Any]) -> str:
    """One paragraph: the best configuration, early stopping, B_crit and B_simple."""
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
    notes = [note for note in p["notes"] if not note.startswith("not resolved")]
    if p["b_crit"] is not None:
        lo_hi = p["b_crit_interval"]
        parts = [f"90% interval over seeds {_n(lo_hi[0], 'tok')} - {_n(lo_hi[1], 'tok')}"] if lo_hi else []
        parts += [f"{len(p['points'])} batch sizes", *notes]
        text += (
            f" At loss {p['target_loss']:.4g} the critical batch size is "
            f"B_crit = {_n(p['b_crit'], 'tok')} tokens ({'; '.join(parts)})"
        )
    else:
        why = next((note.removeprefix("not resolved: ") for note in p["notes"] if note.startswith("not resolved")), "")
        text += f" Critical batch size at loss {p['target_loss']:.4g}: not resolved ({why})"
    text += (
        f"; measured B_simple at that loss: {_n(p['b_simple'], 'tok')} tokens."
        if p["b_simple"]
        else "; B_simple not measured."
    )
    alpha = result["lr_scaling"]["alpha"]
    text += f" The best learning rate scales as B^{round(alpha, 2) + 0.0:.2f}." if alpha is not None else ""
    return text + _edge_warning(result["best_per_batch"])


def _edge_warning(best_per_batch: Sequence[Dict[str, Any]]) -> str:
    """'The best lr is the lowest tried at 3 of 5 batch sizes: ...' for every such axis and side."""
    counts: Dict[Tuple[str, str], int] = {}
    for r in best_per_batch:
        for key, side in r["edges"].items():
            counts[key, side] = counts.get((key, side), 0) + 1
    return "".join(
        f" The best {_label(key)} is the {side} tried at {n} of {len(best_per_batch)} batch sizes: "
        f"the optimum may lie {'below' if side == 'lowest' else 'above'} the swept range."
        for (key, side), n in sorted(counts.items())
    )


def per_batch_table(result: Dict[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """Header and rows: per batch size the best value of every swept axis and its final loss."""
    axes = [k for k in result["axes"] if k != analysis.BATCH_KEY]
    header = ["batch size", *map(_label, axes), f"final {result['loss_metric']}", "seeds", "run"]
    rows = [
        [
            _n(r["batch"], "tok"),
            *(_setting(k, r["settings"].get(k)) for k in axes),
            _n(r["final_loss"]) + (f" ± {_n(r['spread'], '{:.2g}')}" if r["spread"] is not None else ""),
            str(r["seeds"]),
            r["run_name"],
        ]
        for r in result["best_per_batch"]
    ]
    return header, rows


def summary_lines(result: Dict[str, Any]) -> List[str]:
    """What `sweep` prints when it ends: the answer and the best configuration per batch size."""
    header, rows = per_batch_table(result)
    swept = ", ".join(map(_label, result["axes"])) or "nothing"
    lines = [answer(result), f"best configuration per batch size (swept: {swept}):"]
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [header, *rows]]
    return lines


G, S, TOK = "{:.4g}", "{}", "tok"  # cell formats: number, text, token count
TARGET_COLUMNS = [
    ("target loss", "target_loss", G),
    ("B_crit", "b_crit", TOK),
    ("90% interval", "interval", S),
    ("B_simple", "b_simple", TOK),
    ("S_min", "s_min", G),
    ("E_min", "e_min", TOK),
    ("batch sizes", "n", S),
    ("notes", "note", S),
]
COST_COLUMNS = [
    ("batch size", "batch", TOK),
    ("mean steps", "steps", "{:,.0f}"),
    ("tokens", "tokens", "{:,.0f}"),
    ("wall time (s)", "wall_s", "{:.1f}"),
    ("lr", "lr", G),
    ("seeds", "seeds", S),
    ("B_simple", "b_simple", TOK),
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


def document(result: Dict[str, Any], name: str, images: Sequence[str]) -> List[tuple]:
    """The summary as blocks: ("h1".."h3", text), ("p", text), ("table", header, rows), ("img", file)."""
    metric, src, scaling = result["loss_metric"], result.get("source", {}), result["lr_scaling"]
    targets = [
        {
            **f,
            "n": len(f["points"]),
            "note": "; ".join(f["notes"]) or "-",
            "interval": " - ".join(_n(x, TOK) for x in f["b_crit_interval"] or []),
        }
        for f in result["critical_batch"]
    ]
    how = "chosen automatically" if result["targets_chosen"] else "given"
    law = scaling["note"] if scaling["alpha"] is None else f"lr_opt ~ {scaling['coef']:.3g} x B^{scaling['alpha']:.3f}"
    swept = ", ".join(map(_label, result["axes"])) or "nothing"
    doc = [
        ("h1", f"Report: {name}"),
        ("p", answer(result)),
        (
            "p",
            f"{len(result['trials'])} trials of {src.get('kind', '?')} run {src.get('run_id', '?')} "
            f"in {src.get('uri', '?')}; "
            f"swept: {swept}. Final losses compare the {result['finished']} trials that reached the budget, "
            f"on {metric}; "
            f"{_stopped(result)}, {result['failed']} failed, {result['incomplete']} incomplete.",
        ),
        ("h2", "Best configuration per batch size"),
        (
            "p",
            "Per batch size, the configuration (one value of every swept axis) with the lowest final loss, "
            "averaged over its seeds (± their standard deviation).",
        ),
        ("table", *per_batch_table(result)),
        ("h2", "Critical batch size"),
        (
            "p",
            f"Target losses {how}. Per batch size, the configuration reaching a target in the fewest optimizer steps "
            "(mean over its seeds) gives S_j; S = S_min + E_min / B is fitted and B_crit = E_min / S_min. "
            "Steps are read "
            "only where the schedule cannot fake them: before the decay of wsd, anywhere for constant, in the first "
            f"{analysis.TRUSTED_SHARE:.0%} of the budget for cosine and linear. "
            "The interval is a bootstrap over seeds that "
            "redoes the choice of the best configuration in every resample: "
            "how far B_crit would move with other seeds. "
            "B_simple is the measured gradient noise scale where those trials reach the target (rules: "
            "orchestrator/analysis.py).",
        ),
        _table(targets, TARGET_COLUMNS),
    ]
    for f in targets:
        doc += [("h3", f"Cost to reach loss {f['target_loss']:.4g}"), _table(f["points"], COST_COLUMNS)]
    doc += [
        ("h2", "Learning rate vs batch size"),
        ("p", f"Best configuration's lr per batch size: {law}."),
        ("h2", "Figures"),
        *[("img", f) for f in images],
        ("h2", "All trials"),
        _table(result["trials"], TRIAL_COLUMNS),
    ]
    if result["skipped"]:
        doc.append(("p", "Skipped (no batch.tokens_per_update or no train/loss): " + ", ".join(result["skipped"])))
    return doc


def to_markdown(doc: Sequence[tuple]) -> str:
    lines = []
    for kind, *rest in doc:
        if kind == "table":
            lines += ["| " + " | ".join(rest[0]) + " |", "|" + " --- |" * len(rest[0])]
            lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rest[1]]
        elif kind == "img":
            lines.append(f"![{rest[0]}]({rest[0]})")
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
