"""What runs inside each Tune trial's process (the Train V2 pattern: a function trainable that
calls TorchTrainer.fit()): resolve the trial's config, open (or find) its MLflow child run and
live one run (driver/run_life.py), or in a replay sweep serve it from recorded runs
(driver/replay.py). A trial finds its child run again by its Tune trial id, so a
retry or the sweep's `--resume` keeps logging into the same run. What the sweep's driver
(driver/sweep.py) hands every trial is a TrialSetup, pickled by Ray Tune as such.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from orchestrator.core import derived, storage
from orchestrator.core.phases import Phases
from orchestrator.core.schema import Config
from orchestrator.core.sweep_schema import Sweep
from orchestrator.driver import micro_batch, run_life
from orchestrator.studies import branch_study
from orchestrator.studies.study import StudyKind
from orchestrator.tracking.refusals import StoreRefusedWrites
from orchestrator.tracking.run_tags import (
    BRANCH_AT_TAG,
    CHECKPOINTS_TAG,
    DIGEST_TAG,
    PARENT_TAG,
    REPLAYED_TAG,
    REUSED_BY_PREFIX,
    RUN_COLOR_TAG,
    SWEEP_TAG,
    TRIAL_TAG,
)
from orchestrator.tracking.store import Store

_trials_in_this_process = 0  # a reused trial actor pays no process start


@dataclass(frozen=True)
class TrialSetup:
    """What every trial of one Tune run (a phase of the sweep) gets from the sweep's driver."""

    sweep: Sweep
    study: StudyKind
    """The sweep's kind (studies/kinds.kind_of): how a trial's values resolve, and its tags."""
    base: Config
    """The sweep's unvalidated base (studies/study.Prepared.unvalidated), read once by the driver:
    a trial parses the base file once, for its own config."""
    parent_run_id: str
    """The sweep's MLflow run, every trial's parent."""
    train_storage: str
    """Where Ray Train keeps a multi-worker trial's checkpoints (under its trial id)."""
    tune_storage: str
    """The Tune run's folder (a trial in local mode keeps its checkpoints in its trial folder)."""
    cwd: str
    """The user's working directory: Tune starts trials in their own folder."""
    tags: Mapping[str, str] = field(default_factory=dict)
    """Tags every trial's run gets besides its own (a branch study's base, or a branch's)."""
    batches: Tuple[int, ...] = ()
    """The tokens per update of the phase's trials (run_life.own_batch): the scale of the colour
    each trial's run is drawn in (mlflow.runColor), the report's."""
    fault_at_tokens: Optional[int] = None
    """The test hook the sweep's command read (run_life.injected_fault_at)."""
    device_memory: Optional[str] = None
    """The command's ORCHESTRATOR_DEVICE_MEMORY (micro_batch.DEVICE_MEMORY_ENV, a test hook): part
    of the key under which the driver kept each shape's micro-batch answer."""


@dataclass(frozen=True)
class OpenedRun:
    """A trial's config and its MLflow child run, opened, or reopened after a retry or `--resume`."""

    cfg: Config
    name: str
    run_id: str
    store: Store
    reopened: bool
    """The run was this trial's before (a retry, or `--resume`): it may hold steps already."""
    startup: Phases


def run_trial(params: Dict[str, Any], setup: TrialSetup) -> None:
    """One trial: its run opened, then trained (TorchTrainer), or in a replay sweep served from
    recorded runs (driver/replay.py). A trial that fails while the tracking store refuses writes
    fails with StoreRefusedWrites, which stops the sweep (driver/store_watch.py) instead of its
    retries and every later trial failing the same way."""
    try:
        opened = _open(params, setup)
        if opened is None:  # an infeasible point, or a run that finished before: reported as such
            return
        if setup.sweep.replay is None:
            _train(opened, setup)
        else:
            _serve_recorded(opened, setup.sweep)
    except Exception:
        refused = Store.of(setup.base).refuses_writes(setup.parent_run_id)
        if refused:
            raise StoreRefusedWrites(refused) from None
        raise


def _open(params: Dict[str, Any], setup: TrialSetup) -> Optional[OpenedRun]:
    """Resolve the trial's config, and open (or find) its MLflow child run; None where there is
    nothing to run: an infeasible point (reported as very bad), a run that finished (its own, or
    an earlier sweep's of the same config), reported as it ended."""
    from ray import tune

    startup = _trial_startup()
    sweep = setup.sweep
    if Path(setup.cwd).is_dir():  # Tune starts trials in their own folder; paths are the user's
        os.chdir(setup.cwd)
    trial = setup.study.resolve(sweep, params["trial"], setup.base)
    if trial.cfg is None:  # optuna proposed an infeasible point: report it as very bad
        tune.report({"tokens": 0, "eval_loss": float("inf"), "infeasible": trial.problem})
        return None
    cfg = trial.cfg
    run_life.resolve_paths(cfg)
    run_life.resolve_calibration(cfg)  # the driver's, in the base; else the trial's own (read once a process)
    if setup.device_memory:  # a trial on a Ray the command joined does not inherit its environment
        os.environ[micro_batch.DEVICE_MEMORY_ENV] = setup.device_memory
    micro_batch.resolve(cfg)  # the sweep's driver found it before the trials started: a cache hit
    trial_id = tune.get_context().get_trial_id()
    cfg.train.run_name = trial_id
    tags = _tags(setup, trial_id, cfg)
    store = Store.of(cfg)
    run_id = store.find_run(tags)  # this trial's own run, retried or after --resume
    if run_id and store.get_run(run_id).status == "FINISHED":
        # Finished before the driver died, but Tune's state had not caught up: do not rerun it.
        tune.report(_finished_result(store.get_run(run_id)))
        return None
    digest = run_life.config_digest(cfg)
    reused = None if run_id else store.find_finished({DIGEST_TAG: digest})
    if reused is not None:
        # An earlier sweep (a ladder before a rung was added) finished this very config: its run
        # stands for this trial, tagged so that this sweep's report reads it (report_inputs.trial_runs).
        store.set_tags(reused.run_id, {REUSED_BY_PREFIX + setup.parent_run_id: trial_id})
        print(f"trial {trial.name}: reusing finished run {reused.run_id} of the same config")
        tune.report(_finished_result(reused))
        return None
    if run_id:
        store.reopen_run(run_id)  # a retried trial: RUNNING again
        return OpenedRun(cfg, trial.name, run_id, store, True, startup)
    run_id = run_life.open_run(store, cfg, trial.name, {**tags, **_colour(setup, cfg), DIGEST_TAG: digest})
    return OpenedRun(cfg, trial.name, run_id, store, False, startup)


