"""What each Ray Train worker runs: build the DeepSpeed engine, accumulate, step, report,
checkpoint. `_train` reads top to bottom: set-up, the loop, and teardown that always runs (an
ExitStack owns the process group, MLflow logger, system-metrics sampler and warning capture);
`train_update` (engine.py, with the engine, the process group and token-weighted accumulation)
is one optimizer update; `MetricsWindow` turns the updates between two reports into their metrics.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional

import ray.train
import torch
import torch.distributed as dist

from orchestrator.core import logs, workload_paths
from orchestrator.core.config import from_dict
from orchestrator.core.derived import (
    adamw_constants,
    adaptive_rule,
    batch_segments,
    gns_ema_tokens,
    measures_adam_noise_scale,
    scheduled_lr,
)
from orchestrator.core.phases import Phases
from orchestrator.core.schema import AUTO, Config
from orchestrator.formulas import adaptive_batch, batching, cost, noise
from orchestrator.formulas.schedules import stable_end_tokens
from orchestrator.tracking import metric_logger
from orchestrator.tracking.run_tags import FAILURE_TAG, REALISED_RAMP_TAG
from orchestrator.tracking.store import Store
from orchestrator.tracking.system_metrics import start_system_metrics
from workloads import workload as workloads
from workloads.train import worker_warnings
from workloads.train.adam_precondition import AdamPreconditioner
from workloads.train.checkpoint import TrainState, restore, save_and_report
from workloads.train.engine import (
    build_engine,
    ensure_process_group,
    evaluate,
    release_process_group,
    set_adamw_constants,
    set_lr,
    set_plan,
    train_update,
)
from workloads.train.gns_probe import GradNormProbe
from workloads.train.handoff import FAULT_ENV, FaultInjection, RayApi, WorkerPayload, payload_of
from workloads.train.metrics_window import MetricsWindow, UpdateStats, due, noise_scale_metrics

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Run:
    """What the training loop works with; built by `_set_up`, released by its ExitStack."""

    cfg: Config
    api: RayApi  # ray.train, or ray.tune in local mode (see `_ray`)
    store: Store  # the run's tracker (MLflow and the config's extra sinks): rank 0 writes through it
    rank: int
    world: int
    segments: List[batching.Segment]  # the batch sizes along the budget (batch.ramp; one without)
    plan: batching.BatchPlan  # the current segment's split
    steps: int  # updates this run trains to (a branch stops at train.stop_at_tokens)
    stable_end: int  # tokens where the part of the schedule that cannot fake progress ends
    work: Any  # the workload (workloads/workload.py's protocol)
    engine: Any  # the DeepSpeed engine
    state: TrainState
    gns: noise.NoiseScaleEMA
    gns_adam: Optional[noise.NoiseScaleEMA] = None  # of the gradient as AdamW preconditions it
    probe: Optional[GradNormProbe] = None
    logger: Optional[metric_logger.MetricLogger] = None  # rank 0 only, like everything sent to MLflow
    warnings: Optional[worker_warnings.WarningCollector] = None
    rule: Optional[adaptive_batch.AdaptiveRule] = None  # batch.schedule=adaptive
    decided: Optional[adaptive_batch.AdaptiveState] = None  # ... its ramp so far (checkpointed)
    budget: int = 0  # the schedule's tokens, the same for every ramp an adaptive run may take
    last_eval: float = float("nan")
    updated_at: float = 0.0  # wall clock at the end of the latest update: where teardown starts


def train_worker(config: Mapping[str, WorkerPayload]) -> None:
    """Ray Train entry point: its config holds the driver's payload (workloads/train/handoff.py)."""
    payload = payload_of(config)
    startup = Phases.from_payload(payload.startup)
    startup.mark("ray_train")  # from fit() to here: Ray Train's controller and worker group
    logs.setup()
    workload_paths.register_all(dict(payload.workloads))
    _train(from_dict(payload.config), payload, _ray(payload), startup)


