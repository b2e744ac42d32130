"""One run's life, for the `train` verb (driver/launch.py) and a sweep's trial (driver/trial.py):
make its config ready (absolute paths, then the checks that need the data or the environment:
exit 2 before Ray starts and before any MLflow run exists), open its MLflow run, build the
TorchTrainer of its D DeepSpeed workers (handing them a workloads/train/handoff.WorkerPayload),
fit it, and finish: the status, the failure reason, the loss plot, the run closed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from orchestrator.core import ds_config, storage, workload_paths
from orchestrator.core.config import flatten, redact_uri, to_dict, to_yaml
from orchestrator.core.derived import (
    adamw_constants,
    batch_plan,
    rounded_budget,
    sgd_weight_decay,
    total_updates,
    worker_resources,
    zero_stage,
)
from orchestrator.core.errors import ConfigError
from orchestrator.core.phases import Phases
from orchestrator.core.schema import Config
from orchestrator.driver import plan as planning
from orchestrator.driver import ray_session
from orchestrator.studies import branch_study
from orchestrator.tracking.run_tags import FAILURE_TAG, ONLINE_CALIBRATION_METRIC, ONLINE_CALIBRATION_TAG
from orchestrator.tracking.store import CURVES_STORED, Store, resolve_uri
from workloads.text import corpus
from workloads.train import handoff
from workloads.train.handoff import FaultInjection, WorkerPayload


def ready(cfg: Config) -> None:
    """Resolve the config's paths and its calibration, then run the preflight checks on them."""
    resolve_paths(cfg)
    resolve_calibration(cfg)
    preflight(cfg)


def config_digest(cfg: Config) -> str:
    """What makes two `train` commands the same run: the resolved config but its run name and the
    extra sinks it is mirrored to (nor do they change the digest of a config from before them)."""
    settings = to_dict(cfg)
    settings["train"]["run_name"] = None
    del settings["tracking"]["sinks"]
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve_paths(cfg: Config) -> None:
    """Absolute paths for everything workers read or write (Ray workers have their own cwd)."""
    for src in cfg.data.sources:
        if src.path and "://" not in src.path:
            src.path = str(Path(src.path).expanduser().resolve())
    if cfg.data.shard_dir:
        cfg.data.shard_dir = str(Path(cfg.data.shard_dir).resolve())
    if cfg.data.tokenizer != "bytes":
        cfg.data.tokenizer = str(Path(cfg.data.tokenizer).expanduser().resolve())
    if cfg.model.init_from and "://" not in cfg.model.init_from:
        cfg.model.init_from = str(Path(cfg.model.init_from).expanduser().resolve())
    if cfg.train.start_from_checkpoint:  # a path or file:// (storage.checkpoint_folder)
        cfg.train.start_from_checkpoint = str(
            storage.local_path(cfg.train.start_from_checkpoint).expanduser().resolve()
        )
    cfg.train.storage_path = storage.resolve(cfg.train.storage_path)
    cfg.tracking.uri = resolve_uri(cfg.tracking.uri)
    # The token cache is shared by the driver's preflight and all workers (which inherit this).
    os.environ.setdefault("ORCHESTRATOR_CACHE_DIR", str(corpus.cache_root().resolve()))


def resolve_calibration(cfg: Config) -> None:
    """batch.calibration_from, read in the driver (workers have no business with the store's
    sweeps): the calibration the branch study's report recorded on its parent run (its branched
    critical batch size over B_simple with the suggested ramp's safety factor:
    branch_ramp.online_calibration), computed once where the study is analysed and read back here,
    becomes batch.calibration. A study that is not in the store, whose answer holds none, or whose
    calibration is not resolved (branch_ramp.OnlineCalibration: no adapting on it) is a ConfigError
    naming the key."""
    name = cfg.batch.calibration_from
    if name:
        cfg.batch.calibration = _calibration_of(cfg.tracking.uri, cfg.tracking.experiment, name)
        cfg.batch.calibration_from = None


