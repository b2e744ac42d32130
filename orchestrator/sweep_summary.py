"""What a sweep shows the user: a live table while it runs and the answer when it ends."""

from __future__ import annotations

import math
import sys
import time
from collections import defaultdict
from typing import Any, Dict, List, Optional

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
                "name": resolved.name, "B": c.batch.tokens_per_update if c else None, "lr": c.optim.lr if c else None,
                "warmup": c.schedule.warmup_tokens if c else None, "budget": c.train.total_tokens if c else None,
                "tokens": 0, "loss": None, "eval": None, "status": "PENDING",
            }
        return self.rows[trial.trial_id]

    def on_trial_start(self, iteration, trials, trial, **info):
        self._row(trial)["status"] = "RUNNING"

    def on_trial_result(self, iteration, trials, trial, result, **info):
        row = self._row(trial)
        row.update(tokens=result.get("tokens", row["tokens"]), loss=result.get("loss"), eval=result.get("eval_loss"),
                   status="RUNNING")
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
        header = f"{'trial':<28} {'tokens/update':>13} {'lr':>9} {'warmup':>9} {'tokens done':>13} {'loss':>7} {'eval':>7}  status"
        lines = [f"--- sweep {self.sweep.name}: {sum(r['status'] in ('DONE', 'STOPPED') for r in self.rows.values())}"
                 f"/{len(self.rows)} trials ended ---", header]
        for row in self.rows.values():
            lines.append(f"{row['name'][:28]:<28} {_fmt(row['B'], ',d'):>13} {_fmt(row['lr'], '.2e'):>9} "
                         f"{_fmt(row['warmup'], ',d'):>9} {_fmt(row['tokens'], ',d'):>13} {_fmt(row['loss'], '.3f'):>7} "
                         f"{_fmt(row['eval'], '.3f'):>7}  {row['status']}")
        print("\n".join(lines), flush=True)


def _trial_rows(uri: str, parent: str) -> List[Dict[str, Any]]:
    rows = []
    for run in tracking.child_runs(uri, parent):
        p, m = run.data.params, run.data.metrics
        rows.append({
            "run_id": run.info.run_id, "name": run.info.run_name, "status": run.info.status,
            "B": int(p.get("batch.tokens_per_update", 0)), "lr": float(p.get("optim.lr", "nan")),
            "budget": int(p.get("train.total_tokens_rounded", p.get("train.total_tokens", 0))),
            "tokens": int(m.get("train/tokens", 0)), "eval": m.get("eval/loss"), "loss": m.get("train/loss"),
        })
    return rows


def finish(sweep: search_space.Sweep, base, parent: str, results, error: Optional[BaseException]) -> int:
    """Close the parent run and print the answer: best trial, best lr per batch size, B_crit."""
    uri = base.tracking.uri
    rows = _trial_rows(uri, parent)
    for row in rows:
        # A scheduler stops a trial by ending its actor, which can happen right after the last
        # report too (ASHA stops every trial at max_t): close such runs here.
        if row["status"] != "RUNNING":
            continue
        if row["tokens"] >= row["budget"]:
            row["status"] = "FINISHED"
        else:
            row["status"] = "KILLED"
            tracking.set_tags(uri, row["run_id"], {"orchestrator.stopped": f"stopped by the scheduler at {row['tokens']:,} tokens"})
        launch.close_run(uri, row["run_id"], row["status"], title=row["name"])
    complete = [r for r in rows if r["tokens"] >= r["budget"] and r["eval"] is not None]
    print(f"\n=== sweep {sweep.name}: {len(complete)} of {len(rows)} trials reached the budget ===")
    if complete:
        best = min(complete, key=lambda r: r["eval"])
        print(f"best trial: {best['name']}  (tokens/update {best['B']:,}, lr {best['lr']:.3g}, final eval loss {best['eval']:.4f})")
        by_batch = defaultdict(list)
        for r in complete:
            by_batch[r["B"]].append(r)
        print("best learning rate per batch size:")
        for b in sorted(by_batch):
            r = min(by_batch[b], key=lambda x: x["eval"])
            print(f"  tokens/update {b:>10,}: lr {r['lr']:.3g}  eval loss {r['eval']:.4f}")
        _log_parent_artifacts(uri, parent, rows)
        _print_critical_batch(uri, parent)
    status = "FAILED" if error is not None or not complete else "FINISHED"
    tracking.finish_run(uri, parent, status)
    print(f"MLflow: `{tracking.ui_command(uri)}`, then {tracking.ui_link(uri, base.tracking.experiment)}")
    print(f"report: orchestrator report {sweep.path} tracking.uri={uri}")
    if error is not None:
        print(f"sweep {sweep.name} failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0 if complete else 1


def _log_parent_artifacts(uri: str, parent: str, rows: List[Dict[str, Any]]) -> None:
    from orchestrator import plots

    curves = {r["name"]: tracking.metric_history(uri, r["run_id"], "train/loss") for r in sorted(rows, key=lambda r: (r["B"], r["lr"]))}
    tracking.log_figure(uri, parent, plots.loss_vs_tokens(curves, title="train loss of every trial"), "loss_vs_tokens.png")


def _print_critical_batch(uri: str, parent: str) -> None:
    try:
        from orchestrator import report
    except ImportError:
        return
    try:
        info = report.critical_batch_summary(uri, parent)
    except Exception as exc:  # the analysis is a bonus here; `orchestrator report` says more
        print(f"critical batch size: not available ({exc})")
        return
    if info and info.get("b_crit") is not None and not 0 < info["b_crit"] < float("inf"):
        notes = "; ".join(info.get("notes") or []) or "the fit S = S_min + E_min / B is degenerate"
        b_simple = info.get("b_simple")
        print(f"critical batch size: not resolved by this sweep ({notes})"
              + (f"; measured B_simple ~ {b_simple:,.0f} tokens" if b_simple else ""))
    elif info and info.get("b_crit") is not None:
        lo, hi = info.get("b_crit_interval") or (None, None)
        b_simple = info.get("b_simple")
        print(f"critical batch size at loss {info.get('target_loss', float('nan')):.3f}: B_crit ~ {info['b_crit']:,.0f} tokens"
              + (f" (90% interval {lo:,.0f}..{hi:,.0f})" if lo is not None and hi is not None and math.isfinite(hi) else "")
              + (f"; measured B_simple ~ {b_simple:,.0f} tokens" if b_simple else "; B_simple not measured"))