def _train(cfg: Config, payload: WorkerPayload, api: RayApi, startup: Optional[Phases] = None) -> None:
    with contextlib.ExitStack() as resources:  # teardown runs however the run ends
        run = _set_up(cfg, payload, api, resources, startup or Phases("startup"))
        window = MetricsWindow(run.state.tokens)
        while run.state.update < run.steps:  # an adaptive run's steps change with its batch
            update = run.state.update
            _maybe_inject_fault(run.state.tokens, run.rank, payload.fault, run.logger)
            before = run.state.tokens
            lr, stats = _update(run, update)
            run.updated_at = time.time()
            if not math.isfinite(stats.loss):  # end the run; the driver marks it failed
                _report_divergence(run, stats)
                break
            _log_update(run, stats, lr, before)
            window.add(stats)
            _update_noise_scale(run, stats, before)
            _adapt(run)

            last, tokens, every = run.state.update == run.steps, run.state.tokens, cfg.train
            evaluated = due(before, tokens, every.eval_every_tokens) or last
            # The first update to reach the end of the stable phase is evaluated too: an extra
            # eval/loss point, kept as `stable_loss` for the searcher; it is not a Ray report.
            stable = before < run.stable_end <= tokens
            if evaluated or stable:
                with window.evaluating():
                    _evaluate(run)
            if stable:
                run.state.stable_loss = run.last_eval
            checkpoint = due(before, tokens, every.checkpoint_every_tokens) or last
            checkpoint = checkpoint or any(before < t <= tokens for t in every.checkpoint_at_tokens)
            if evaluated or checkpoint or due(before, tokens, every.report_every_tokens):
                _report(run, window, lr, evaluated, checkpoint)
                window = MetricsWindow(tokens)
        _log_teardown(run)


def _set_up(cfg: Config, payload: WorkerPayload, api: RayApi, resources: contextlib.ExitStack, startup: Phases) -> Run:
    """Process group, tracking, workload, engine, restored state; resources go on `resources`.
    Each phase's seconds go on `startup`, logged once the first evaluation is done."""
    if ensure_process_group(cfg):
        resources.callback(release_process_group)
    startup.mark("process_group")
    rank, world = dist.get_rank(), dist.get_world_size()  # Ray Train's world rank and size
    store = Store.of(cfg)
    collector = _capture_warnings(store, payload.run_id, resources) if rank == 0 else None
    torch.set_num_threads(max(1, int(cfg.cluster.cpus_per_worker)))  # the CPUs Ray gave this worker
    assert cfg.batch.micro_batch_size != AUTO, "the driver resolves batch.micro_batch_size: auto before launching"
    assert cfg.batch.calibration_from is None, "the driver reads batch.calibration_from before launching"
    segments = batch_segments(cfg)
    plan = segments[0].plan
    assert plan.num_workers == world, f"config says {plan.num_workers} workers, Ray Train started {world}"
    budget = segments[-1].end_tokens  # the schedule's, also for a branch that stops before it
    steps = batching.updates_until(segments, cfg.train.stop_at_tokens or budget)
    s = cfg.schedule
    stable_end = stable_end_tokens(budget, s.warmup_tokens, s.decay, s.wsd_decay_share)
    device = torch.device("cuda", torch.cuda.current_device()) if cfg.cluster.use_gpu else torch.device("cpu")

    work = workloads.build(cfg, plan, device)
    probe = _gns_probe(cfg, segments, work)
    if probe:
        resources.callback(probe.remove)
    startup.mark("workload")
    engine = build_engine(cfg, plan, work)
    startup.mark("engine")
    state = restore(engine, TrainState(run_id=payload.run_id), api, cfg.train.start_from_checkpoint)
    startup.mark("restore")
    rule = adaptive_rule(cfg)
    decided = None
    if rule:  # the decisions so far hold to the end: the same segments as when they were taken
        decided = adaptive_batch.AdaptiveState.from_json(state.adaptive) if state.adaptive else None
        decided = decided or adaptive_batch.AdaptiveState([(0, segments[0].plan.tokens_per_update)])
        segments = batch_segments(cfg, decided.ramp)
        steps = batching.updates_until(segments, cfg.train.stop_at_tokens or budget)
    plan = batching.segment_at(segments, state.tokens).plan  # a resume within a later segment
    set_plan(engine, plan)
    gns = noise.NoiseScaleEMA(gns_ema_tokens(cfg))
    if state.gns:
        gns.load_state_dict(state.gns)
    gns_adam = None
    if probe and measures_adam_noise_scale(cfg):  # not SGD: it has no second moment to precondition by
        probe.adam = AdamPreconditioner(engine, probe.params)
        gns_adam = noise.NoiseScaleEMA(gns_ema_tokens(cfg))
        if state.gns_adam:
            gns_adam.load_state_dict(state.gns_adam)
    run = Run(
        cfg=cfg,
        api=api,
        store=store,
        rank=rank,
        world=world,
        segments=segments,
        plan=plan,
        steps=steps,
        stable_end=stable_end,
        work=work,
        engine=engine,
        state=state,
        gns=gns,
        gns_adam=gns_adam,
        probe=probe,
        warnings=collector,
        rule=rule,
        decided=decided,
        budget=budget,
    )
    if rank == 0:
        run.logger = _open_tracking(cfg, store, state, resources)
        _say_what_is_not_measured(cfg, plan, probe, state)
    startup.mark("tracking")
    if state.update == 0:  # the curve starts at the initial loss (ln 257 for bytes)
        _evaluate(run)
        if stable_end <= 0:  # no stable phase at all (wsd decaying over the whole run)
            state.stable_loss = run.last_eval
        startup.mark("first_eval")
    if run.logger:
        run.logger.log({**startup.seconds, "startup/total_s": startup.total()}, state.tokens)
    run.updated_at = time.time()
    return run


