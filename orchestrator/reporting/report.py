"""`orchestrator report`: which batch size and configuration to use, where the critical batch
size lies and what each choice costs, read back from a sweep's (or one run's) MLflow runs, or
from a folder of `trials.csv` and `curves.csv` written by any trainer (orchestrator/analysis/tables.py).

This module resolves what the command names (a sweep file, parsed once; a sweep's name; a run id;
a table folder) and what the sweep file asks of the analysis (report_inputs.settings: the file
given, else the one its parent run recorded); the report itself is the pipeline's (pipeline.py:
read -> analyse -> write), the same the end of `sweep` runs, so the two always say the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from orchestrator.analysis import tables
from orchestrator.analysis.trials import Trial
from orchestrator.core import ladder_target, sweep_file, sweep_schema
from orchestrator.core.errors import ConfigError
from orchestrator.reporting import report_folder, report_inputs, report_ladder
from orchestrator.reporting.report_files import check_out_folder, default_out
from orchestrator.tracking.store import Store


def ladder_request(
    sweep: Optional[sweep_schema.Sweep],
    params: Optional[float] = None,
    tokens: Optional[float] = None,
    trials: Sequence[Trial] = (),
):
    """What the report asks of a ladder: the sweep file's ladder.target (the command line's N and D
    over it; its tolerance is the settings', report_inputs.settings). trials: the sweep's runs, whose
    logged config gives the target model's N when the file's base config is not on this disk (the
    copy the parent run recorded)."""
    params_of = (lambda model: report_ladder.params_of(trials, model)) if trials else None
    return report_ladder.Request(ladder_target.with_options(ladder_target.target(sweep, params_of), params, tokens))


def run(
    target: str,
    overrides: List[str],
    out: Optional[str] = None,
    target_losses: Optional[List[float]] = None,
    lr_criterion: Optional[str] = None,
    ui_port: int = 5000,
    target_params: Optional[float] = None,
    target_tokens: Optional[float] = None,
    loss_tolerance: Optional[float] = None,
) -> int:
    """The `report` verb: target is a sweep file, a sweep name, a run id or a folder holding
    trials.csv and curves.csv; returns the exit code. The analysis settings are the sweep file's:
    the one given, else the one the sweep's parent run recorded (report_inputs.settings), so every
    way of naming a sweep gives one answer; lr_criterion, when given, wins. ui_port: the port of
    `orchestrator ui` the printed links open. target_params / target_tokens: a ladder's target,
    over the sweep file's ladder.target. loss_tolerance: the share of the loss the recommendation
    trades for a larger batch, over the file's loss_tolerance (a ladder's ladder.tolerance)."""
    from orchestrator.reporting import pipeline, sweep_tables  # pandas and matplotlib only when a report runs

    is_sweep_file = Path(target).is_file() and target.endswith((".yaml", ".yml"))
    read = sweep_file.load(target, check=False) if is_sweep_file else None  # the command's one parse of it
    ladder = ladder_request(read, target_params, target_tokens)  # a bad target: refused before anything
    given_target = target_params is not None or target_tokens is not None
    if tables.is_table_folder(target):
        recorded = report_folder.read(Path(target), lr_criterion, loss_tolerance, target_losses)
        if ladder.target is None and recorded.ladder_target is not None:  # the earlier report's target
            ladder = report_ladder.Request(ladder_target.Target(*recorded.ladder_target, None))
        return _run_tables(Path(target), out, recorded.target_losses, recorded.settings, ladder, given_target)
    uri, name, run_id = _resolve(target, list(overrides), read)
    out_dir = Path(out) if out else default_out(name)
    check_out_folder(out_dir)  # before reading the runs: a refusal costs nothing
    inputs = report_inputs.read_mlflow(uri, name, run_id, sweep_tables.METRICS)
    if not any(t.batch and t.train for t in inputs.trials):
        print(
            f"orchestrator report: nothing to report: no run under {run_id} has train/loss and batch.tokens_per_update"
        )
        return 1
    settings, sweep = report_inputs.settings_of_sweep(read, uri, run_id, lr_criterion, loss_tolerance)
    if sweep is not None and read is None:  # the file recorded on the sweep's parent run
        ladder = ladder_request(sweep, target_params, target_tokens, inputs.trials)
    if given_target:
        refuse_target_outside_the_ladder(inputs.trials, ladder.target)
    tracking = report_inputs.tracking_for(target, list(overrides), read)[1]
    compare = None
    if sweep is not None and sweep.branch is not None:
        compare = report_inputs.compared_sweep(sweep.branch, uri, tracking.experiment)
    store = Store(uri, tracking.experiment, tracking.sinks)  # what the report logs reaches the sinks too
    pipeline.make(
        inputs, settings, out_dir, target_losses, ui_port=ui_port, ladder=ladder, compare_with=compare, store=store
    )
    return 0


def _resolve(target: str, overrides: List[str], read: Optional[sweep_schema.Sweep]):
    """report_inputs.resolve; a folder that is neither a table folder nor a name MLflow knows is
    answered by the table file it lacks, not by the store."""
    try:
        return report_inputs.resolve(target, overrides, read)
    except ConfigError:
        if Path(target).is_dir():
            tables.read(Path(target))  # raises, naming trials.csv or curves.csv
        raise


def _run_tables(
    folder: Path, out: Optional[str], target_losses, settings: report_inputs.Settings, ladder, given_target: bool
) -> int:
    """`report DIR`: the same analysis and outputs from a folder's tables (nothing goes to MLflow;
    DIR is never written to), with the settings its report.json records (report_folder.py)."""
    from orchestrator.reporting import pipeline

    out_dir = Path(out) if out else default_out(folder.resolve().name)
    check_out_folder(out_dir, tables_folder=folder)
    inputs = report_inputs.read_tables(folder)
    if not any(t.batch and t.train for t in inputs.trials):
        raise ConfigError("SWEEP_OR_RUN", f"{folder}: no trial has batch.tokens_per_update and train/loss points")
    if given_target:
        refuse_target_outside_the_ladder(inputs.trials, ladder.target)
    pipeline.make(inputs, settings, out_dir, target_losses, ladder=ladder)
    return 0


def refuse_target_outside_the_ladder(trials: Sequence[Trial], target: Optional[ladder_target.Target]) -> None:
    """--target-params / --target-tokens name a ladder's target: refused (exit 2), instead of being
    ignored, for runs of one model size and budget, which no law extrapolates, and for a target of
    no more compute (6 N D) than the largest rung, which there is nothing to extrapolate to."""
    from orchestrator.analysis import ladder_rungs
    from orchestrator.formulas import cost

    if not ladder_rungs.is_ladder(trials):
        raise ConfigError(
            "--target-params",
            "these runs are one sweep (model.params and train.total_tokens are the same in every run), not a "
            "ladder: a target needs runs at several model sizes or budgets; leave out --target-params and "
            "--target-tokens",
        )
    rungs = [(cost.training_compute(n, d), n, d) for n, d in ladder_rungs.group(trials) if n]
    largest, n, d = max(rungs) if rungs else (0.0, None, None)
    if target is not None and largest and cost.decades_beyond(target.params, target.tokens, largest) <= 0:
        raise ConfigError(
            "--target-params",
            f"N = {target.params:.4g}, D = {target.tokens:.4g} is no more compute (6 N D) than the largest rung "
            f"(N = {n:.4g}, D = {d:.4g}): a ladder extrapolates up; give --target-params and --target-tokens beyond it",
        )
