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
from typing import Any, Dict, List

from orchestrator.core import config as config_lib
from orchestrator.core import storage, sweep_schema
from orchestrator.core.errors import ConfigError
from orchestrator.driver import micro_batch, ray_session, run_life
from orchestrator.driver.trial import TrialSetup, run_trial
from orchestrator.reporting import report_files
from orchestrator.studies import branch_study, placement, search_space
from orchestrator.tracking.refusals import StoreRefusedWrites
from orchestrator.tracking.run_tags import (
    BRANCH_OF_TAG,
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


def _preflight(trials: List[search_space.Trial]) -> None:
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
        from orchestrator.studies.bracket_search import BracketSearch, LadderSearch

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
    run_life.resolve_paths(base)
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
    meanwhile = _import_while_ray_starts(base.tracking.uri)
    on_ray = ray_session.ray_init(base.cluster.address)
    meanwhile.join()
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
    from orchestrator.driver import store_watch

    with store_watch.watching() as watch:
        try:
            tags = {}
            with _only_our_progress():
                if sweep.branch:
                    if base_run is None:
                        base_run = _train_base(sweep, base, parent, folder, resume, len(trials), base_trial, watch)
                        trials = _from_checkpoints(sweep, base, base_run, trials)
                    tags = {BRANCH_OF_TAG: base_run}
                _tuner(sweep, trials, base, parent, folder, resume, scheduler, tags=tags, watch=watch).fit()
        except Exception as exc:
            error = exc
    if watch.refused:  # every trial stopped at the first that failed for it: the store is the reason
        error = StoreRefusedWrites(watch.refused)
    from orchestrator.driver import sweep_summary

    leaving = ray_session.shut_down_meanwhile() if on_ray else None  # the closing report reads MLflow only
    try:
        return sweep_summary.finish(sweep, base, parent, error, getattr(scheduler, "stopped_at", None))
    finally:
        if leaving:
            leaving.join()


def _train_base(sweep, base, parent: str, folder: str, resume: bool, branches: int, base_trial, watch) -> str:
    """A branch study's base run, trained now as its own Tune phase (a resumed study finds it
    finished): its MLflow run id."""
    store, tags = Store.of(base), branch_study.base_tags(parent)
    run_id = store.find_run(tags)
    if not run_id or store.get_run(run_id).status != "FINISHED":
        print(f"branch study {sweep.name!r}: the base run first, then {branches} branches")
        _tuner(sweep, [base_trial], base, parent, folder, resume, None, tags=tags, phase="base", watch=watch).fit()
        run_id = store.find_run(tags)
    if not run_id or store.get_run(run_id).status != "FINISHED":
        raise RuntimeError(f"the base run of branch study {sweep.name!r} did not finish (MLflow run {run_id})")
    return run_id


def _from_checkpoints(sweep, base, run_id: str, branches) -> List[search_space.Trial]:
    """The branch trials, each with the base run's checkpoint at its branch point."""
    checkpoints = branch_study.checkpoints_of(base.tracking.uri, run_id, sweep.branch.at_tokens)
    unvalidated = search_space.base_of(sweep)
    trials = [
        search_space.resolve(
            sweep, {**t.values, "train.start_from_checkpoint": checkpoints[branch_study.branch_at(t.cfg)]}, unvalidated
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


def _mend_tune_state(phase_folder: str) -> None:
    """Tune's state files of a killed driver's sweep, cut short as it copied them, replaced by its
    staging copies (driver/tune_state.py), so that Tune resumes the trials instead of starting over."""
    from orchestrator.driver import tune_state

    local = storage.local_path(phase_folder)
    mended = tune_state.mend(local, tune_state.ray_temp_root()) if local else []
    if mended:
        print(f"resume: {', '.join(mended)} was cut short when the driver was killed; its whole copy restored")


def _tuner(sweep, trials, base, parent: str, folder: str, resume: bool, scheduler, tags=None, phase="tune", watch=None):
    """The Tune run of `trials` (a branch study's base is a phase of its own, `base`), stopped by
    `watch` (store_watch.StoreWatch) when the store refuses a trial's writes."""
    from ray import tune

    from orchestrator.driver.progress_table import ProgressTable

    setup = TrialSetup(
        sweep=sweep,
        base=search_space.base_of(sweep),
        parent_run_id=parent,
        train_storage=storage.join(folder, "train"),
        tune_storage=storage.join(folder, phase),
        cwd=os.getcwd(),
        tags=dict(tags or {}),
        batches=tuple(sorted({run_life.own_batch(t.cfg) for t in trials if t.cfg is not None})),
        fault_at_tokens=run_life.injected_fault_at(),
        device_memory=os.environ.get(micro_batch.DEVICE_MEMORY_ENV),
    )
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, setup=setup), lambda params: placement.trial_resources(sweep, params)
    )
    # A branch study resumed before a phase had started begins that phase afresh.
    if resume and (not sweep.branch or _can_restore(storage.join(folder, phase))):
        _mend_tune_state(storage.join(folder, phase))
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
            stop=watch,
            # Checkpoints of trials in local mode (multi-worker trials keep theirs with Ray Train).
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=trials[0].cfg.train.keep_checkpoints if trials else base.train.keep_checkpoints
            ),
            callbacks=[ProgressTable(sweep)],
            verbose=0,
        ),
    )