def _log_teardown(run: Run) -> None:
    """Seconds from the last update to the end of the loop (its evaluation, checkpoint and
    report). What follows (closing the logger, Ray Train's exit) ends at the run's end time in
    MLflow; the launcher's own part is `teardown/finish_s`."""
    if run.logger:
        teardown = Phases("teardown", since=run.updated_at)
        teardown.mark("final_report")
        run.logger.log(teardown.seconds, run.state.tokens)


def _maybe_inject_fault(tokens: int, rank: int, fault: FaultInjection, logger) -> None:
    """Tests: rank 0 raises once (first attempt only) when it passes N tokens, after sending
    what it logged, so MLflow holds steps past the last checkpoint (the case to get right)."""
    at, marker = fault.at_tokens, fault.marker
    if rank != 0 or not at or not marker or tokens < at or Path(marker).exists():
        return
    Path(marker).parent.mkdir(parents=True, exist_ok=True)
    Path(marker).touch()
    if logger:
        logger.flush()
    raise RuntimeError(f"injected fault at {tokens:,} tokens ({FAULT_ENV}={at})")


def _ray(payload: WorkerPayload) -> RayApi:
    """Where reports and checkpoints go. Normally Ray Train's worker group. A single-worker sweep
    trial runs in Ray Train's local mode, inside its Tune trial: there Train keeps nothing, so
    reports and checkpoints go straight to Ray Tune, which persists them and restores the latest
    when it retries the trial."""
    if payload.local_mode:
        from ray import tune

        return tune
    return ray.train


def _gns_probe(cfg: Config, segments, work) -> Optional[GradNormProbe]:
    """The per-micro-batch gradient norm hook, when B_simple can be measured: it needs more than
    one micro-batch per update (in some segment), and its rescaling assumes token-weighted losses."""
    split = any(s.plan.micro_batches_per_update > 1 for s in segments)
    measurable = split and cfg.train.loss_normalization == "token"
    return GradNormProbe(work.model) if cfg.gns.enabled and measurable else None


def _capture_warnings(store: Store, run_id: str, resources: contextlib.ExitStack) -> worker_warnings.WarningCollector:
    """Warnings of this worker go to the run's MLflow tags, where the driver reads them."""
    collector = worker_warnings.WarningCollector(
        lambda messages: store.log_warnings(run_id, messages),
        already=store.run_warnings(run_id).values(),
    )
    resources.callback(worker_warnings.install(collector))
    return collector


def _open_tracking(
    cfg: Config, store: Store, state: TrainState, resources: contextlib.ExitStack
) -> metric_logger.MetricLogger:
    """Rank 0's MLflow logger (and system-metrics sampler), closed when the run ends."""
    # Resume watermark: what MLflow already holds wins over what the checkpoint remembers.
    held = store.last_steps(state.run_id)
    logger = metric_logger.MetricLogger(
        store.uri,
        state.run_id,
        cfg.tracking.flush_every_s,
        cfg.tracking.max_buffered_points,
        watermarks={**state.mlflow_watermarks, **held},
        sinks=store.sinks,
    )
    logger.restore_pending(state.mlflow_pending, held)
    resources.push(_closing(logger))
    system = cfg.tracking.system_metrics if cfg.tracking.system_metrics is not None else cfg.cluster.use_gpu
    if system:
        monitor = start_system_metrics(logger, cfg.tracking.system_metrics_interval_s)
        resources.callback(monitor.finish)
    return logger


