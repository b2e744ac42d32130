"""What a sweep shows the user: a live table while it runs and the answer when it ends."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Dict, Optional

from ray import tune

from orchestrator import launch, search_space, tracking

PRINT_EVERY_S = 20.0


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


class ProgressTable(tune.Callback):
    """Trial, tokens/update, lr, warmup, tokens done, loss, status: printed every 20 s and
    whenever a trial ends."""

    def __init__(self, sweep: search_space.Sweep):
        self.sweep = sweep
        self.rows: Dict[str, Dict[str, Any]] = {}
        self.last_print = 0.0

    def _row(self, trial) -> Dict[str, Any]:
        if trial.trial_id not in self.rows:
            resolved = search_space.resolve(self.sweep, trial.config["trial"])
            c = resolved.cfg
            self.rows[trial.trial_id] = {
                "name": resolved.name,
                "B": c.batch.tokens_per_update if c else None,
                "lr": c.optim.lr if c else None,
                "warmup": c.schedule.warmup_tokens if c else None,
                "budget": c.train.total_tokens if c else None,
                "tokens": 0,
                "loss": None,
                "eval": None,
                "status": "PENDING",
            }
        return self.rows[trial.trial_id]

    def on_trial_start(self, iteration, trials, trial, **info):
        self._row(trial)["status"] = "RUNNING"

    def on_trial_result(self, iteration, trials, trial, result, **info):
        row = self._row(trial)
        row.update(
            tokens=result.get("tokens", row["tokens"]),
            loss=result.get("loss"),
            eval=result.get("eval_loss"),
            status="RUNNING",
        )
        if time.monotonic() - self.last_print > PRINT_EVERY_S:
            self.print()

    def on_trial_complete(self, iteration, trials, trial, **info):
        row = self._row(trial)
        row["status"] = "STOPPED" if row["budget"] and row["tokens"] < row["budget"] * 0.99 else "DONE"
        self.print()

    def on_trial_error(self, iteration, trials, trial, **info):
        self._row(trial)["status"] = "ERROR"
        self.print()

    def print(self) -> None:
        self.last_print = time.monotonic()
        header = (
            f"{'trial':<28} {'tokens/update':>13} {'lr':>9} {'warmup':>9} "
            f"{'tokens done':>13} {'loss':>7} {'eval':>7}  status"
        )
        lines = [
            f"--- sweep {self.sweep.name}: {sum(r['status'] in ('DONE', 'STOPPED') for r in self.rows.values())}"
            f"/{len(self.rows)} trials ended ---",
            header,
        ]
        for row in self.rows.values():
            lines.append(
                f"{row['name'][:28]:<28} {_fmt(row['B'], ',d'):>13} {_fmt(row['lr'], '.2e'):>9} "
                f"{_fmt(row['warmup'], ',d'):>9} {_fmt(row['tokens'], ',d'):>13} {_fmt(row['loss'], '.3f'):>7} "
                f"{_fmt(row['eval'], '.3f'):>7}  {row['status']}"
            )
        print("\n".join(lines), flush=True)


def _close_unfinished_runs(uri: str, trials, stopped_at: Dict[str, int]) -> None:
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
            tracking.set_tags(uri, t.run_id, {tracking.STOPPED_AT_TAG: str(t.stopped_at)})
        launch.close_run(uri, t.run_id, t.status, title=t.name)


def finish(
    sweep: search_space.Sweep,
    base,
    parent: str,
    error: Optional[BaseException],
    stopped_at: Optional[Dict[str, int]] = None,
) -> int:
    """Close the parent run and print the answer, the same as `orchestrator report` gives."""
    from orchestrator import analysis, report, report_render

    uri = base.tracking.uri
    trials = report.trials_of(uri, tracking.child_runs(uri, parent))
    _close_unfinished_runs(uri, trials, stopped_at or {})
    finished = [t for t in trials if t.outcome == "finished"]
    print(f"\n=== sweep {sweep.name}: {len(finished)} of {len(trials)} trials reached the budget ===")
    if trials:
        _log_parent_artifacts(uri, parent, trials)
    if finished:
        try:
            print("\n".join(report_render.summary_lines(analysis.analyse(trials))))
        except ValueError as exc:  # nothing to analyse (e.g. no batch size logged)
            print(f"no analysis: {exc}")
    status = "FAILED" if error is not None or not finished else "FINISHED"
    tracking.finish_run(uri, parent, status)
    print(f"MLflow: `{tracking.ui_command(uri)}`, then {tracking.ui_link(uri, base.tracking.experiment)}")
    print(f"report: orchestrator report {sweep.path} tracking.uri={uri}")
    if error is not None:
        print(f"sweep {sweep.name} failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0 if finished else 1


def _log_parent_artifacts(uri: str, parent: str, trials) -> None:
    from orchestrator import plots

    curves = {t.name: t.train for t in sorted(trials, key=lambda t: (t.batch or 0, t.lr or 0))}
    tracking.log_figure(
        uri, parent, plots.loss_vs_tokens(curves, title="train loss of every trial"), "loss_vs_tokens.png"
    )
