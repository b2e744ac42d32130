"""What each Ray Train worker runs: build the DeepSpeed engine, accumulate, step, report,
checkpoint. `_train` reads top to bottom: set-up, the loop, and teardown that always runs (an
ExitStack owns the process group, MLflow logger, system-metrics sampler and warning capture);
`train_update` is one optimizer update; `MetricsWindow` turns the updates between two reports
into their metrics.

Token-weighted accumulation (DESIGN.md 4.2): before the first backward of an update we count
the real tokens of all its micro-batches on all workers (N). Each micro-batch's *summed* token
loss is scaled by D / N: DeepSpeed averages gradients over the D workers, so the update's
gradient is exactly the mean over every real token, however the batch is split. We call
`backward(scale_wrt_gas=False)` so DeepSpeed's own 1/A scaling does not apply on top.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import deepspeed
import ray.train
import torch
import torch.distributed as dist

from orchestrator import batching, ds_config, logs, noise, tracking
from orchestrator.config import Config, batch_plan, from_dict, gns_ema_tokens
from orchestrator.schedules import lr_at
from workloads import registry, worker_warnings
from workloads import workload as workloads
from workloads.checkpoint import TrainState, restore, save_and_report
from workloads.gns_probe import GradNormProbe
from workloads.metrics_window import MetricsWindow, due

FAULT_ENV = "ORCHESTRATOR_FAULT_AT_TOKENS"
log = logging.getLogger(__name__)


@dataclass
class Run:
    """What the training loop works with; built by `_set_up`, released by its ExitStack."""

    cfg: Config
    api: Any  # ray.train, or ray.tune in local mode (see `_ray`)
    rank: int
    world: int
    plan: Any
    steps: int
    budget: int
    work: Any
    engine: Any
    state: TrainState
    gns: noise.NoiseScaleEMA
    probe: Optional[GradNormProbe] = None
    logger: Optional[tracking.MetricLogger] = None  # rank 0 only, like everything sent to MLflow
    warnings: Optional[worker_warnings.WarningCollector] = None
    last_eval: float = float("nan")


def train_worker(payload: Dict[str, Any]) -> None:
    """Ray Train entry point. payload: resolved `config`, MLflow `run_id`, the driver's
    registered `workloads`, optional `fault`, `local_mode` (Ray Train's local mode inside a
    Tune trial)."""
    logs.setup()
    registry.register_all(payload.get("workloads", {}))
    _train(from_dict(payload["config"]), payload, _ray(payload))


def _train(cfg: Config, payload: Dict[str, Any], api) -> None:
    with contextlib.ExitStack() as resources:  # teardown runs however the run ends
        run = _set_up(cfg, payload, api, resources)
        window = MetricsWindow(run.state.tokens)
        for update in range(run.state.update, run.steps):
            _maybe_inject_fault(run.state.tokens, run.rank, payload.get("fault", {}), run.logger)
            before = run.state.tokens
            lr, stats = _update(run, update)
            if not math.isfinite(stats["loss"]):  # end the run; the driver marks it failed
                _report_divergence(run, stats)
                break
            _log_update(run, stats, lr)
            window.add(stats)
            _update_noise_scale(run, stats)

            last, tokens, every = run.state.update == run.steps, run.state.tokens, cfg.train
            evaluated = due(before, tokens, every.eval_every_tokens) or last
            if evaluated:
                with window.evaluating():
                    _evaluate(run)
            checkpoint = due(before, tokens, every.checkpoint_every_tokens) or last
            if evaluated or checkpoint or due(before, tokens, every.report_every_tokens):
                _report(run, window, lr, evaluated, checkpoint)
                window = MetricsWindow(tokens)


def _set_up(cfg: Config, payload: Dict[str, Any], api, resources: contextlib.ExitStack) -> Run:
    """Process group, tracking, workload, engine, restored state; resources go on `resources`."""
    if ensure_process_group(cfg):
        resources.callback(dist.destroy_process_group)
    rank, world = dist.get_rank(), dist.get_world_size()  # Ray Train's world rank and size
    collector = _capture_warnings(cfg, payload["run_id"], resources) if rank == 0 else None
    torch.set_num_threads(max(1, int(cfg.cluster.cpus_per_worker)))  # the CPUs Ray gave this worker
    plan = batch_plan(cfg)
    assert plan.num_workers == world, f"config says {plan.num_workers} workers, Ray Train started {world}"
    steps = batching.total_steps(plan, cfg.train.total_tokens)
    device = torch.device("cuda", torch.cuda.current_device()) if cfg.cluster.use_gpu else torch.device("cpu")

    work = workloads.build(cfg, plan, device)
    probe = _gns_probe(cfg, plan, work)
    if probe:
        resources.callback(probe.remove)
    engine = _engine(cfg, plan, work)
    state = restore(engine, TrainState(run_id=payload["run_id"]), api)
    gns = noise.NoiseScaleEMA(gns_ema_tokens(cfg))
    if state.gns:
        gns.load_state_dict(state.gns)
    run = Run(
        cfg,
        api,
        rank,
        world,
        plan,
        steps,
        plan.tokens_for_steps(steps),
        work,
        engine,
        state,
        gns,
        probe,
        warnings=collector,
    )
    if rank == 0:
        run.logger = _open_tracking(cfg, state, resources)
        _say_what_is_not_measured(cfg, plan, probe, state)
    if state.update == 0:  # the curve starts at the initial loss (ln 257 for bytes)
        _evaluate(run)
    return run


def _all_reduce(values: List[float]) -> List[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()


def _set_lr(engine, lr: float) -> None:
    for group in engine.optimizer.param_groups:
        group["lr"] = lr


def train_update(
    engine, work, plan, update: int, rank: int, probe: Optional[GradNormProbe], naive: bool = False
) -> Dict[str, float]:
    """One optimizer update: A micro-batches on this worker, then DeepSpeed's step."""
    batches = [work.micro_batch(update, rank, a) for a in range(plan.grad_accum_steps)]
    # The update's real-token count over all workers, known before the first backward.
    local_real = sum(mb.real_tokens for mb in batches)
    (global_real,) = _all_reduce([local_real])
    scale = plan.num_workers / max(global_real, 1.0)
    loss_scale = _loss_scale(engine)  # fp16: DeepSpeed scales the loss inside backward

    loss_sum, small_sq_sum, small_count, big_sq = 0.0, 0.0, 0, None
    for i, mb in enumerate(batches):
        if probe:
            probe.start()
        summed, count = work.summed_loss(engine, mb)
        if naive:  # per-micro-batch mean, DeepSpeed's 1/A: not invariant, kept for comparison
            engine.backward(summed / count.clamp(min=1))
        else:
            # With scale_wrt_gas=False DeepSpeed adds no 1/A of its own. (ZeRO 0/1 reduce
            # gradients once, at the accumulation boundary; ZeRO 2/3 reduce-scatter per micro-step.)
            engine.backward(summed * scale, scale_wrt_gas=False)
        if probe and mb.real_tokens:
            # Hook gradients are of (summed * scale * loss_scale): rescale to a per-token mean.
            small_sq_sum += noise.per_token_sq_norm(probe.squared_norm(), scale * loss_scale, mb.real_tokens)
            small_count += 1
        if i == len(batches) - 1 and engine.zero_optimization_stage() == 0:
            # ZeRO 0 with a torch optimizer keeps no global norm, but after the boundary
            # backward every rank's p.grad holds the all-reduced update gradient.
            # Summed on the device: one host sync, not one per parameter.
            grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
            big_sq = float(sum(g.double().square().sum() for g in grads))
            big_sq /= loss_scale**2
        engine.step()
        loss_sum += float(summed.detach())

    grad_norm = engine.get_global_grad_norm()
    if grad_norm is None and big_sq is not None:
        grad_norm = math.sqrt(big_sq)
    grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
    sources = list(work.source_names)
    local_source_tokens = [sum(mb.source_tokens.get(k, 0) for mb in batches) for k in sources]
    totals = _all_reduce([loss_sum, small_sq_sum, small_count, *local_source_tokens])
    total_loss, total_small_sq, total_small, *source_tokens = totals
    return {
        "loss_sum": total_loss,
        "real_tokens": global_real,
        "loss": total_loss / max(global_real, 1.0),
        "grad_norm": grad_norm,
        "small_sq_mean": total_small_sq / max(total_small, 1.0),
        "local_slots": sum(mb.slots for mb in batches),
        "source_tokens": dict(zip(sources, source_tokens)),  # all workers
    }