def _closing(logger: metric_logger.MetricLogger):
    """ExitStack exit callback: a run that ends well waits for every point (and fails if they
    stay unsent); a failing run sends what it can quickly, so its own error is the one reported."""

    def close(exc_type, exc, tb) -> bool:
        if exc_type is None:
            logger.close()
            return False
        try:
            logger.close(timeout_s=10)
        except Exception as error:
            log.warning("MLflow logger not closed cleanly after the run failed: %s", error)
        return False

    return close


def _say_what_is_not_measured(cfg: Config, plan, probe: Optional[GradNormProbe], state: TrainState) -> None:
    if cfg.gns.enabled and probe is None:
        if cfg.train.loss_normalization != "token":
            why = "train.loss_normalization is not 'token'"
        elif cfg.batch.grad_accum_steps is not None:  # derived.batch_plan splits the update only when A is derived
            why = (
                f"batch.grad_accum_steps={cfg.batch.grad_accum_steps} is given and D x A = 1, so there is no "
                "small batch to compare with (omit it and the update is split in two)"
            )
        else:
            why = "D x A = 1 (one sequence per update), so there is no small batch to compare with"
        log.warning("gns: %s; B_simple is not measured", why)
    if state.update:
        log.info("resuming at update %d (%d tokens) from the latest checkpoint", state.update, state.tokens)


def _update(run: Run, update: int):
    """One optimizer update at the scheduled learning rate, split as the segment it is in;
    returns (lr, train_update's stats)."""
    before, cfg = run.state.tokens, run.cfg
    segment = batching.segment_at(run.segments, before)
    if segment.plan != run.plan:  # a batch.ramp step: DeepSpeed accumulates the new A from here
        run.plan = segment.plan
        set_plan(run.engine, run.plan)
    lr = scheduled_lr(cfg, before + run.plan.tokens_per_update, run.segments)
    set_lr(run.engine, lr)
    if cfg.optim.name == "adamw":  # beta2 and weight decay given in tokens hold in tokens along a ramp
        set_adamw_constants(run.engine, adamw_constants(cfg, segment.plan.tokens_per_update, segment.lr_factor))
    naive = cfg.train.loss_normalization == "micro_batch"
    # Every sequence has S tokens, so the stream position is the tokens seen over S.
    first = before // run.plan.seq_len
    stats = train_update(run.engine, run.work, run.plan, first, run.rank, run.probe, naive)
    run.state.update, run.state.tokens = update + 1, before + run.plan.tokens_per_update
    return lr, stats


def _report_divergence(run: Run, stats: UpdateStats) -> None:
    if run.logger:
        reason = f"non-finite loss at {run.state.tokens:,} tokens"
        run.store.set_tags(run.state.run_id, {FAILURE_TAG: reason})
    run.api.report(
        {"tokens": run.state.tokens, "diverged": 1.0, "loss": stats.loss, "stable_loss": run.state.stable_loss}
    )


def _log_update(run: Run, stats: UpdateStats, lr: float, before: int) -> None:
    """The update's loss and gradient norm at the tokens the weights that produced them had
    seen: `before` the update, so the first point is the initial weights' at 0 (docs/design.md 3).
    The learning rate and clipping that update applied go beside them."""
    if run.logger:
        per_update = {
            "train/loss": stats.loss,
            "train/grad_norm": stats.grad_norm,
            "train/clipped": stats.clipped,
            "train/lr": lr,
            "train/tokens_per_update": run.plan.tokens_per_update,
            "train/optimizer_step": run.state.update - 1,  # the updates the weights at `before` had taken
        }
        run.logger.log(per_update, before)


