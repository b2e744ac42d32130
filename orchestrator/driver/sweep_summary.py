"""The end of a sweep: its trials' runs closed, the parent run's artifacts, and the answer (the
report pipeline's, as `orchestrator report` gives it). The live table while it runs is
driver/progress_table.py."""

from __future__ import annotations

import logging
import sys
from typing import Dict, Optional

from orchestrator.core import sweep_schema
from orchestrator.core.config import redact_uri
from orchestrator.core.errors import ConfigError
from orchestrator.driver import progress_table, run_life
from orchestrator.tracking import mlflow_ui
from orchestrator.tracking.refusals import StoreRefusedWrites, why_not
from orchestrator.tracking.run_tags import STOPPED_AT_TAG
from orchestrator.tracking.store import Store


def _close_unfinished_runs(store: Store, trials, stopped_at: Dict[str, int]) -> None:
    """A scheduler stops a trial by ending its actor, so its MLflow run is still RUNNING; this can
    happen right after the last report too (ASHA stops every trial at max_t). Close such runs:
    FINISHED when they saw the budget, else KILLED and tagged with the rung that stopped them
    (as the scheduler decided; after a --resume, the last evaluation it logged). The records
    are updated to match, so they need not be read again."""
    for t in trials:
        if t.status != "RUNNING":
            continue
        if t.tokens_seen >= t.budget:
            t.status = "FINISHED"
        else:
            t.status = "KILLED"
            t.stopped_at = stopped_at.get(t.trial_id or "", t.eval[-1][0] if t.eval else t.tokens_seen)
            store.set_tags(t.run_id, {STOPPED_AT_TAG: str(t.stopped_at)})
        run_life.close_run(store, t.run_id, t.status, title=t.name)


def finish(
    sweep: sweep_schema.Sweep,
    base,
    parent: str,
    error: Optional[BaseException],
    stopped_at: Optional[Dict[str, int]] = None,
) -> int:
    """Close the parent run and print the answer: the report pipeline's, as `orchestrator report` gives it."""
    from orchestrator.reporting import pipeline, report, report_inputs, sweep_tables

    progress_table.stop_live()  # a live table the Tune callbacks did not stop (the sweep failed)
    uri, store = base.tracking.uri, Store.of(base)  # the sweep's store, with its extra sinks
    if isinstance(error, StoreRefusedWrites):  # no report to write: one line
        return _stopped_by_the_store(sweep, uri, store, parent, error)
    runs = report_inputs.trial_runs(uri, parent)  # and the finished runs it reused
    inputs = report_inputs.read_mlflow(uri, sweep.name, parent, sweep_tables.METRICS, runs)
    if runs:  # what a later `report` of the sweep reads, in one file
        store.write_sweep_curves(parent, runs, inputs.curves)
    trials = inputs.trials
    _close_unfinished_runs(store, trials, stopped_at or {})  # the records too: the report reads them as closed
    finished = [t for t in trials if t.outcome == "finished"]
    print(f"\n=== sweep {sweep.name}: {len(finished)} of {len(trials)} trials reached the budget ===")
    if trials:
        _log_parent_artifacts(store, parent, trials)
    print(f"MLflow: `{mlflow_ui.ui_command(uri)}`, then {mlflow_ui.ui_link(uri, base.tracking.experiment)}")
    if finished:  # the report ends with the link that compares every trial on one chart
        try:
            try:
                compare = report_inputs.compared_sweep(sweep.branch, uri, base.tracking.experiment)
            except ConfigError as exc:  # the sweep to compare with may not have run yet: `report` later
                print(f"no comparison: {redact_uri(str(exc))}")
                compare = None
            settings = report_inputs.settings(sweep, f"the sweep file {sweep.path}")
            pipeline.make(inputs, settings, compare_with=compare, ladder=report.ladder_request(sweep), store=store)
        except ValueError as exc:  # nothing to analyse (e.g. no batch size logged)
            print(f"no analysis: {redact_uri(str(exc))}")
    status = "FAILED" if error is not None or not finished else "FINISHED"
    store.finish_run(parent, status)
    if error is not None:
        print(f"sweep {sweep.name} failed: {type(error).__name__}: {redact_uri(str(error))}", file=sys.stderr)
        return 1
    return 0 if finished else 1


def _stopped_by_the_store(
    sweep: sweep_schema.Sweep, uri: str, store: Store, parent: str, error: StoreRefusedWrites
) -> int:
    """The sweep's line when its store refused a trial's write: its open runs marked FAILED where
    the store takes that now (it may have refused only for a while), else said to be left open."""
    mlflow_log = logging.getLogger("mlflow.store.db.utils")
    level = mlflow_log.level
    mlflow_log.setLevel(logging.CRITICAL)  # its tracebacks of each refusal: the line says it
    try:
        for run in store.child_runs(parent):
            if run.status == "RUNNING":
                store.finish_run(run.run_id, "FAILED")
        store.finish_run(parent, "FAILED")
        marked = "its open runs are marked FAILED"
    except Exception as exc:  # still refusing: say so, in the same line
        marked = f"its open runs stay RUNNING in the store ({why_not(exc)}) until `sweep --resume` ends them"
    finally:
        mlflow_log.setLevel(level)
    print(
        f"sweep {sweep.name} stopped: the MLflow store {redact_uri(uri)} refused a trial's write ({error}); "
        f"{marked}; `orchestrator sweep {sweep.path} --resume` goes on once it takes writes",
        file=sys.stderr,
    )
    return 1


def _log_parent_artifacts(store: Store, parent: str, trials) -> None:
    from orchestrator.reporting import plots

    curves = {t.name: t.train for t in sorted(trials, key=lambda t: (t.batch or 0, t.lr or 0))}
    store.log_figure(parent, plots.loss_vs_tokens(curves, title="train loss of every trial"), "loss_vs_tokens.png")
