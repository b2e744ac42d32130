"""What each Ray Train worker runs: build the DeepSpeed engine, accumulate, step, report,
checkpoint. `train_worker` reads top to bottom; `train_update` is one optimizer update.

Token-weighted accumulation (DESIGN.md 4.2): before the first backward of an update we count
the real tokens of all its micro-batches on all workers (N). Each micro-batch's *summed* token
loss is scaled by D / N: DeepSpeed averages gradients over the D workers, so the update's
gradient is exactly the mean over every real token, however the batch is split. We call
`backward(scale_wrt_gas=False)` so DeepSpeed's own 1/A scaling does not apply on top.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import deepspeed
import ray.train
import torch
import torch.distributed as dist

from orchestrator import batching, ds_config, noise, tracking
from orchestrator.config import Config, batch_plan, from_dict, gns_ema_tokens
from orchestrator.schedules import lr_at
from workloads import workload as workloads
from workloads.gns_probe import GradNormProbe

CHECKPOINT_TAG = "state"
FAULT_ENV = "ORCHESTRATOR_FAULT_AT_TOKENS"


@dataclass
class TrainState:
    """Everything besides model and optimizer that a resumed run needs (checkpoint client state)."""

    update: int = 0
    tokens: int = 0
    run_id: str = ""
    gns: Dict[str, Any] = field(default_factory=dict)
    mlflow_watermarks: Dict[str, int] = field(default_factory=dict)
    mlflow_pending: List[Any] = field(default_factory=list)
    torch_rng: Optional[Any] = None


@dataclass
class Window:
    """Accumulators between two reports."""

    loss_sum: float = 0.0
    real_tokens: int = 0
    slots: int = 0
    source_tokens: Dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    tokens_at_start: int = 0
    eval_s: float = 0.0
    """Time spent evaluating inside the window: not training, so not in tokens/s."""


def _all_reduce(values: List[float]) -> List[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()


def _set_lr(engine, lr: float) -> None:
    for group in engine.optimizer.param_groups:
        group["lr"] = lr


def train_update(engine, work, plan, update: int, rank: int, probe: Optional[GradNormProbe],
                 naive: bool = False) -> Dict[str, float]:
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
            big_sq = float(sum(p.grad.double().square().sum() for p in engine.module.parameters() if p.grad is not None))
            big_sq /= loss_scale**2
        engine.step()
        loss_sum += float(summed.detach())

    grad_norm = engine.get_global_grad_norm()
    if grad_norm is None and big_sq is not None:
        grad_norm = math.sqrt(big_sq)
    grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
    sources = list(work.source_names)
    local_source_tokens = [sum(mb.source_tokens.get(k, 0) for mb in batches) for k in sources]
    total_loss, total_small_sq, total_small, *source_tokens = _all_reduce([loss_sum, small_sq_sum, small_count, *local_source_tokens])
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


def _due(before: int, after: int, every: int) -> bool:
    """Did the tokens pass a multiple of `every` during this update?"""
    return every > 0 and after // every > before // every


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
        work.param_groups(), lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps,
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


def _restore(engine, state: TrainState, api) -> TrainState:
    checkpoint = api.get_checkpoint()
    if checkpoint is None:
        return state
    with checkpoint.as_directory() as folder:
        _, client = engine.load_checkpoint(folder, tag=CHECKPOINT_TAG)
    restored = TrainState(**{k: v for k, v in client.items() if k in TrainState.__dataclass_fields__})
    if restored.torch_rng is not None:
        torch.set_rng_state(restored.torch_rng)
    return restored


def _save_and_report(engine, state: TrainState, metrics: Dict[str, float], logger, api) -> None:
    """DeepSpeed checkpoint on every rank (ZeRO shards its state), merged and persisted by Ray
    Train (by Ray Tune in local mode)."""
    if logger is not None:
        logger.flush(timeout_s=10)  # best effort; what stays unsent goes into the checkpoint
        state.mlflow_pending = logger.pending_state()
        state.mlflow_watermarks = logger.watermarks
    state.torch_rng = torch.get_rng_state()
    with tempfile.TemporaryDirectory() as folder:
        engine.save_checkpoint(folder, tag=CHECKPOINT_TAG, client_state=asdict(state))
        api.report(metrics, checkpoint=api.Checkpoint.from_directory(folder))


def train_worker(payload: Dict[str, Any]) -> None:
    """Ray Train entry point. payload: resolved `config`, MLflow `run_id`, optional `fault`,
    `local_mode` (Ray Train's local mode inside a Tune trial)."""
    cfg = from_dict(payload["config"])
    own_group = ensure_process_group(cfg)
    try:
        _train(cfg, payload, _ray(payload))
    finally:
        if own_group:
            dist.destroy_process_group()


def _train(cfg: Config, payload: Dict[str, Any], api) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()  # Ray Train's world rank and size
    torch.set_num_threads(max(1, int(cfg.cluster.cpus_per_worker)))  # the CPUs Ray gave this worker
    plan = batch_plan(cfg)
    assert plan.num_workers == world, f"config says {plan.num_workers} workers, Ray Train started {world}"
    steps = batching.total_steps(plan, cfg.train.total_tokens)
    budget = plan.tokens_for_steps(steps)
    device = torch.device("cuda", torch.cuda.current_device()) if cfg.cluster.use_gpu else torch.device("cpu")

    work = workloads.build(cfg, plan, device)
    # The probe's rescaling assumes token-weighted losses; the naive mode measures nothing.
    probe = (GradNormProbe(work.model) if cfg.gns.enabled and plan.micro_batches_per_update > 1
             and cfg.train.loss_normalization == "token" else None)
    engine = _engine(cfg, plan, work)
    state = _restore(engine, TrainState(run_id=payload["run_id"]), api)
    gns = noise.NoiseScaleEMA(gns_ema_tokens(cfg))
    if state.gns:
        gns.load_state_dict(state.gns)

    logger = monitor = None
    if rank == 0:
        uri = tracking.resolve_uri(cfg.tracking.uri)
        # Resume watermark: what MLflow already holds wins over what the checkpoint remembers.
        held = tracking.last_steps(uri, state.run_id)
        logger = tracking.MetricLogger(uri, state.run_id, cfg.tracking.flush_every_s, cfg.tracking.max_buffered_points,
                                       watermarks={**state.mlflow_watermarks, **held})
        logger.restore_pending(state.mlflow_pending, held)
        system = cfg.tracking.system_metrics if cfg.tracking.system_metrics is not None else cfg.cluster.use_gpu
        monitor = tracking.start_system_metrics(uri, state.run_id, cfg.tracking.system_metrics_interval_s) if system else None
        if cfg.gns.enabled and probe is None:
            print("gns: D x A = 1, so there is no small batch to compare with; B_simple is not measured", flush=True)
        if state.update:
            print(f"resuming at update {state.update:,} ({state.tokens:,} tokens) from the latest checkpoint", flush=True)

    last_eval = float("nan")
    if state.update == 0:  # the curve starts at the initial loss (ln 257 for bytes)
        last_eval = evaluate(engine, work, rank, world)
        if logger:
            logger.log({"eval/loss": last_eval}, 0)
    window = Window(tokens_at_start=state.tokens)
    for update in range(state.update, steps):
        _maybe_inject_fault(state.tokens, rank, payload.get("fault", {}), logger)
        before = state.tokens
        lr = lr_at(before + plan.tokens_per_update, peak=cfg.optim.lr, total_tokens=budget,
                   warmup_tokens=cfg.schedule.warmup_tokens, decay=cfg.schedule.decay,
                   min_lr_ratio=cfg.schedule.min_lr_ratio, wsd_decay_share=cfg.schedule.wsd_decay_share)
        _set_lr(engine, lr)
        stats = train_update(engine, work, plan, update, rank, probe, cfg.train.loss_normalization == "micro_batch")
        state.update, state.tokens = update + 1, before + plan.tokens_per_update

        if not math.isfinite(stats["loss"]):  # end the run; the driver marks it failed
            if logger:
                tracking.set_tags(logger.uri, state.run_id, {tracking.FAILURE_TAG: f"non-finite loss at {state.tokens:,} tokens"})
            api.report({"tokens": state.tokens, "diverged": 1.0, "loss": stats["loss"]})
            break
        if logger:  # the loss of this update, at the tokens seen after it (DESIGN.md 3)
            logger.log({"train/loss": stats["loss"], "train/lr": lr, "train/grad_norm": stats["grad_norm"]}, state.tokens)
        window.loss_sum += stats["loss_sum"]
        window.real_tokens += stats["real_tokens"]
        window.slots += stats["local_slots"]
        for k, v in stats["source_tokens"].items():
            window.source_tokens[k] = window.source_tokens.get(k, 0) + v
        if probe:
            b_big, b_small = stats["real_tokens"], stats["real_tokens"] / plan.micro_batches_per_update
            if math.isfinite(stats["grad_norm"]) and b_big > b_small:
                gns.update(*noise.estimate(stats["small_sq_mean"], b_small, stats["grad_norm"] ** 2, b_big),
                           tokens=plan.tokens_per_update)

        last = state.update == steps
        evaluated = _due(before, state.tokens, cfg.train.eval_every_tokens) or last
        if evaluated:
            eval_started = time.perf_counter()
            last_eval = evaluate(engine, work, rank, world)
            window.eval_s += time.perf_counter() - eval_started
            if logger:
                logger.log({"eval/loss": last_eval}, state.tokens)
        checkpoint_due = _due(before, state.tokens, cfg.train.checkpoint_every_tokens) or last
        if not (_due(before, state.tokens, cfg.train.report_every_tokens) or evaluated or checkpoint_due):
            continue

        elapsed = time.perf_counter() - window.started - window.eval_s
        tokens_per_s = (state.tokens - window.tokens_at_start) / max(elapsed, 1e-9)
        metrics = {
            "train/optimizer_step": state.update,
            "train/tokens": state.tokens,
            "perf/tokens_per_s": tokens_per_s,
            "perf/mfu": _mfu(work.flops_per_token, tokens_per_s, cfg),
            # every worker holds the same number of token slots per update
            "data/packing_efficiency": window.real_tokens / max(window.slots * world, 1),
        }
        real = sum(window.source_tokens.values())
        metrics.update({f"data/share/{k}": v / real for k, v in window.source_tokens.items() if real})
        if probe and gns.b_simple is not None:
            metrics.update({"gns/b_simple": gns.b_simple, "gns/g_squared": gns.g_squared, "gns/trace_sigma": gns.trace_sigma})
        if logger:
            logger.log(metrics, state.tokens)
        ray_metrics = {"tokens": state.tokens, "loss": window.loss_sum / max(window.real_tokens, 1), "eval_loss": last_eval,
                       "lr": lr, "step": state.update, "b_simple": metrics.get("gns/b_simple", float("nan"))}
        state.gns = gns.state_dict()
        # A Ray Train report is a barrier across workers (about a second here), so Ray hears
        # only at evaluations and checkpoints: that is where Tune's schedulers decide.
        if checkpoint_due:
            _save_and_report(engine, state, ray_metrics, logger, api)
        elif evaluated:
            if logger:  # a scheduler may stop this trial on this report: what it decided on is in MLflow
                logger.flush(timeout_s=10)
            api.report(ray_metrics)
        window = Window(tokens_at_start=state.tokens)

    if probe:
        probe.remove()
    if monitor:
        monitor.finish()
    if logger:
        logger.close()


def _mfu(flops_per_token: float, tokens_per_s: float, cfg: Config) -> float:
    """Model FLOPs utilisation against a named peak (H100/H200 bf16 dense: 989 TFLOP/s per GPU)."""
    if not cfg.cluster.use_gpu:
        return float("nan")  # no meaningful peak for a shared CPU
    peak = float(os.environ.get("ORCHESTRATOR_PEAK_FLOPS", 989e12)) * cfg.cluster.num_workers
    return flops_per_token * tokens_per_s / peak