def _update_noise_scale(run: Run, stats: UpdateStats, before: int) -> None:
    if not run.probe or run.plan.micro_batches_per_update < 2:
        return
    b_big, b_small = stats.real_tokens, stats.real_tokens / run.plan.micro_batches_per_update
    if math.isfinite(stats.grad_norm) and b_big > b_small:
        run.gns.update(
            *noise.estimate(stats.small_sq_mean, b_small, stats.grad_norm**2, b_big),
            tokens=run.plan.tokens_per_update,
            at=before,  # the gradients were taken at the weights before the update
        )
        if run.gns_adam:  # NaN before AdamW's first step: the EMA skips it
            run.gns_adam.update(
                *noise.estimate(stats.small_sq_mean_adam, b_small, stats.big_sq_adam, b_big),
                tokens=run.plan.tokens_per_update,
                at=before,
            )


def _adapt(run: Run) -> None:
    """batch.schedule=adaptive, after every update: double the batch from the next update on when
    the rule says so (every rank decides alike: the noise scale's inputs are all-reduced). The
    decided ramp becomes the run's segments (b and A per batch, the lr factor of
    batch.ramp_lr_scaling), and its `batch.ramp` goes on the MLflow run as a tag to replay."""
    if run.rule is None:
        return
    b_simple = run.gns.b_simple if run.probe else None
    if adaptive_batch.decide(run.rule, run.decided, run.state.tokens, run.plan.tokens_per_update, b_simple) is None:
        return
    run.segments = batch_segments(run.cfg, run.decided.ramp)
    run.steps = batching.updates_until(run.segments, run.cfg.train.stop_at_tokens or run.budget)
    override = batching.ramp_override(run.decided.ramp)
    log.info("batch.schedule=adaptive: %s tokens per update from %s tokens on", *run.decided.ramp[-1][::-1])
    if run.logger:
        run.store.set_tags(run.state.run_id, {REALISED_RAMP_TAG: override})


def _evaluate(run: Run) -> None:
    run.last_eval, se = evaluate(run.engine, run.work, run.rank, run.world)
    if run.logger:
        run.logger.log({"eval/loss": run.last_eval, "eval/loss_se": se}, run.state.tokens)


def _report(run: Run, window: MetricsWindow, lr: float, evaluated: bool, checkpoint: bool) -> None:
    """The window's metrics to MLflow; to Ray (with a checkpoint when one is due)."""
    state = run.state
    metrics = window.metrics(state.tokens, run.world, run.work.flops_per_token, _peak_flops(run.cfg))
    noise_step, noise_metrics = noise_scale_metrics(run.gns if run.probe else None)
    adam_step, adam_metrics = noise_scale_metrics(run.gns_adam, suffix="_adam")
    if run.logger:
        run.logger.log(metrics, state.tokens)
        run.logger.log(noise_metrics, noise_step)  # at the EMA's centre of mass, behind state.tokens
        run.logger.log(adam_metrics, adam_step)  # its own centre: it starts an update later
    if run.warnings:
        run.warnings.flush()
    ray_metrics = {
        "tokens": state.tokens,
        "loss": window.mean_loss(),
        "eval_loss": run.last_eval,
        "lr": lr,
        "step": state.update,
        "b_simple": noise_metrics.get("gns/b_simple", float("nan")),
        "stable_loss": state.stable_loss,  # NaN until the run reaches the end of its stable phase
    }
    state.gns = run.gns.state_dict()
    state.adaptive = run.decided.to_json() if run.decided else {}
    state.gns_adam = run.gns_adam.state_dict() if run.gns_adam else {}
    # A Ray Train report is a barrier across workers (about a second here), so Ray hears
    # only at evaluations and checkpoints: that is where Tune's schedulers decide.
    if checkpoint:
        save_and_report(run.engine, state, ray_metrics, run.logger, run.api)
    elif evaluated:
        if run.logger:  # a scheduler may stop this trial on this report: what it decided on is in MLflow
            run.logger.flush(metric_logger.REPORT_FLUSH_S)
        run.api.report(ray_metrics)


def _peak_flops(cfg: Config) -> Optional[float]:
    """The named peak MFU is measured against (H100/H200 bf16 dense: 989 TFLOP/s per GPU);
    None on CPU, where a shared machine has no meaningful peak."""
    if not cfg.cluster.use_gpu:
        return None
    return float(os.environ.get("ORCHESTRATOR_PEAK_FLOPS", cost.GPU_PEAK_FLOPS)) * cfg.cluster.num_workers
