"""`orchestrator sweep`: a Ray Tune study in which every trial is the Ray Train run of
`orchestrator train` (the Train V2 pattern: a function trainable that calls TorchTrainer.fit()).
A single-worker trial runs its TorchTrainer in Ray Train's local mode, inside the Tune trial's
process, unless the sweep file says `local_mode: false`: start-up, not compute, dominates
small trials.

One MLflow parent run per sweep, one child run per trial. A trial finds its child run again by
its Tune trial id, so a retry or `--resume` keeps logging into the same run. Everything is
checked before anything launches: bad sweep files and infeasible combinations exit 2 and no
MLflow run is created.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, List

from orchestrator.core import config as config_lib
from orchestrator.core import storage, sweep_schema
from orchestrator.core.errors import ConfigError
from orchestrator.core.phases import Phases
from orchestrator.driver import launch, micro_batch, ray_session
from orchestrator.reporting import report_files
from orchestrator.sweeps import branch_study, ladder_plan, placement, search_space
from orchestrator.tracking.run_tags import (
    BRANCH_AT_TAG,
    BRANCH_OF_TAG,
    CHECKPOINTS_TAG,
    DIGEST_TAG,
    PARENT_TAG,
    REUSED_BY_PREFIX,
    ROLE_TAG,
    SCHEDULER_TAG,
    SEARCH_TAG,
    SWEEP_ROLE,
    SWEEP_TAG,
    TRIAL_TAG,
)
from orchestrator.tracking.store import Store

log = logging.getLogger(__name__)
RECORD = "sweep_run.json"
_trials_in_this_process = 0  # a reused trial actor pays no process start


# ---------------------------------------------------------------- inside each Tune trial


def _finished_result(run) -> Dict[str, Any]:
    """What a finished run's trial reports to Tune without training: its latest numbers."""
    latest = run.metrics
    return {
        "tokens": int(latest.get("train/tokens", 0)),
        "eval_loss": latest.get("eval/loss"),
        "loss": latest.get("train/loss"),
    }