@functools.lru_cache(maxsize=None)
def _calibration_of(uri: str, experiment: str, name: str) -> float:
    """The study's answer read from the store once in a process (a sweep's trials all name the
    same), and the ratio said once."""
    from orchestrator.analysis.branch_ramp import ONLINE_FACTOR, THRESHOLD  # its scipy: only when named

    store = Store(uri, experiment)
    run_id = store.find_sweep_run_anywhere(name)
    if run_id is None:
        raise ConfigError(
            "batch.calibration_from",
            f"no sweep named {name!r} in {redact_uri(uri)}; name a branch study run into the same store",
        )
    run = store.get_run(run_id)
    ratio, status = run.metrics.get(ONLINE_CALIBRATION_METRIC), run.tags.get(ONLINE_CALIBRATION_TAG, "")
    if ratio is None:
        raise ConfigError(
            "batch.calibration_from",
            f"sweep {name!r}'s answer holds no calibration: it has no resolved branch point with B_simple beside it, "
            f"or no report of it was written (`orchestrator report {name}` writes one); give batch.calibration instead",
        )
    if status != "resolved":  # an adaptive run does not adapt on a calibration it cannot trust
        raise ConfigError(
            "batch.calibration_from",
            f"sweep {name!r}'s calibration is {status or 'not resolved'}; run the study with more seeds "
            "(search.seeds) or branch points, give batch.calibration, or train with batch.schedule=fixed",
        )
    print(
        f"batch.calibration={ratio:.3g}: branch study {name!r}'s critical batch size over B_simple (median), "
        f"x {ONLINE_FACTOR:g} so the batch doubles where it passes {THRESHOLD:g}x the batch, as the suggested ramp does"
    )
    return ratio


def preflight(cfg: Config) -> None:
    """Checks that need the data or the environment; ConfigError (exit 2) before Ray starts."""
    if cfg.train.start_from_checkpoint:  # its form is validated; what it would unpickle is checked here, first
        from workloads.train import checkpoint

        checkpoint.check_files(storage.local_path(cfg.train.start_from_checkpoint), "train.start_from_checkpoint")
    from workloads import workload

    workload.preflight(cfg, batch_plan(cfg))  # the workload's own: its corpus, its init_from
    if cfg.cluster.use_gpu and not ray_session.on_cluster(cfg):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "cluster.use_gpu",
                "true, but this torch build sees no CUDA device; "
                "use cluster.use_gpu=false or install the CUDA build (README)",
            )


def run_params(cfg: Config) -> Dict[str, Any]:
    """MLflow params: the resolved config flattened (secrets redacted) but the keys only another
    built-in workload reads (workload.own_params), plus derived values. A branch (a run that starts
    from a checkpoint where its batch.ramp changes) logs as batch.tokens_per_update the batch it
    trains at, its own: the config's is the ramp's first, the base run's."""
    plan = batch_plan(cfg)
    from workloads import workload

    params = workload.own_params(cfg.model.name, flatten(to_dict(cfg)))
    params["batch.tokens_per_update"] = own_batch(cfg)
    params["batch.grad_accum_steps"] = plan.grad_accum_steps
    params["batch.micro_batch_size"] = plan.micro_batch_size
    params["train.total_steps"] = total_updates(cfg)
    params["train.total_tokens_rounded"] = rounded_budget(cfg)
    params["deepspeed.zero_stage_effective"] = zero_stage(cfg)  # with one worker it can be lower
    n = workload_paths.compute_params(cfg)
    if n:  # the N of a ladder's laws (docs/ladders.md)
        params["model.params"] = n
    # The beta2 and weight decay used, whichever form gave them (the given keys stay as given);
    # SGD has no beta2, and its weight decay is the coupled L2 it applies.
    if cfg.optim.name == "sgd":
        params["optim.weight_decay_effective"] = sgd_weight_decay(cfg)
    else:
        adamw = adamw_constants(cfg)
        params["optim.beta2_effective"], params["optim.weight_decay_effective"] = adamw.beta2, adamw.weight_decay
    return params


def own_batch(cfg: Config) -> int:
    """The tokens per update a run starts training at: a branch's (it starts from a checkpoint
    where its batch.ramp changes) is the batch it switched to; any other run's is
    batch.tokens_per_update (with a ramp, its first)."""
    at = branch_study.branch_point(cfg)
    if at is None:
        return cfg.batch.tokens_per_update
    return [s for s in cfg.batch.ramp if s.from_tokens <= at][-1].tokens_per_update


def open_run(store: Store, cfg: Config, name: str, tags: Optional[Dict[str, str]] = None) -> str:
    """Create the MLflow run of a training run with its params and set-up artifacts."""
    run_id = store.create_run(name, tags)
    store.log_params(run_id, run_params(cfg))
    store.log_text(run_id, to_yaml(cfg), "config.yaml")
    store.log_dict(run_id, ds_config.build(cfg, batch_plan(cfg), _num_params(cfg)), "deepspeed.json")
    store.log_text(run_id, planning.format_table(planning.describe(cfg)), "plan.txt")
    return run_id


def _num_params(cfg: Config) -> Optional[int]:
    from workloads import workload

    costs = workload.costs(cfg)
    return costs.params if costs else None


def worker_config(cfg: Config) -> Dict[str, Any]:
    """What travels to the workers: the resolved config, secrets included (never logged)."""
    return to_dict(cfg, redact=False)


