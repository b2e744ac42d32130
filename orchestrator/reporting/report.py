"""`orchestrator report`: which batch size and configuration to use, where the critical batch
size lies and what each choice costs, read back from a sweep's (or one run's) MLflow runs, or
from a folder of `trials.csv` and `curves.csv` written by any trainer (orchestrator/analysis/tables.py).

Reading (orchestrator/reporting/report_inputs.py; MLflow only through tracking/mlflow_runs.py) gives
`trials.Trial` records; `sweep_analysis.analyse` is the arithmetic (its docstring states every rule)
and returns the typed answer (orchestrator/analysis/answer.py); writing turns it into figures
(plots.py), summary.md, summary.html and report.json (text rendered by report_render.py) and the
tables trials.csv and curves.csv (results.py: what `results.load_sweep` gives), all logged to the
sweep's (or the run's) MLflow run under `report/`.
`sweep` prints `report_render.summary_lines` of the same analysis when it ends, so the two always
say the same.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from orchestrator.analysis import branch_analysis, branch_cbs, sweep_analysis, tables
from orchestrator.analysis.answer import Answer, Source
from orchestrator.analysis.trials import Trial
from orchestrator.core import sweep_file, sweep_schema, validation
from orchestrator.core.errors import ConfigError
from orchestrator.reporting import report_inputs
from orchestrator.reporting.report_format import json_safe, to_html, to_markdown
from orchestrator.reporting.report_render import document, summary_lines
from orchestrator.tracking import mlflow_runs, mlflow_ui

# ---------------------------------------------------------------- where

MARKER = "report.json"
"""Written first into a report's folder: a folder holding it is one a report wrote."""
OWNED = (MARKER, "summary.md", "summary.html", tables.TRIALS, tables.CURVES) + (
    "loss_vs_tokens.png",
    "loss_vs_steps.png",
    "branch_cbs.png",
    "eval_heatmap.png",
    "critical_batch.png",
    "lr_vs_batch.png",
    "loss_vs_tokens_best.png",
    "critical_batch_vs_loss.png",
    "b_simple_vs_tokens.png",
    "loss_vs_lr.png",
)
"""The files a report writes into its folder: the only ones it writes or replaces there (docs/security.md)."""


def default_out(name: str) -> Path:
    """reports/<name>, the name made one plain folder name (validation.plain_name: the project's
    rule for a name that becomes a folder)."""
    folder = re.sub(r"[^\w.-]+", "_", name)
    try:
        validation.plain_name("--out", folder)
    except ConfigError as exc:
        raise ConfigError("--out", f"no default folder for the name {name!r} ({exc.message}); give --out DIR") from None
    return Path("reports") / folder


def check_out_folder(out: Path, tables_folder: Optional[Path] = None) -> None:
    """Before anything is written: `out` is new, empty, or a folder a report wrote (it holds
    MARKER) with nothing in it but the files a report writes; never the folder the tables are
    read from. So a report replaces only its own files, and a re-run into the same folder works."""
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{out} is a file; give a new folder, an empty one or one a report wrote")
    if tables_folder is not None and out.resolve() == tables_folder.resolve():
        raise ConfigError(
            "--out", f"{out} is the folder the tables are read from, which report never rewrites; give another"
        )
    ours = (out / MARKER).is_file()
    entries = sorted(out.iterdir()) if out.is_dir() else []
    foreign = [e for e in entries if not ours or e.name not in OWNED or e.is_symlink() or not e.is_file()]
    if foreign:
        raise ConfigError(
            "--out",
            f"{foreign[0]} is not a file a report wrote there ({MARKER} marks its folder); give a new folder, an "
            "empty one or one a report wrote",
        )


# ---------------------------------------------------------------- writing