def run_trial(params: Dict[str, Any], setup: Dict[str, Any]) -> None:
    """One trial: resolve its config, open (or find) its MLflow child run, run TorchTrainer."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    startup = _trial_startup()
    sweep: sweep_schema.Sweep = setup["sweep"]
    if Path(setup["cwd"]).is_dir():  # Tune starts trials in their own folder; paths are the user's
        os.chdir(setup["cwd"])
    trial = search_space.resolve(sweep, params["trial"])
    if trial.cfg is None:  # optuna proposed an infeasible point: report it as very bad
        tune.report({"tokens": 0, "eval_loss": float("inf"), "infeasible": trial.problem})
        return
    cfg = trial.cfg
    launch.resolve_paths(cfg)
    micro_batch.resolve(cfg)  # the sweep's driver found it before the trials started: a cache hit
    trial_id = tune.get_context().get_trial_id()
    cfg.train.run_name = trial_id
    tags = {
        PARENT_TAG: setup["parent_run_id"],
        TRIAL_TAG: trial_id,
        SWEEP_TAG: sweep.name,
    }
    tags.update(setup.get("tags", {}))
    tags.update(ladder_plan.rung_tags(sweep, cfg))
    at = branch_study.branch_point(cfg)
    if at is not None:
        tags[BRANCH_AT_TAG] = str(at)
    store = Store.of(cfg)
    run_id = store.find_run(tags)  # this trial's own run, retried or after --resume
    if run_id and store.get_run(run_id).status == "FINISHED":
        # Finished before the driver died, but Tune's state had not caught up: do not rerun it.
        tune.report(_finished_result(store.get_run(run_id)))
        return
    digest = launch.config_digest(cfg)
    reused = None if run_id else store.find_finished({DIGEST_TAG: digest})
    if reused is not None:
        # An earlier sweep (a ladder before a rung was added) finished this very config: its run
        # stands for this trial, tagged so that this sweep's report reads it (report_inputs.trial_runs).
        store.set_tags(reused.run_id, {REUSED_BY_PREFIX + setup["parent_run_id"]: trial_id})
        print(f"trial {trial.name}: reusing finished run {reused.run_id} of the same config")
        tune.report(_finished_result(reused))
        return
    if run_id:
        store.reopen_run(run_id)  # a retried trial: RUNNING again
    run_id = run_id or launch.open_run(cfg, trial.name, {**tags, DIGEST_TAG: digest})
    local = placement.in_trial_process(sweep, cfg)  # then the worker reports to Tune itself
    # Where the checkpoints go, for `orchestrator export`: in local mode Tune keeps them in the
    # trial's folder (its name is the one of the local trial dir), else Ray Train under the trial id.
    tune_dir = storage.join(setup["tune_storage"], Path(tune.get_context().get_trial_dir()).name)
    checkpoints = tune_dir if local else storage.join(setup["train_storage"], trial_id)
    store.set_tags(run_id, {CHECKPOINTS_TAG: checkpoints})
    startup.mark("open_run")
    trainer = launch.build_trainer(
        cfg,
        run_id,
        setup["train_storage"],
        trial_id,
        callbacks=[] if local else [TuneReportCallback()],
        local_mode=local,
        startup=startup,
    )
    error = None
    try:
        error = trainer.fit().error
    except Exception as exc:
        error = exc
    launch.finish(cfg, run_id, error)
    if error is not None:
        raise RuntimeError(f"trial {trial.name} failed: {error}")  # Tune retries it from its checkpoint


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


# ---------------------------------------------------------------- the driver


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


def _preflight(trials: List[search_space.Trial]) -> None:
    seen = set()
    for t in trials:
        what = [config_lib.to_dict(t.cfg)["data"], t.cfg.batch.tokens_per_update, t.cfg.train.start_from_checkpoint]
        key = json.dumps(what, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            launch.resolve_paths(t.cfg)
            launch.preflight(t.cfg)


def _open_parent(sweep: sweep_schema.Sweep, cfg, trials) -> str:
    store = Store.of(cfg)
    tags = {
        ROLE_TAG: SWEEP_ROLE,
        SWEEP_TAG: sweep.name,
        SEARCH_TAG: sweep.search.algorithm,
        SCHEDULER_TAG: sweep.scheduler.type,
    }
    run_id = store.create_run(f"sweep {sweep.name}", tags)
    params = dict(sweep.written)
    params["trials"] = len(trials) if trials is not None else sweep.search.num_samples
    store.log_params(run_id, {f"sweep.{k}": v for k, v in params.items()})
    store.log_text(run_id, sweep.text, sweep.path.name)  # the door redacts its URIs' passwords
    return run_id


def _param_space(sweep: sweep_schema.Sweep, trials, runs: Dict[str, Any]):
    """Tune's param space and searcher. `runs`: where the trials' MLflow runs are (the bracket
    search's steps criterion reads them)."""
    from ray import tune

    if sweep.search.algorithm == "bracket":  # trials: its first round
        from orchestrator.sweeps.bracket_search import BracketSearch, LadderSearch

        if sweep.ladder is not None and sweep.ladder.predict:  # later rungs placed from the finished ones
            return {}, LadderSearch.from_sweep(sweep, trials, runs)
        return {}, BracketSearch.from_sweep(sweep, trials, runs)
    if trials is not None:
        return {"trial": tune.grid_search([t.values for t in trials])}, None
    from ray.tune.search.optuna import OptunaSearch

    dists = {
        "grid": tune.choice,
        "choice": tune.choice,
        "uniform": lambda a: tune.uniform(*a),
        "loguniform": lambda a: tune.loguniform(*a),
        "randint": lambda a: tune.randint(a[0], a[1] + 1),
    }
    space = {"trial": {k: dists[next(iter(s))](next(iter(s.values()))) for k, s in sweep.space.items()}}
    storage = None
    if sweep.search.optuna_storage:  # a study optuna-dashboard can open, one per sweep run
        import optuna

        storage = optuna.storages.RDBStorage(sweep.search.optuna_storage)
    searcher = OptunaSearch(
        metric=sweep.search.metric,
        mode="min",
        seed=sweep.search.seed,
        storage=storage,
        study_name=f"{sweep.name} {runs['tags'][PARENT_TAG][:8]}" if storage else None,
    )
    return space, searcher


def _scheduler(sweep: sweep_schema.Sweep, budget: int):
    if sweep.scheduler.type != "asha":
        return None
    from orchestrator.sweeps.grouped_asha import GroupedASHA

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


def _say_how_early_stopping_compares(sweep: sweep_schema.Sweep, trials) -> None:
    if sweep.scheduler.type != "asha":
        return
    keys = ", ".join(search_space.comparison_keys(sweep))
    print(f"early stopping (ASHA) compares a trial only with trials of the same {keys}")
    lone = search_space.lone_groups(sweep, trials) if trials is not None else []
    if lone:
        what = (
            "first-round trials have no such peer and are not stopped early (the search's later lrs are "
            "compared with them)"
            if sweep.search.algorithm == "bracket"
            else "trials have no such peer and are never stopped early"
        )
        print(
            f"  {len(lone)} of {len(trials)} {what}: "
            + ", ".join(t.name for t in lone[:6])
            + (" ..." if len(lone) > 6 else "")
            + "; sweep at least two configurations per batch size for early stopping to act"
        )


def _how_many(sweep: sweep_schema.Sweep, trials) -> str:
    s = sweep.search
    if s.algorithm != "bracket":
        return f"{len(trials) if trials else s.num_samples} trials"
    return (
        f"bracket search of the learning rate per batch size, criterion {s.criterion} (search.criterion), "
        f"step {s.lr_step:g}; first round {len(trials)} trials, at most {search_space.bracket_bound(sweep)} "
        f"({s.max_lrs_per_batch} lrs per batch size and group)"
    )


def run(sweep_path: str, overrides: List[str], resume: bool = False) -> int:
    prepared = search_space.prepare(sweep_path, overrides)
    sweep, base, trials, base_trial = prepared.sweep, prepared.base, prepared.trials, prepared.base_trial
    launch.resolve_paths(base)
    for t in prepared.skipped:
        log.warning("skipping infeasible trial [%s]: %s", t.name, t.problem)
    first, base_run = prepared.all_trials(), None
    if sweep.branch and sweep.branch.from_run:  # an existing run: found, with its checkpoints, before Ray starts
        base_run = branch_study.find_base(base.tracking.uri, base.tracking.experiment, sweep.branch.from_run)
        trials = first = _from_checkpoints(sweep, base, base_run, trials)
    _preflight(first)
    storage.check_reachable(base.train.storage_path, "train.storage_path")  # once: every trial's lies under it
    report_files.check_out_folder(report_files.default_out(sweep.name))  # where the sweep's report goes when it ends
    _say_how_early_stopping_compares(sweep, trials)
    folder = _sweep_dir(storage.join(base.train.storage_path, "sweeps"), sweep.name, resume)
    if resume and storage.local_path(folder) is not None:  # remote ones: each trial checks what it loads
        from workloads.train import checkpoint

        checkpoint.check_files(storage.local_path(folder), "--resume")
    ray_session.ray_init(base.cluster.address)
    ray_session.check_cluster(base, placement.trial_shapes(sweep, first))
    micro_batch.resolve_all([t.cfg for t in first])
    if resume:
        parent = storage.read_json(storage.join(folder, RECORD))["parent_run_id"]
        print(f"resuming sweep {sweep.name!r} from {config_lib.redact_uri(folder)} (MLflow parent run {parent})")
    else:
        parent = _open_parent(sweep, base, trials)
        storage.write_json(storage.join(folder, RECORD), {"parent_run_id": parent, "sweep": str(sweep.path)})
        where = config_lib.redact_uri(folder)
        print(f"sweep {sweep.name!r}: {_how_many(sweep, trials)}, MLflow parent run {parent}, results in {where}")

    # Tune restores its own scheduler on --resume; a fresh sweep's tells which trials it stopped where.
    scheduler, error = None if resume else _scheduler(sweep, base.train.total_tokens), None
    try:
        tags = {}
        with _only_our_progress():
            if sweep.branch:
                if base_run is None:
                    base_run = _train_base(sweep, base, parent, folder, resume, len(trials), base_trial)
                    trials = _from_checkpoints(sweep, base, base_run, trials)
                tags = {BRANCH_OF_TAG: base_run}
            _tuner(sweep, trials, base, parent, folder, resume, scheduler, tags=tags).fit()
    except Exception as exc:
        error = exc
    from orchestrator.driver import sweep_summary

    return sweep_summary.finish(sweep, base, parent, error, getattr(scheduler, "stopped_at", None))


def _train_base(sweep, base, parent: str, folder: str, resume: bool, branches: int, base_trial) -> str:
    """A branch study's base run, trained now as its own Tune phase (a resumed study finds it
    finished): its MLflow run id."""
    store, tags = Store.of(base), branch_study.base_tags(parent)
    run_id = store.find_run(tags)
    if not run_id or store.get_run(run_id).status != "FINISHED":
        print(f"branch study {sweep.name!r}: the base run first, then {branches} branches")
        _tuner(sweep, [base_trial], base, parent, folder, resume, None, tags=tags, phase="base").fit()
        run_id = store.find_run(tags)
    if not run_id or store.get_run(run_id).status != "FINISHED":
        raise RuntimeError(f"the base run of branch study {sweep.name!r} did not finish (MLflow run {run_id})")
    return run_id


def _from_checkpoints(sweep, base, run_id: str, branches) -> List[search_space.Trial]:
    """The branch trials, each with the base run's checkpoint at its branch point."""
    checkpoints = branch_study.checkpoints_of(base.tracking.uri, run_id, sweep.branch.at_tokens)
    trials = [
        search_space.resolve(
            sweep, {**t.values, "train.start_from_checkpoint": checkpoints[branch_study.branch_at(t.cfg)]}
        )
        for t in branches
    ]
    refused = next((t for t in trials if t.cfg is None), None)
    if refused is not None:
        raise ConfigError("branch.at_tokens", f"the base run {run_id}: {refused.problem}")
    return trials


@contextlib.contextmanager
def _only_our_progress():
    """Ray Tune's output engine prints its configuration box and a TensorBoard hint into the
    sweep's output even at verbose=0; its legacy engine at verbose=0 prints nothing, so the
    progress table is the sweep's one account of its trials."""
    saved = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = saved


def _can_restore(path: str) -> bool:
    from ray import tune

    return tune.Tuner.can_restore(path)


def _tuner(sweep, trials, base, parent: str, folder: str, resume: bool, scheduler, tags=None, phase="tune"):
    """The Tune run of `trials` (a branch study's base is a phase of its own, `base`)."""
    from ray import tune

    from orchestrator.driver.sweep_summary import ProgressTable

    setup = {
        "sweep": sweep,
        "parent_run_id": parent,
        "train_storage": storage.join(folder, "train"),
        "tune_storage": storage.join(folder, phase),
        "cwd": os.getcwd(),
        "tags": dict(tags or {}),
    }
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, setup=setup), lambda params: placement.trial_resources(sweep, params)
    )
    # A branch study resumed before a phase had started begins that phase afresh.
    if resume and (not sweep.branch or _can_restore(storage.join(folder, phase))):
        return tune.Tuner.restore(storage.join(folder, phase), trainable, resume_unfinished=True, resume_errored=True)
    runs = {
        "uri": base.tracking.uri,
        "experiment": base.tracking.experiment,
        "tags": {PARENT_TAG: parent, SWEEP_TAG: sweep.name},
    }
    space, searcher = _param_space(sweep, trials, runs)
    samples = 1  # grid and random trials are laid out in the param space; bracket and optuna suggest theirs
    if sweep.search.algorithm == "bracket":
        samples = search_space.bracket_bound(sweep)
    elif sweep.search.algorithm == "optuna":
        samples = sweep.search.num_samples
    return tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            num_samples=samples,
            max_concurrent_trials=sweep.search.max_concurrent,
            # A finished trial's process runs the next trial of the same resource shape: no new
            # Python, Ray worker or imports of torch, DeepSpeed and MLflow (the bulk of a small
            # trial's start-up). Tune starts a fresh one when the last trial's thread lingers.
            reuse_actors=True,
            scheduler=scheduler,
            search_alg=searcher,
            metric=None if searcher or sweep.scheduler.type == "asha" else sweep.search.metric,
            mode=None if searcher or sweep.scheduler.type == "asha" else "min",
        ),
        run_config=tune.RunConfig(
            name=phase,
            storage_path=folder,
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            # Checkpoints of trials in local mode (multi-worker trials keep theirs with Ray Train).
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=trials[0].cfg.train.keep_checkpoints if trials else base.train.keep_checkpoints
            ),
            callbacks=[ProgressTable(sweep)],
            verbose=0,
        ),
    )
