"""`orchestrator sweep`, the driver: a Ray Tune study in which every trial is the Ray Train run
of `orchestrator train` (driver/trial.py runs inside each trial's process). A single-worker trial
runs its TorchTrainer in Ray Train's local mode, inside the Tune trial's process, unless the
sweep file says `local_mode: false`: start-up, not compute, dominates small trials.

One MLflow parent run per sweep, one child run per trial. Everything is checked before anything
launches: bad sweep files and infeasible combinations exit 2 and no MLflow run is created. The
live table is driver/progress_table.py; closing the sweep and its answer driver/sweep_summary.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional

from orchestrator.core import config as config_lib
from orchestrator.core import derived, storage
from orchestrator.core.errors import ConfigError
from orchestrator.core.sweep_schema import Sweep
from orchestrator.driver import micro_batch, ray_session, replay, run_life
from orchestrator.driver.trial import TrialSetup, run_trial
from orchestrator.reporting import report_files
from orchestrator.studies import kinds, search_space
from orchestrator.studies.search_space import Trial
from orchestrator.studies.study import Prepared
from orchestrator.tracking.refusals import StoreRefusedWrites
from orchestrator.tracking.run_tags import (
    PARENT_TAG,
    ROLE_TAG,
    SCHEDULER_TAG,
    SEARCH_TAG,
    SWEEP_ROLE,
    SWEEP_TAG,
)
from orchestrator.tracking.store import Store

log = logging.getLogger(__name__)
RECORD = "sweep_run.json"


def _sweep_dir(root: str, name: str, resume: bool) -> str:
    """The folder (path or URI) of this run of the sweep: a new one, or with --resume the latest."""
    if resume:
        runs = [
            f
            for f in storage.subfolders(storage.join(root, name))
            if storage.read_json(storage.join(root, name, f, RECORD))
        ]
        if not runs:
            raise ConfigError("--resume", f"no earlier run of sweep {name!r} under {storage.join(root, name)}")
        return storage.join(root, name, runs[-1])
    return storage.join(root, name, time.strftime("%Y%m%d-%H%M%S"))


def _preflight(trials: List[Trial]) -> None:
    seen = set()
    for t in trials:
        what = [config_lib.to_dict(t.cfg)["data"], t.cfg.batch.tokens_per_update, t.cfg.train.start_from_checkpoint]
        key = json.dumps(what, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            run_life.ready(t.cfg)


def _import_while_ray_starts(uri: str) -> threading.Thread:
    """Starting a local Ray takes seconds, much of them in Ray's own new processes: meanwhile a
    thread imports what the driver needs next (MLflow's store, the closing report's figures),
    seconds a user would otherwise wait for. Imports only, of modules Ray's start does not import
    (so the two cannot wait on each other's import locks): nothing is written before every check
    has passed, and an import that fails here fails again, and is reported, where it is used."""
    import ray  # noqa: F401  (the package before the thread: what ray.init imports then is Ray's alone)

    def imports() -> None:
        with contextlib.suppress(Exception):
            from orchestrator.reporting import pipeline, plots  # noqa: F401
            from orchestrator.tracking import store

            store.preload(uri)

    thread = threading.Thread(target=imports, name="imports-while-ray-starts", daemon=True)
    thread.start()
    return thread


def _open_parent(prepared: Prepared) -> str:
    sweep, trials = prepared.sweep, prepared.trials
    store = Store.of(prepared.base)
    tags = {
        ROLE_TAG: SWEEP_ROLE,
        SWEEP_TAG: sweep.name,
        SEARCH_TAG: prepared.study.search_tag,
        SCHEDULER_TAG: sweep.scheduler.type,
    }
    run_id = store.create_run(f"sweep {sweep.name}", tags)
    params = dict(sweep.written)
    params["trials"] = len(trials) if trials is not None else sweep.search.num_samples
    store.log_params(run_id, {f"sweep.{k}": v for k, v in params.items()})
    store.log_text(run_id, sweep.text, sweep.path.name)  # the door redacts its URIs' passwords
    return run_id


def _scheduler(sweep: Sweep, budget: int):
    if sweep.scheduler.type != "asha":
        return None
    from orchestrator.studies.grouped_asha import GroupedASHA

    # time_attr = tokens: rungs are token counts, so trials are compared after the same number
    # of tokens; and only within their group (search_space.comparison_keys says why).
    return GroupedASHA(
        search_space.comparison_keys(sweep),
        time_attr="tokens",
        metric=sweep.search.metric,
        mode="min",
        max_t=budget,
        grace_period=sweep.scheduler.grace_period_tokens,
        reduction_factor=sweep.scheduler.reduction_factor,
    )


def _say_how_early_stopping_compares(prepared: Prepared) -> None:
    sweep, trials = prepared.sweep, prepared.trials
    if sweep.scheduler.type != "asha":
        return
    keys = ", ".join(search_space.comparison_keys(sweep))
    print(f"early stopping (ASHA) compares a trial only with trials of the same {keys}")
    lone = search_space.lone_groups(sweep, trials) if trials is not None else []
    if lone:
        print(
            f"  {len(lone)} of {len(trials)} {prepared.study.lone_trials}: "
            + ", ".join(t.name for t in lone[:6])
            + (" ..." if len(lone) > 6 else "")
            + "; sweep at least two configurations per batch size for early stopping to act"
        )


def run(sweep_path: str, overrides: List[str], resume: bool = False) -> int:
    """The sweep: read once and planned by its kind, every check before Ray, Ray, its parent run,
    Tune, its report."""
    prepared = kinds.prepare(sweep_path, overrides)
    folder = _check_before_ray(prepared, resume)
    on_ray = _start_ray(prepared)
    _open_or_resume(prepared, folder, resume)
    scheduler = None if resume else _scheduler(prepared.sweep, prepared.base.train.total_tokens)
    error = _tune(prepared, folder, resume, scheduler)
    from orchestrator.driver import sweep_summary

    leaving = ray_session.shut_down_meanwhile() if on_ray else None  # the closing report reads MLflow only
    try:
        stopped = getattr(scheduler, "stopped_at", None)  # which trials a fresh sweep's ASHA stopped where
        return sweep_summary.finish(prepared.sweep, prepared.base, prepared.parent_run, error, stopped)
    finally:
        if leaving:
            leaving.join()


def _check_before_ray(prepared: Prepared, resume: bool) -> str:
    """Everything a sweep checks before Ray starts: its paths, its kind's work on the plan (a
    branch study's base run found), every distinct trial's preflight, the storage, the folder
    its report goes to, the checkpoints a resumed sweep would load; its folder."""
    sweep, base = prepared.sweep, prepared.base
    if sweep.replay is not None:
        replay.check(sweep, [t.cfg for t in prepared.all_trials()])
    run_life.resolve_paths(base)
    run_life.resolve_calibration(base)  # read here, once: the trials' processes resolve against its value
    prepared.unvalidated.batch.calibration = base.batch.calibration
    prepared.unvalidated.batch.calibration_from = base.batch.calibration_from
    for t in prepared.skipped:
        log.warning("skipping infeasible trial [%s]: %s", t.name, t.problem)
    prepared.study.before_ray(prepared)
    _preflight(prepared.all_trials())
    storage.check_reachable(base.train.storage_path, "train.storage_path")  # once: every trial's lies under it
    report_files.check_out_folder(report_files.default_out(sweep.name))  # where the sweep's report goes when it ends
    _say_how_early_stopping_compares(prepared)
    folder = _sweep_dir(storage.join(base.train.storage_path, "sweeps"), sweep.name, resume)
    if resume and storage.local_path(folder) is not None:  # remote ones: each trial checks what it loads
        from workloads.train import checkpoint

        checkpoint.check_files(storage.local_path(folder), "--resume")
    return folder


def _start_ray(prepared: Prepared) -> bool:
    """Ray (started here, or joined), checked against every trial's shape; the `auto` micro-batches
    found. Whether this process started it."""
    base = prepared.base
    meanwhile = _import_while_ray_starts(base.tracking.uri)
    on_ray = ray_session.ray_init(base.cluster.address)
    meanwhile.join()
    ray_session.check_cluster(
        base, [derived.trial_shape(t.cfg, prepared.sweep.local_mode) for t in prepared.all_trials()]
    )
    micro_batch.resolve_all([t.cfg for t in prepared.all_trials()])
    return on_ray


def _open_or_resume(prepared: Prepared, folder: str, resume: bool) -> None:
    """The sweep's MLflow parent run: opened and recorded in its folder, or read back on --resume."""
    sweep = prepared.sweep
    if resume:
        prepared.parent_run = storage.read_json(storage.join(folder, RECORD))["parent_run_id"]
        where = config_lib.redact_uri(folder)
        print(f"resuming sweep {sweep.name!r} from {where} (MLflow parent run {prepared.parent_run})")
        return
    prepared.parent_run = _open_parent(prepared)
    storage.write_json(storage.join(folder, RECORD), {"parent_run_id": prepared.parent_run, "sweep": str(sweep.path)})
    where, count = config_lib.redact_uri(folder), prepared.study.describe(sweep, prepared.trials)
    print(f"sweep {sweep.name!r}: {count}, MLflow parent run {prepared.parent_run}, results in {where}")


def _tune(prepared: Prepared, folder: str, resume: bool, scheduler) -> Optional[BaseException]:
    """The kind's phases before Tune (a branch study's base run), then the study's Tune run; the
    error that ended it, if any (StoreRefusedWrites when the store refused the trials' writes)."""
    from orchestrator.driver import store_watch, tune_settings

    error = None
    with store_watch.watching() as watch:
        try:
            with tune_settings.quiet_tune():

                def tune_phase(trials: List[Trial], tags: Dict[str, str], phase: str) -> None:
                    _tuner(prepared, trials, folder, resume, None, tags, phase, watch).fit()

                tags = prepared.study.before_tune(prepared, tune_phase)
                _tuner(prepared, prepared.trials, folder, resume, scheduler, tags, "tune", watch).fit()
        except Exception as exc:
            error = exc
    if watch.refused:  # every trial stopped at the first that failed for it: the store is the reason
        error = StoreRefusedWrites(watch.refused)
    return error


def _mend_tune_state(phase_folder: str) -> None:
    """Tune's state files of a killed driver's sweep, cut short as it copied them, replaced by its
    staging copies (driver/tune_state.py), so that Tune resumes the trials instead of starting over."""
    from orchestrator.driver import tune_state

    local = storage.local_path(phase_folder)
    mended = tune_state.mend(local, tune_state.ray_temp_root()) if local else []
    if mended:
        print(f"resume: {', '.join(mended)} was cut short when the driver was killed; its whole copy restored")


def _tuner(prepared: Prepared, trials, folder: str, resume: bool, scheduler, tags, phase: str, watch):
    """The Tune run of `trials` (a phase of the sweep: `tune`, or a branch study's `base`), stopped
    by `watch` (store_watch.StoreWatch) when the store refuses a trial's writes."""
    from ray import tune

    from orchestrator.driver.progress_table import ProgressTable
    from orchestrator.driver.tune_settings import ForgetEndedTrialStatistics

    sweep, base, study = prepared.sweep, prepared.base, prepared.study
    setup = TrialSetup(
        sweep=sweep,
        study=study,
        base=prepared.unvalidated,
        parent_run_id=prepared.parent_run,
        train_storage=storage.join(folder, "train"),
        tune_storage=storage.join(folder, phase),
        cwd=os.getcwd(),
        tags=dict(tags),
        batches=tuple(sorted({run_life.own_batch(t.cfg) for t in trials or [] if t.cfg is not None})),
        fault_at_tokens=run_life.injected_fault_at(),
        device_memory=os.environ.get(micro_batch.DEVICE_MEMORY_ENV),
    )

    def resources(params: Dict[str, Any]) -> Dict[str, float]:
        if sweep.replay is not None:  # a replayed trial trains nothing: it holds what waiting holds
            return {"CPU": derived.TRIAL_DRIVER_CPUS}
        return derived.trial_resources(study.resolve(sweep, params["trial"]).cfg, sweep.local_mode)

    trainable = tune.with_resources(tune.with_parameters(run_trial, setup=setup), resources)
    # A phase resumed before it had started (a branch study's branches) begins afresh.
    if resume and tune.Tuner.can_restore(storage.join(folder, phase)):
        _mend_tune_state(storage.join(folder, phase))
        return tune.Tuner.restore(storage.join(folder, phase), trainable, resume_unfinished=True, resume_errored=True)
    runs = {
        "uri": base.tracking.uri,
        "experiment": base.tracking.experiment,
        "tags": {PARENT_TAG: prepared.parent_run, SWEEP_TAG: sweep.name},
    }
    search = study.search(sweep, trials, runs)  # a phase before Tune's (a branch study's base): the kind's too
    asha = sweep.scheduler.type == "asha"
    return tune.Tuner(
        trainable,
        param_space=search.space,
        tune_config=tune.TuneConfig(
            num_samples=search.samples,
            max_concurrent_trials=sweep.search.max_concurrent,
            # A finished trial's process runs the next trial of the same resource shape: no new
            # Python, Ray worker or imports of torch, DeepSpeed and MLflow (the bulk of a small
            # trial's start-up). Tune starts a fresh one when the last trial's thread lingers.
            reuse_actors=True,
            scheduler=scheduler,
            search_alg=search.searcher,
            metric=None if search.searcher or asha else sweep.search.metric,
            mode=None if search.searcher or asha else "min",
        ),
        run_config=tune.RunConfig(
            name=phase,
            storage_path=folder,
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            stop=watch,
            # Checkpoints of trials in local mode (multi-worker trials keep theirs with Ray Train).
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=trials[0].cfg.train.keep_checkpoints if trials else base.train.keep_checkpoints
            ),
            callbacks=[ProgressTable(sweep, study=study, base=prepared.unvalidated), ForgetEndedTrialStatistics()],
            verbose=0,
        ),
    )