def _loss_scale(engine) -> float:
    """The factor DeepSpeed multiplies the loss by inside backward: fp16's current (dynamic) loss
    scale, 1 otherwise. Gradient hooks see gradients of the scaled loss."""
    if not engine.fp16_enabled():
        return 1.0
    return float(getattr(engine.optimizer, "loss_scale", None) or 1.0)


@torch.no_grad()
def evaluate(engine, work, rank: int, world: int) -> float:
    engine.eval()
    loss_sum, count = 0.0, 0.0
    for mb in work.eval_batches(rank, world):
        summed, n = work.summed_loss(engine, mb)
        loss_sum, count = loss_sum + float(summed), count + float(n)
    engine.train()
    loss_sum, count = _all_reduce([loss_sum, count])
    return loss_sum / max(count, 1.0)


def _maybe_inject_fault(tokens: int, rank: int, fault: Dict[str, Any], logger) -> None:
    """Tests: rank 0 raises once (first attempt only) when it passes N tokens, after sending
    what it logged, so MLflow holds steps past the last checkpoint (the case to get right).
    `fault` = {"at_tokens": N from the driver's ORCHESTRATOR_FAULT_AT_TOKENS, "marker": path}."""
    at, marker = fault.get("at_tokens"), fault.get("marker")
    if rank != 0 or not at or not marker or tokens < int(at) or Path(marker).exists():
        return
    Path(marker).parent.mkdir(parents=True, exist_ok=True)
    Path(marker).touch()
    if logger:
        logger.flush()
    raise RuntimeError(f"injected fault at {tokens:,} tokens ({FAULT_ENV}={at})")