def _train(opened: OpenedRun, setup: TrialSetup) -> None:
    """The trial's TorchTrainer, fit; its run finished (Tune retries a failed trial from its checkpoint)."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    cfg, run_id, startup = opened.cfg, opened.run_id, opened.startup
    trial_id = cfg.train.run_name
    local = derived.in_trial_process(cfg, setup.sweep.local_mode)  # then the worker reports to Tune itself
    # Where the checkpoints go, for `orchestrator export`: in local mode Tune keeps them in the
    # trial's folder (its name is the one of the local trial dir), else Ray Train under the trial id.
    tune_dir = storage.join(setup.tune_storage, Path(tune.get_context().get_trial_dir()).name)
    checkpoints = tune_dir if local else storage.join(setup.train_storage, trial_id)
    opened.store.set_tags(run_id, {CHECKPOINTS_TAG: checkpoints})
    startup.mark("open_run")
    trainer = run_life.build_trainer(
        cfg,
        run_id,
        setup.train_storage,
        trial_id,
        callbacks=[] if local else [TuneReportCallback()],
        local_mode=local,
        startup=startup,
        fault_at_tokens=setup.fault_at_tokens,
    )
    _, error = run_life.fit(trainer)
    run_life.finish(opened.store, cfg, run_id, error)
    if error is not None:
        raise RuntimeError(f"trial {opened.name} failed: {error}")  # Tune retries it from its checkpoint


def _serve_recorded(opened: OpenedRun, sweep: Sweep) -> None:
    """The trial's recorded run into its MLflow run (past the steps it holds: a retried trial's)
    and to Tune, FAILED where the recording failed; a config the tables do not hold ends its run
    FAILED with the reason, and Tune hears an infinite loss."""
    from ray import tune

    from orchestrator.driver import replay  # the tables' reader: only in a replay sweep's trials

    cfg, run_id, store = opened.cfg, opened.run_id, opened.store
    logged = store.last_steps(run_id) if opened.reopened else {}
    values = replay.values_of(cfg)
    error = None
    try:
        served = replay.serve(
            values, sweep, lambda curves: store.log_history(run_id, replay.unlogged(curves, logged)), tune.report
        )
        store.set_tags(run_id, {REPLAYED_TAG: served})
    except replay.RecordedFailure as exc:
        error = exc
    except replay.NotRecorded as exc:
        error = exc
        tune.report({"tokens": 0, "eval_loss": math.inf, "refused": str(exc)})
    run_life.finish(store, cfg, run_id, error)


def _finished_result(run) -> Dict[str, Any]:
    """What a finished run's trial reports to Tune without training: its latest numbers."""
    latest = run.metrics
    return {
        "tokens": int(latest.get("train/tokens", 0)),
        "eval_loss": latest.get("eval/loss"),
        "loss": latest.get("train/loss"),
    }


def _tags(setup: TrialSetup, trial_id: str, cfg: Config) -> Dict[str, str]:
    """The trial's MLflow run tags, by which a retry finds the run again (and a ladder's rung)."""
    tags = {PARENT_TAG: setup.parent_run_id, TRIAL_TAG: trial_id, SWEEP_TAG: setup.sweep.name, **setup.tags}
    tags.update(setup.study.run_tags(setup.sweep, cfg))
    at = branch_study.branch_point(cfg)
    if at is not None:
        tags[BRANCH_AT_TAG] = str(at)
    return tags


def _colour(setup: TrialSetup, cfg: Config) -> Dict[str, str]:
    """mlflow.runColor: the run's batch size's colour on the report's scale, so MLflow's runs table
    and chart view colour runs as the report's figures do (not among the tags a retry finds it by)."""
    if not setup.batches:
        return {}
    from orchestrator.reporting.batch_colours import batch_hex  # matplotlib: only when a run is opened

    return {RUN_COLOR_TAG: batch_hex(run_life.own_batch(cfg), setup.batches)}


def _trial_startup() -> Phases:
    """The trial's start-up phases from here on; the first trial of a process also counts the
    process's start (Python, Ray's worker, the trainable's imports) as `startup/process_s`."""
    global _trials_in_this_process
    _trials_in_this_process += 1
    if _trials_in_this_process > 1:
        return Phases("startup")
    import psutil

    startup = Phases("startup", since=psutil.Process().create_time())
    startup.mark("process")
    return startup
