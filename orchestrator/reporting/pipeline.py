"""One report, read -> analyse -> write, whatever it is made from: `report` (a sweep, a single run
or a folder of tables) and the end of `sweep` both call `make`, so the two always say the same.

- read (report_inputs.py): the runs as `Inputs`, from MLflow or from trials.csv and curves.csv;
- analyse (sweep_analysis.analyse): the typed `answer.Answer` (its docstring states every rule);
- write: report.json, the figures and the summaries (report_files.py), trials.csv and curves.csv
  (sweep_tables.py: what `sweep_tables.load_sweep` gives), logged to the MLflow run under report/ when read
  from MLflow; the answer printed (report_render.summary_lines).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence

from orchestrator.analysis import branch_ramp
from orchestrator.analysis.answer import Answer
from orchestrator.reporting import report_files, report_folder, report_inputs, report_ladder, sweep_tables
from orchestrator.reporting.report_inputs import Inputs, Settings
from orchestrator.reporting.report_render import overview, summary_lines
from orchestrator.tracking import mlflow_ui
from orchestrator.tracking.run_tags import ONLINE_CALIBRATION_METRIC, ONLINE_CALIBRATION_TAG
from orchestrator.tracking.store import Store


def make(
    inputs: Inputs,
    settings: Settings,
    out: Optional[Path] = None,
    target_losses: Optional[Sequence[float]] = None,
    ui_port: int = mlflow_ui.DEFAULT_PORT,
    ladder: Optional[report_ladder.Request] = None,
    store: Optional[Store] = None,
    **options,
) -> Answer:
    """The report of `inputs` in `out` (default reports/<name>): analysed with `settings` and
    `options` (sweep_analysis.analyse's), written, logged to MLflow when read from there (through
    `store`: the sweep's own, with its extra sinks, at the end of `sweep`; else the store read), and
    printed, with the links of `orchestrator ui` on `ui_port`; when the trials form a ladder, its
    part too (report_ladder.py; `ladder`: its target and tolerance). Returns the answer."""
    answer = report_inputs.analyse(inputs, target_losses, settings.origin, **settings.options, **options)
    rungs = report_ladder.analyse(inputs.trials, ladder, settings.options["loss_tolerance"])
    out = out or report_files.default_out(inputs.name)
    parts = [report_ladder.part(rungs)] if rungs else []
    tables = sweep_tables.build(
        inputs.name, inputs.source.run_id or "", inputs.trials, inputs.curves, answer, inputs.metrics, inputs.uri or ""
    )
    with report_files.staged(out, inputs.folder) as folder:  # checked again: a sweep's may have changed as it ran
        written = report_files.write_report(inputs.trials, answer, inputs.name, folder, parts)
        if rungs:
            yaml_file = report_ladder.write_recommended(rungs, inputs.trials, ladder and ladder.target, folder)
            written += [yaml_file] if yaml_file else []
        written += tables.to_csv(folder)
    written = [out / path.name for path in written]
    if inputs.uri is None:
        where = f"read from {inputs.folder}"
    else:
        store = store or Store(inputs.uri)
        for path in written:
            store.log_file(inputs.source.run_id, path, "report")
        if inputs.source.kind == "sweep" and not rungs:  # so sweeps compare in MLflow's runs table (a
            # ladder's rungs mixed have no one B_crit or best loss: its answer is report.json's ladder)
            store.log_metrics(inputs.source.run_id, answer_metrics(answer), step=0)
            store.set_tags(inputs.source.run_id, answer_tags(answer))
        where = f"logged to run {inputs.source.run_id} under report/"
    print(f"report: {out / 'summary.md'} (and summary.html, report.json, trials.csv, curves.csv; {where})")
    print("\n".join([overview(answer)] + report_ladder.lines(rungs) if rungs else summary_lines(answer)))
    fallen_back = report_folder.defaults_line(settings.origin, settings.options) if inputs.uri is None else None
    if fallen_back:  # a folder of tables with no report.json to read the settings back from
        print(fallen_back)
    if inputs.uri is not None:  # the link that compares every trial on one chart
        compared = [t.run_id for t in inputs.trials]  # the view orders them by batch size
        print(f"every trial's loss on one chart: `{mlflow_ui.ui_command(inputs.uri, ui_port)}`, then")
        print(f"  {mlflow_ui.compare_view_link(inputs.uri, inputs.source.run_id, compared, ui_port)}")
    return answer


def answer_metrics(answer: Answer) -> Dict[str, float]:
    """The answer as the sweep's parent run's metrics (answer/...): B_crit and its interval's ends,
    B_simple at the primary target, the best final loss and its batch size, what to run; a branch
    study's batch.calibration and its interval (what `batch.calibration_from` reads back)."""
    p, best, rec = answer.primary, answer.best, answer.recommendation
    found = {
        "answer/b_crit": p.b_crit if p else None,
        "answer/b_crit_low": p.b_crit_interval[0] if p and p.b_crit_interval else None,
        "answer/b_crit_high": p.b_crit_interval[1] if p and p.b_crit_interval else None,
        "answer/b_simple": p.b_simple if p else None,
        "answer/best_final_loss": best.final_loss if best else None,
        "answer/best_tokens_per_update": best.batch if best else None,
        "answer/recommended_tokens_per_update": rec.tokens_per_update if rec else None,
        "answer/recommended_lr": rec.lr if rec else None,
    }
    online = _online_calibration(answer)
    if online:
        low, high = online.interval
        found.update(
            {
                ONLINE_CALIBRATION_METRIC: online.value,
                "answer/online_calibration_low": low,
                "answer/online_calibration_high": high,
            }
        )
    return {k: float(v) for k, v in found.items() if v is not None}


def answer_tags(answer: Answer) -> Dict[str, str]:
    """The answer's words as the parent run's tags: B_crit's status and the loss it is stated at;
    a branch study's calibration's status."""
    p = answer.primary
    tags = {
        "answer.status": p.status if p else "no target",
        "answer.primary_target": f"{p.target_loss:.4g}" if p else "-",
        "answer.lr_criterion": answer.lr_criterion,
    }
    online = _online_calibration(answer)
    if online:
        tags[ONLINE_CALIBRATION_TAG] = "resolved" if online.resolved else f"not resolved: {online.why_not()}"
    return tags


def _online_calibration(answer: Answer) -> Optional[branch_ramp.OnlineCalibration]:
    """A branch study's `batch.calibration_from` answer (None for another sweep)."""
    return branch_ramp.online_calibration(answer.branch.points) if answer.branch else None