def injected_fault_at() -> Optional[int]:
    """Tests: the tokens at which rank 0 fails once (ORCHESTRATOR_FAULT_AT_TOKENS), read by the
    command itself (`train`, or `sweep` for every trial): Ray workers and Tune trials inherit the
    environment of the Ray instance, which is not the command's when it joins a running Ray."""
    value = os.environ.get(handoff.FAULT_ENV)
    return int(value) if value else None


def build_trainer(
    cfg: Config,
    run_id: str,
    storage_path: str,
    name: str,
    callbacks: List[Any] = (),
    local_mode: bool = False,
    startup: Optional[Phases] = None,
    fault_at_tokens: Optional[int] = None,
):
    """The TorchTrainer of one run, to be fit() at once. `local_mode` (single-worker sweep trials
    only): Ray Train's local mode runs the one worker in this process, the Tune trial's, without
    a worker group (no controller, worker or helper actors to start: about 15 s less per trial
    here); reports and checkpoints then go to Ray Tune, and Tune's FailureConfig retries the
    trial. `startup`: the phases timed so far, which the workers carry on (startup/* metrics).
    `fault_at_tokens`: the test hook, as the command read it (`injected_fault_at`)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    startup = startup or Phases("startup")
    from workloads.train.train_loop import train_worker

    startup.mark("imports")  # torch, DeepSpeed: paid once per process

    plan = batch_plan(cfg)
    assert not local_mode or plan.num_workers == 1, "local mode runs exactly one worker"
    marker = storage.local_path(storage.join(storage_path, name, ".fault_injected"))
    payload = WorkerPayload(
        config=worker_config(cfg),
        run_id=run_id,
        fault=FaultInjection(
            at_tokens=fault_at_tokens,
            marker=str(marker) if marker else None,
        ),
        local_mode=local_mode,
        workloads=workload_paths.importable(),
        startup=startup.as_payload(),
    )
    return TorchTrainer(
        train_worker,
        train_loop_config=handoff.train_loop_config(payload),
        scaling_config=ScalingConfig(
            num_workers=0 if local_mode else plan.num_workers,
            use_gpu=cfg.cluster.use_gpu,
            resources_per_worker=worker_resources(cfg),
            placement_strategy=cfg.cluster.placement_strategy,
        ),
        torch_config=TorchConfig(backend="nccl" if cfg.cluster.use_gpu else "gloo"),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path,
            failure_config=FailureConfig(max_failures=cfg.train.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.train.keep_checkpoints),
            callbacks=list(callbacks),
        ),
    )


def fit(trainer) -> Tuple[Optional[Dict[str, Any]], Optional[BaseException]]:
    """Train: the final metrics and the error training ended with (None when it did not fail);
    an exception fit() raises (TrainingFailedError and friends) is the run failing, not the input."""
    try:
        result = trainer.fit()
    except Exception as exc:
        return None, exc
    return result.metrics, result.error


def finish(store: Store, cfg: Config, run_id: str, error: Optional[BaseException]) -> str:
    """Close the MLflow run: status, failure reason, loss plot. Returns the status."""
    status, reason = "FINISHED", None
    if error is not None:
        status, reason = "FAILED", failure_cause(error)
    else:  # a worker that saw a non-finite loss tagged the run and stopped
        reason = store.get_run(run_id).tags.get(FAILURE_TAG)
        status = "FAILED" if reason else status
    if reason:
        store.set_tags(run_id, {FAILURE_TAG: reason[:5000]})
    close_run(store, run_id, status, title=cfg.train.run_name or "")
    return reason or status


def failure_cause(error: BaseException) -> str:
    """'Type: message' of the exception where training failed: the first failing worker's own,
    not Ray's wrapper around it (whose text is a traceback)."""
    failures = getattr(error, "worker_failures", None)
    if failures:
        error = failures[min(failures)]
    error = getattr(error, "_base_exc", None) or getattr(error, "controller_failure", None) or error
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def close_run(store: Store, run_id: str, status: str, title: str = "") -> None:
    """The curves the analysis reads once more as one artifact (Store.write_curves: what a report
    of many runs reads instead of a history call per metric), the loss-versus-tokens plot, then the
    final status; the seconds this took go in as `teardown/finish_s`. `store`: the run's own
    (Store.of its config), so that its extra sinks see the end too."""
    from orchestrator.reporting import plots

    teardown = Phases("teardown")
    try:
        record = store.get_run(run_id)
        curves = store.histories([record], [k for k in CURVES_STORED if k in record.metrics])[run_id]
        if curves:
            store.write_curves(run_id, curves)
        curves = {k: curves.get(k, []) for k in ("train/loss", "eval/loss")}
        if curves["train/loss"]:
            store.log_figure(run_id, plots.loss_vs_tokens(curves, title=title), "loss_vs_tokens.png")
            teardown.mark("finish")
            store.log_metrics(run_id, teardown.seconds, curves["train/loss"][-1][0])
    finally:
        store.finish_run(run_id, status)