def figures(trials: Sequence[Trial], answer: Answer, name: str) -> Dict[str, Any]:
    from orchestrator.reporting import plots

    usable, metric = [t for t in trials if t.batch and t.train], answer.loss_metric
    curves = [{"batch": t.batch, "train": t.train, "eval": t.eval} for t in usable]
    figs = {
        "loss_vs_tokens.png": plots.loss_by_batch(curves, "tokens", f"{name}: loss vs tokens"),
        "loss_vs_steps.png": plots.loss_by_batch(curves, "steps", f"{name}: loss vs optimizer steps"),
    }
    if answer.branch:  # a branch study: one base run, so no from-scratch comparison to draw
        base = branch_analysis.base_of(trials)
        b_simple = base.b_simple if base else []
        figs["branch_cbs.png"] = plots.branch_cbs(list(answer.branch.points), answer.branch.fit, b_simple)
        return figs
    cells = [
        (t.lr, t.batch, t.final(metric))
        for t in usable
        if t.lr and t.outcome == "finished" and t.final(metric) is not None
    ]
    if cells:
        figs["eval_heatmap.png"] = plots.lr_batch_heatmap(cells, f"final {metric}")
    fits = [  # the hyperbola is drawn whatever the status: the fit's B_crit
        {
            "target_loss": f.target_loss,
            "points": [(p.batch, p.steps, p.tokens) for p in f.points],
            "s_min": f.s_min,
            "e_min": f.e_min,
            "b_crit": f.b_crit_fit,
        }
        for f in answer.critical_batch
        if f.points
    ]
    if fits:
        figs["critical_batch.png"] = plots.critical_batch(fits)
    figs.update(comparison_figures(usable, answer))
    best, scaling = answer.best_lr, answer.lr_scaling
    if any(r.lr for r in best):
        fit = (scaling.coef, scaling.alpha) if scaling.alpha is not None else None
        figs["lr_vs_batch.png"] = plots.lr_vs_batch(
            [(t.batch, t.lr) for t in usable if t.lr], [(r.batch, r.lr) for r in best if r.lr], fit
        )
    return figs


def comparison_figures(usable: Sequence[Trial], answer: Answer) -> Dict[str, Any]:
    """The figures that compare batch sizes at their chosen learning rates (comparison_plots.py)."""
    from orchestrator.reporting import comparison_plots as cp

    chosen = cp.best_trials(usable, answer.best_per_batch)
    lr_of = {r.batch: r.lr for r in answer.best_lr}
    figs = {}
    if chosen:
        figs["loss_vs_tokens_best.png"] = cp.best_lr_curves(chosen, lr_of)
    if any(f.b_crit or f.b_simple for f in answer.critical_batch):
        figs["critical_batch_vs_loss.png"] = cp.critical_batch_vs_loss(answer.critical_batch)
    if any(t.b_simple for t in chosen):
        figs["b_simple_vs_tokens.png"] = cp.b_simple_over_training(chosen)
    if any(t.lr for t in usable):
        figs["loss_vs_lr.png"] = cp.loss_vs_lr(usable, answer.loss_metric, answer.best_lr)
    return figs


