"""`orchestrator train`: one run = one Ray Train TorchTrainer of D DeepSpeed workers, its life
in driver/run_life.py; here what the command adds: the run's name and record, resuming, the
progress it prints.

Everything that can be validated is validated before Ray starts (exit 2, and no MLflow run is
created for bad input). Re-running the same command with the same `train.run_name` resumes: Ray
Train finds the run's checkpoints under `train.storage_path/<run_name>` and the MLflow run id is
kept beside them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from orchestrator.core import storage
from orchestrator.core.config import redact_uri
from orchestrator.core.derived import ADAPTIVE, rounded_budget, shape_of
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config
from orchestrator.driver import micro_batch, ray_session, run_life
from orchestrator.driver import plan as planning
from orchestrator.formulas import batching
from orchestrator.tracking import mlflow_ui
from orchestrator.tracking.records import RunRecord
from orchestrator.tracking.run_tags import CHECKPOINTS_TAG, FAILURE_TAG, REALISED_RAMP_TAG, warnings_in
from orchestrator.tracking.store import Store

RUN_RECORD = "orchestrator_run.json"
log = logging.getLogger(__name__)


class Stopped(Exception):
    """The command was told to stop (SIGTERM: a scheduler, `kill`, a pod's end)."""


@contextlib.contextmanager
def stopped_by_sigterm():
    """SIGTERM raises Stopped in the main thread while training (so the run is closed as KILLED),
    instead of ending the process where it stands (Ray's own handler then dumps its C++ stack)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _show_worker_warnings(cfg: Config, tags: Dict[str, str], shown: Set[str]) -> None:
    """Print the warnings the run's workers recorded (run tags) that were not shown yet."""
    for tag, message in warnings_in(tags).items():
        if tag not in shown:
            shown.add(tag)
            log.warning("[%s] worker: %s", cfg.train.run_name, message)


def _show_progress(cfg: Config, store: Store, run_id: str, worker: threading.Thread, every_s: float = 5.0) -> None:
    """Tokens, loss, tokens/s and ETA from what the run has logged, and the workers' warnings,
    until training ends."""
    budget, shown, started = rounded_budget(cfg), None, time.monotonic()
    # A resumed run's earlier warnings were shown by the command that ran it then.
    warned = set(_run_tags(store, run_id))
    while worker.is_alive():
        worker.join(every_s)
        try:
            run = store.get_run(run_id)
        except Exception:  # the store is busy or away: try again at the next tick
            continue
        _show_worker_warnings(cfg, run.tags, warned)
        latest = run.metrics
        tokens = int(latest.get("train/tokens", 0))
        if not tokens or tokens == shown:
            continue
        shown, speed = tokens, latest.get("perf/tokens_per_s", 0.0)
        left = (budget - tokens) / speed if speed else float("nan")
        eta = f"{int(left) // 60}:{int(left) % 60:02d}" if left == left else "?"
        evaluation = f" eval {latest['eval/loss']:.4f}" if "eval/loss" in latest else ""
        print(
            f"[{cfg.train.run_name}] {tokens:,}/{budget:,} tokens ({100 * tokens / budget:.0f}%) "
            f"loss {latest.get('train/loss', float('nan')):.4f}{evaluation} {speed:,.0f} tok/s ETA {eta} "
            f"({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    _show_worker_warnings(cfg, _run_tags(store, run_id), warned)  # those sent at the workers' teardown


def _run_tags(store: Store, run_id: str) -> Dict[str, str]:
    try:
        return store.get_run(run_id).tags
    except Exception:  # the store is busy or away: the progress loop tries again
        return {}


def run_record(storage_path: str | Path, name: str) -> Optional[Dict[str, Any]]:
    """The record kept beside the checkpoints of run `name` (None before its first start)."""
    return storage.read_json(storage.join(str(storage_path), name, RUN_RECORD))


def recorded_run_id(storage_path: str | Path, name: str) -> Optional[str]:
    """The MLflow run id kept beside the checkpoints of run `name` (None before its first start)."""
    record = run_record(storage_path, name)
    return record["mlflow_run_id"] if record else None


def finished_already(cfg: Config, record: Optional[Dict[str, Any]], digest: str) -> Optional[RunRecord]:
    """The MLflow run of a run's `record` if it finished with this very config (the record's
    digest): training it again would train nothing, so it starts no Ray. A run of another config
    under that name (a longer budget, say) resumes from its checkpoint instead."""
    if not record or record.get("config_digest") != digest:
        return None
    run = Store.of(cfg).try_get_run(record["mlflow_run_id"])
    return run if run is not None and run.status == "FINISHED" else None


def unfinished_run(cfg: Config, digest: str) -> str:
    """The name of the newest run of this config under train.storage_path whose MLflow run did
    not finish (`train --resume` without train.run_name)."""
    found = []
    for name in storage.subfolders(cfg.train.storage_path):
        record = run_record(cfg.train.storage_path, name) or {}
        if record.get("config_digest") == digest:
            run = Store.of(cfg).try_get_run(record["mlflow_run_id"])
            if run is None or run.status != "FINISHED":
                found.append((record.get("started", 0), name))
    if not found:
        raise ConfigError(
            "--resume",
            f"no unfinished run of this config under {cfg.train.storage_path}; "
            "give train.run_name=NAME to resume a run by name, or drop --resume to start a new one",
        )
    return max(found)[1]


def train(cfg: Config, resume: bool = False) -> int:
    run_life.ready(cfg)
    storage.check_reachable(cfg.train.storage_path, "train.storage_path")
    digest = run_life.config_digest(cfg)
    if resume and not cfg.train.run_name:
        cfg.train.run_name = unfinished_run(cfg, digest)
    name = cfg.train.run_name = cfg.train.run_name or f"{cfg.model.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = storage.join(cfg.train.storage_path, name)
    record = run_record(cfg.train.storage_path, name)
    run_id = record["mlflow_run_id"] if record else None
    if resume and not run_id:
        raise ConfigError("--resume", f"no run named {name!r} under {cfg.train.storage_path} to resume")
    done = finished_already(cfg, record, digest)
    if done is not None:
        final = f"final eval loss {done.metrics['eval/loss']:.4f}, " if "eval/loss" in done.metrics else ""
        print(
            f"run {name!r} finished already with this config: {final}MLflow run {run_id}; nothing to train "
            f"(another train.run_name starts a new run)\nopen it with {_where_to_open(cfg, run_id)}"
        )
        return 0
    if run_id and storage.local_path(folder) is not None:  # remote ones: the worker checks what it loads
        from workloads.train import checkpoint

        checkpoint.check_files(storage.local_path(folder), "train.storage_path")
    ray_session.ray_init(cfg.cluster.address)
    ray_session.check_cluster(cfg, [shape_of(cfg)])
    micro_batch.resolve(cfg)
    store = Store.of(cfg)
    try:
        with stopped_by_sigterm():
            run_id = _open_run(store, cfg, name, folder, run_id, digest)
            return _fit_and_finish(store, cfg, name, run_id)
    except (Stopped, KeyboardInterrupt) as stop:  # close the run as KILLED: resumable, not RUNNING forever
        _end_stopped(store, name, run_id, str(stop) or "Ctrl-C", 143 if isinstance(stop, Stopped) else 130)


def _open_run(store: Store, cfg: Config, name: str, folder: str, run_id: Optional[str], digest: str) -> str:
    """Reopen the run being resumed, or open a new one and record it beside its checkpoints."""
    if run_id:
        store.reopen_run(run_id)  # RUNNING again, so system metrics resume
        print(f"resuming run {name!r} (MLflow run {run_id}) from its latest checkpoint in {redact_uri(folder)}")
    else:
        run_id = run_life.open_run(store, cfg, name, {CHECKPOINTS_TAG: folder})  # for `orchestrator export`
        record = {
            "mlflow_run_id": run_id,
            "experiment": cfg.tracking.experiment,
            "config_digest": digest,  # what `train --resume` without a name looks for
            "started": time.time(),
        }
        storage.write_json(storage.join(folder, RUN_RECORD), record)
        print(f"run {name!r}: MLflow run {run_id}, checkpoints in {redact_uri(folder)}")
        print("  interrupted? the same command with --resume continues it")
    return run_id


def _fit_and_finish(store: Store, cfg: Config, name: str, run_id: str) -> int:
    """Train on Ray Train in a thread while the progress is printed here, then close the run."""
    print(planning.format_table(planning.describe(cfg)), flush=True)
    fitted: List[Tuple[Optional[Dict[str, Any]], Optional[BaseException]]] = []

    def fit() -> None:
        try:
            trainer = run_life.build_trainer(
                cfg, run_id, cfg.train.storage_path, name, fault_at_tokens=run_life.injected_fault_at()
            )
        except Exception as exc:  # the run failed, not the input (checked above)
            fitted.append((None, exc))
        else:
            fitted.append(run_life.fit(trainer))

    worker = threading.Thread(target=fit, name="trainer-fit", daemon=True)
    worker.start()
    _show_progress(cfg, store, run_id, worker)
    metrics, error = fitted[0] if fitted else (None, None)
    outcome = run_life.finish(store, cfg, run_id, error)
    if outcome != "FINISHED":
        print(
            f"run {name!r} failed: {redact_uri(outcome)}\nMLflow run {run_id}: open with {_where_to_open(cfg, run_id)}",
            file=sys.stderr,
        )
        return 1
    final = f"final eval loss {metrics['eval_loss']:.4f}, " if metrics and "eval_loss" in metrics else ""
    print(f"run {name!r} finished: {final}MLflow run {run_id}\nopen it with {_where_to_open(cfg, run_id)}")
    if cfg.batch.schedule == ADAPTIVE:
        print(f"the batch sizes it took, to replay as a fixed ramp: '{realised_ramp(store, cfg, run_id)}'")
    return 0


def _end_stopped(store: Store, name: str, run_id: Optional[str], why: str, code: int) -> None:
    """A stopped command: its run (if it has one yet) closed KILLED with the reason, one line on
    how to resume, and the process ended: the training thread is still inside Ray, and leaving Ray
    now would have its core worker abort the process (exit 1, with a C++ message); a local Ray's
    processes end with it."""
    if run_id:
        store.set_tags(run_id, {FAILURE_TAG: f"stopped by {why}"})
        run_life.close_run(store, run_id, "KILLED", title=name)
        print(
            f"run {name!r} stopped by {why}: MLflow run {run_id} ended KILLED; the same command with --resume "
            "continues it from its latest checkpoint",
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _where_to_open(cfg: Config, run_id: str) -> str:
    """The command that serves the run's MLflow UI, then the run's page there."""
    link = mlflow_ui.ui_link(cfg.tracking.uri, cfg.tracking.experiment, run_id=run_id)
    return f"`{mlflow_ui.ui_command(cfg.tracking.uri)}`, then {link}"


def realised_ramp(store: Store, cfg: Config, run_id: str) -> str:
    """An adaptive run's `batch.ramp` override, from its MLflow tag (the worker sets it at every
    doubling; without one the run kept its first batch)."""
    tag = store.get_run(run_id).tags.get(REALISED_RAMP_TAG)
    return tag or batching.ramp_override([(0, cfg.batch.tokens_per_update)])