def _engine(cfg: Config, plan, work):
    optimizer = torch.optim.AdamW(
        work.param_groups(),
        lr=cfg.optim.lr,
        betas=(cfg.optim.beta1, cfg.optim.beta2),
        eps=cfg.optim.eps,
        fused=cfg.cluster.use_gpu or None,
    )
    engine, _, _, _ = deepspeed.initialize(model=work.model, optimizer=optimizer, config=ds_config.build(cfg, plan))
    return engine


def _ray(payload: Dict[str, Any]):
    """Where reports and checkpoints go. Normally Ray Train's worker group. A single-worker sweep
    trial runs in Ray Train's local mode, inside its Tune trial: there Train keeps nothing, so
    reports and checkpoints go straight to Ray Tune, which persists them and restores the latest
    when it retries the trial."""
    if payload.get("local_mode"):
        from ray import tune

        return tune
    return ray.train


def ensure_process_group(cfg: Config) -> bool:
    """DeepSpeed needs torch.distributed. Ray Train sets it up for a worker group; in local mode
    there is none, so make one of size 1 (an in-memory store: no port to find), with the
    variables a launcher would set, which DeepSpeed reads. True if it made one."""
    if dist.is_initialized():
        return False
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    dist.init_process_group("nccl" if cfg.cluster.use_gpu else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    return True


def _gns_probe(cfg: Config, plan, work) -> Optional[GradNormProbe]:
    """The per-micro-batch gradient norm hook, when B_simple can be measured: it needs more than
    one micro-batch per update, and its rescaling assumes token-weighted losses."""
    measurable = plan.micro_batches_per_update > 1 and cfg.train.loss_normalization == "token"
    return GradNormProbe(work.model) if cfg.gns.enabled and measurable else None


def _capture_warnings(cfg: Config, run_id: str, resources: contextlib.ExitStack) -> worker_warnings.WarningCollector:
    """Warnings of this worker go to the run's MLflow tags, where the driver reads them."""
    uri = tracking.resolve_uri(cfg.tracking.uri)
    collector = worker_warnings.WarningCollector(
        lambda messages: tracking.log_warnings(uri, run_id, messages),
        already=tracking.run_warnings(uri, run_id).values(),
    )
    resources.callback(worker_warnings.install(collector))
    return collector


def _open_tracking(cfg: Config, state: TrainState, resources: contextlib.ExitStack) -> tracking.MetricLogger:
    """Rank 0's MLflow logger (and system-metrics sampler), closed when the run ends."""
    uri = tracking.resolve_uri(cfg.tracking.uri)
    # Resume watermark: what MLflow already holds wins over what the checkpoint remembers.
    held = tracking.last_steps(uri, state.run_id)
    logger = tracking.MetricLogger(
        uri,
        state.run_id,
        cfg.tracking.flush_every_s,
        cfg.tracking.max_buffered_points,
        watermarks={**state.mlflow_watermarks, **held},
    )
    logger.restore_pending(state.mlflow_pending, held)
    resources.push(_closing(logger))
    system = cfg.tracking.system_metrics if cfg.tracking.system_metrics is not None else cfg.cluster.use_gpu
    if system:
        monitor = tracking.start_system_metrics(uri, state.run_id, cfg.tracking.system_metrics_interval_s)
        resources.callback(monitor.finish)
    return logger


def _closing(logger: tracking.MetricLogger):
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
        why = (
            "D x A = 1, so there is no small batch to compare with"
            if plan.micro_batches_per_update == 1
            else "train.loss_normalization is not 'token'"
        )
        log.warning("gns: %s; B_simple is not measured", why)
    if state.update:
        log.info("resuming at update %d (%d tokens) from the latest checkpoint", state.update, state.tokens)


def _update(run: Run, update: int):
    """One optimizer update at the scheduled learning rate; returns (lr, train_update's stats)."""
    before, cfg = run.state.tokens, run.cfg
    lr = lr_at(
        before + run.plan.tokens_per_update,
        peak=cfg.optim.lr,
        total_tokens=run.budget,
        warmup_tokens=cfg.schedule.warmup_tokens,
        decay=cfg.schedule.decay,
        min_lr_ratio=cfg.schedule.min_lr_ratio,
        wsd_decay_share=cfg.schedule.wsd_decay_share,
    )
    _set_lr(run.engine, lr)
    naive = cfg.train.loss_normalization == "micro_batch"
    stats = train_update(run.engine, run.work, run.plan, update, run.rank, run.probe, naive)
    run.state.update, run.state.tokens = update + 1, before + run.plan.tokens_per_update
    return lr, stats


def _report_divergence(run: Run, stats: Dict[str, float]) -> None:
    if run.logger:
        reason = f"non-finite loss at {run.state.tokens:,} tokens"
        tracking.set_tags(run.logger.uri, run.state.run_id, {tracking.FAILURE_TAG: reason})
    run.api.report({"tokens": run.state.tokens, "diverged": 1.0, "loss": stats["loss"]})


def _log_update(run: Run, stats: Dict[str, float], lr: float) -> None:
    if run.logger:  # the loss of this update, at the tokens seen after it (DESIGN.md 3)
        run.logger.log(
            {"train/loss": stats["loss"], "train/lr": lr, "train/grad_norm": stats["grad_norm"]}, run.state.tokens
        )


def _update_noise_scale(run: Run, stats: Dict[str, float]) -> None:
    if not run.probe:
        return
    b_big, b_small = stats["real_tokens"], stats["real_tokens"] / run.plan.micro_batches_per_update
    if math.isfinite(stats["grad_norm"]) and b_big > b_small:
        run.gns.update(
            *noise.estimate(stats["small_sq_mean"], b_small, stats["grad_norm"] ** 2, b_big),
            tokens=run.plan.tokens_per_update,
        )


def _evaluate(run: Run) -> None:
    run.last_eval = evaluate(run.engine, run.work, run.rank, run.world)
    if run.logger:
        run.logger.log({"eval/loss": run.last_eval}, run.state.tokens)


def _report(run: Run, window: MetricsWindow, lr: float, evaluated: bool, checkpoint: bool) -> None:
    """The window's metrics to MLflow; to Ray (with a checkpoint when one is due)."""
    state, gns = run.state, run.gns if run.probe else None
    metrics = window.metrics(state.update, state.tokens, run.world, run.work.flops_per_token, _peak_flops(run.cfg), gns)
    if run.logger:
        run.logger.log(metrics, state.tokens)
    if run.warnings:
        run.warnings.flush()
    ray_metrics = {
        "tokens": state.tokens,
        "loss": window.mean_loss(),
        "eval_loss": run.last_eval,
        "lr": lr,
        "step": state.update,
        "b_simple": metrics.get("gns/b_simple", float("nan")),
    }
    state.gns = run.gns.state_dict()
    # A Ray Train report is a barrier across workers (about a second here), so Ray hears
    # only at evaluations and checkpoints: that is where Tune's schedulers decide.
    if checkpoint:
        save_and_report(run.engine, state, ray_metrics, run.logger, run.api)
    elif evaluated:
        if run.logger:  # a scheduler may stop this trial on this report: what it decided on is in MLflow
            run.logger.flush(timeout_s=10)
        run.api.report(ray_metrics)


def _peak_flops(cfg: Config) -> Optional[float]:
    """The named peak MFU is measured against (H100/H200 bf16 dense: 989 TFLOP/s per GPU);
    None on CPU, where a shared machine has no meaningful peak."""
    if not cfg.cluster.use_gpu:
        return None
    return float(os.environ.get("ORCHESTRATOR_PEAK_FLOPS", 989e12)) * cfg.cluster.num_workers