def write_report(trials: Sequence[Trial], answer: Answer, name: str, out: Path) -> List[Path]:
    """report.json (first: it marks the folder as a report's), the figures and the summaries in
    `out`, which check_out_folder has accepted."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text(json.dumps(json_safe({"name": name, **answer.to_json()}), indent=2))
    written = [out / MARKER]
    for file, fig in figures(trials, answer, name).items():
        assert file in OWNED, f"{file} is not in report.OWNED: a re-run would refuse the folder"
        fig.savefig(out / file, dpi=120)
        plt.close(fig)
        written.append(out / file)
    doc = document(answer, name, [p.name for p in written[1:]])
    for file, text in (("summary.md", to_markdown(doc)), ("summary.html", to_html(doc, f"Report: {name}"))):
        (out / file).write_text(text)
        written.append(out / file)
    return written


def sweep_options(search, lr_criterion: Optional[str] = None, raw: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """What a sweep's search section asks of the analysis, the same for `sweep`'s summary and for
    `report SWEEP_FILE`: the best lr by fewest steps when the search scored lrs by steps (or its
    stable-phase proxy), the loss it named as the primary target, and a branch study's tolerance
    (`raw`: the sweep file as read)."""
    if lr_criterion is None:
        lr_criterion = "steps" if search.criterion in ("stable_loss", "steps") else "final_loss"
    branch = (raw or {}).get("branch")
    options = {"lr_criterion": lr_criterion, "primary_target": search.target_loss}
    if not isinstance(branch, dict) or not {"tolerance", "tolerance_kind", "compare"} & set(branch):
        return options
    defaults = branch_cbs.Tolerance()
    tolerance = branch_cbs.Tolerance(
        float(branch.get("tolerance", defaults.value)),
        branch.get("tolerance_kind", defaults.kind),
        branch.get("compare", defaults.compare),
    )
    return {**options, "branch_tolerance": tolerance}


def run(
    target: str,
    overrides: List[str],
    out: Optional[str] = None,
    target_losses: Optional[List[float]] = None,
    lr_criterion: Optional[str] = None,
) -> int:
    """The `report` verb: target is a sweep file, a sweep name, a run id or a folder holding
    trials.csv and curves.csv; returns the exit code. lr_criterion None: the sweep file's, else
    final_loss."""
    from orchestrator.reporting import results

    is_sweep_file = Path(target).is_file() and target.endswith((".yaml", ".yml"))
    read = sweep_file.load(target, check=False) if is_sweep_file else None
    options = sweep_options(
        read.search if read else sweep_schema.SearchConfig(), lr_criterion, read.raw if read else None
    )
    if tables.is_table_folder(target):
        return _run_tables(Path(target), out, target_losses, options)
    uri, name, run_id = _resolve(target, list(overrides))
    out_dir = Path(out) if out else default_out(name)
    check_out_folder(out_dir)  # before reading the runs: a refusal costs nothing
    runs = report_inputs.sweep_runs(uri, run_id)
    curves = report_inputs.read_curves(uri, runs, results.METRICS)
    trials = report_inputs.trials_of(uri, runs, curves)
    if not any(t.batch and t.train for t in trials):
        print(
            f"orchestrator report: nothing to report: no run under {run_id} has train/loss and batch.tokens_per_update"
        )
        return 1
    if read is not None:
        experiment = report_inputs.tracking_for(target, list(overrides))[2]
        options["compare_with"] = report_inputs.compared_sweep(read.raw, uri, experiment)
    result = report_inputs.analyse(uri, run_id, trials, target_losses, **options)
    write_run_report(uri, name, run_id, trials, curves, result, out_dir)
    return 0


def _resolve(target: str, overrides: List[str]):
    """report_inputs.resolve; a folder that is neither a table folder nor a name MLflow knows is
    answered by the table file it lacks, not by the store."""
    try:
        return report_inputs.resolve(target, overrides)
    except ConfigError:
        if Path(target).is_dir():
            tables.read(Path(target))  # raises, naming trials.csv or curves.csv
        raise


def write_run_report(
    uri: str, name: str, run_id: str, trials: Sequence[Trial], curves, result: Answer, out: Optional[Path]
) -> Path:
    """The report of a sweep's (or a run's) MLflow runs: figures, summary, report.json and the
    tables written to `out` (default reports/<name>) and logged to the run under report/; the
    summary printed. `report` and the end of `sweep` both call it, so they write the same."""
    from orchestrator.reporting import results

    out_dir = out or default_out(name)
    check_out_folder(out_dir)
    tables_ = results.build(name, run_id, trials, curves, result, results.METRICS, uri)
    for path in write_report(trials, result, name, out_dir) + tables_.to_csv(out_dir):
        mlflow_runs.log_file(uri, run_id, path, "report")
    _say_written(out_dir, f"logged to run {run_id} under report/")
    print("\n".join(summary_lines(result)))
    compared = [t.run_id for t in sorted(trials, key=lambda t: (t.batch or 0, t.lr or 0, t.name))]
    print(f"every trial's loss on one chart: `{mlflow_ui.ui_command(uri)}`, then")
    print(f"  {mlflow_ui.compare_link(uri, compared)}")
    return out_dir


def _run_tables(folder: Path, out: Optional[str], target_losses, options) -> int:
    """`report DIR`: the same analysis and outputs from a folder's tables (nothing goes to MLflow;
    DIR is never written to)."""
    from orchestrator.reporting import results

    name = folder.resolve().name
    out_dir = Path(out) if out else default_out(name)
    check_out_folder(out_dir, tables_folder=folder)
    trials = tables.read(folder)
    if not any(t.batch and t.train for t in trials):
        raise ConfigError("SWEEP_OR_RUN", f"{folder}: no trial has batch.tokens_per_update and train/loss points")
    result = replace(
        sweep_analysis.analyse(trials, target_losses, **options), source=Source(str(folder), None, "tables")
    )
    write_report(trials, result, name, out_dir)
    curves = {t.run_id: {m: getattr(t, f) for m, f in tables.METRICS.items()} for t in trials}
    results.build(name, "", trials, curves, result, tuple(tables.METRICS)).to_csv(out_dir)
    _say_written(out_dir, f"read from {folder}")
    print("\n".join(summary_lines(result)))
    return 0


def _say_written(out_dir: Path, where: str) -> None:
    print(f"report: {out_dir / 'summary.md'} (and summary.html, report.json, trials.csv, curves.csv; {where})")
