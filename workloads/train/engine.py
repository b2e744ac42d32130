"""The DeepSpeed side of a worker: the process group, the engine, one optimizer update
(`train_update`) and an evaluation pass. train_loop.py drives them; benchmarks call them directly.

Token-weighted accumulation (docs/design.md 4.2): before the first backward of an update we count
the real tokens of all its micro-batches on all workers (N). Each micro-batch's *summed* token
loss is scaled by D / N: DeepSpeed averages gradients over the D workers, so the update's
gradient is exactly the mean over every real token, however the batch is split. We call
`backward(scale_wrt_gas=False)` so DeepSpeed's own 1/A scaling does not apply on top.
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Optional, Tuple

import deepspeed
import torch
import torch.distributed as dist

from orchestrator.core import ds_config
from orchestrator.core.derived import AdamWConstants, adamw_constants, compile_enabled, sgd_weight_decay
from orchestrator.core.schema import Config
from orchestrator.formulas import noise
from workloads.train.gns_probe import GradNormProbe, grad_squared_norm
from workloads.train.metrics_window import UpdateStats


def skip_op_probes() -> None:
    """At its first `initialize` in a process, DeepSpeed's CPU comm backend probes every op builder
    (compiler subprocesses) and then builds, or loads through a compiler check, a shared-memory
    all-reduce op that only inference uses: seconds per process, and minutes of waiting on a lock
    when several build it at once. Training needs neither, so tell DeepSpeed before its probe that
    no op is precompiled-compatible. (Ops training does use, such as cpu_adam for ZeRO-Offload,
    are loaded by their builders directly, not through this table.)"""
    import deepspeed.ops

    if "__compatible_ops__" not in vars(deepspeed.ops):
        deepspeed.ops.__compatible_ops__ = {}


def ensure_process_group(cfg: Config) -> bool:
    """DeepSpeed needs torch.distributed. Ray Train sets it up for a worker group; in local mode
    there is none, so make one of size 1 (an in-memory store: no port to find), with the
    variables a launcher would set, which DeepSpeed reads. True if it made one: the caller
    releases it (`release_process_group`)."""
    if dist.is_initialized():
        return False
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    dist.init_process_group("nccl" if cfg.cluster.use_gpu else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    return True


def release_process_group() -> None:
    """Destroy the process group of ensure_process_group with the groups DeepSpeed derived from
    it, so that the next trial a reused process runs starts from none (destroying torch's alone,
    as Ray Train's local mode does at the end of fit(), leaves DeepSpeed holding dead groups)."""
    import deepspeed.comm

    if deepspeed.comm.is_initialized():
        deepspeed.comm.destroy_process_group()
    elif dist.is_initialized():
        dist.destroy_process_group()


def _optimizer(cfg: Config, param_groups: List[Dict]) -> torch.optim.Optimizer:
    """The torch optimizer DeepSpeed wraps (at ZeRO 1-3 it steps it on the flat fp32 partitions)."""
    if cfg.optim.name == "sgd":
        decay = sgd_weight_decay(cfg)
        groups = [{**g, "weight_decay": decay} if g.get("weight_decay", 0.0) is None else g for g in param_groups]
        return torch.optim.SGD(groups, lr=cfg.optim.lr, momentum=cfg.optim.momentum, weight_decay=decay)
    adamw = adamw_constants(cfg)
    groups = [
        {**g, "weight_decay": adamw.weight_decay, RUNS_DECAY: True} if g.get("weight_decay", 0.0) is None else g
        for g in param_groups
    ]
    return torch.optim.AdamW(
        groups,
        lr=cfg.optim.lr,
        betas=(cfg.optim.beta1, adamw.beta2),
        eps=cfg.optim.eps,
        weight_decay=adamw.weight_decay,  # for groups that do not say
        fused=cfg.cluster.use_gpu or None,
    )


def build_engine(cfg: Config, plan, work):
    """The DeepSpeed engine over the workload's model: the torch optimizer optim.name picks (AdamW,
    or SGD), handed to DeepSpeed, with the DeepSpeed config from ds_config. AdamW's beta2 and
    weight decay are the run's (derived.adamw_constants); SGD's weight decay is coupled L2
    (derived.sgd_weight_decay). A parameter group whose weight_decay is None (a workload passing
    optim.weight_decay through, None unless given per step) gets the run's weight decay."""
    optimizer = _optimizer(cfg, work.param_groups())
    num_params = sum(p.numel() for p in work.model.parameters())
    config = ds_config.build(cfg, plan, num_params)
    skip_op_probes()
    if not cfg.cluster.use_gpu:
        # DeepSpeed's CPU accelerator counts its devices by running `numactl --hardware` unless
        # LOCAL_SIZE says, as DeepSpeed's own launcher sets it; ZeRO 3 asks at every micro-batch.
        os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))
    engine, _, _, _ = deepspeed.initialize(model=work.model, optimizer=optimizer, config=config)
    if engine.zero_optimization_stage() == 0 and plan.num_workers == 1:
        # One worker has nothing to average, but ZeRO 0 would still flatten, all-reduce and copy
        # back every gradient at each accumulation boundary (about 1 % of an update on CPU). The
        # run's D, not the world's size: the micro-batch probe runs a D-worker run in a world of one.
        engine.enable_backward_allreduce = False
    if compile_enabled(cfg):
        # The whole model, in place (the state dict keeps its keys). Inductor keeps what it
        # compiles on disk, per node and user (TORCHINDUCTOR_CACHE_DIR, default
        # /tmp/torchinductor_<user>), so later trials of the same shape on the node load it.
        engine.compile()
    return engine


RUNS_DECAY = "runs_weight_decay"
"""Marks an AdamW parameter group that takes the run's weight decay (the workload left it None),
so set_adamw_constants moves it with the batch and leaves a group's own (0 for norms, say) alone."""


def set_lr(engine, lr: float) -> None:
    for group in engine.optimizer.param_groups:
        group["lr"] = lr


def set_adamw_constants(engine, constants: AdamWConstants) -> None:
    """beta2 and the run's weight decay as derived.adamw_constants resolves them for the current
    batch.ramp segment (unchanged along a ramp unless given in tokens)."""
    for group in engine.optimizer.param_groups:
        group["betas"] = (group["betas"][0], constants.beta2)
        if group.get(RUNS_DECAY):
            group["weight_decay"] = constants.weight_decay


def set_plan(engine, plan) -> None:
    """Accumulate `plan`'s A micro-batches of b per update from the next one on (a batch.ramp
    step): DeepSpeed keeps D and reads b and A from its config at every micro-step."""
    engine.set_train_micro_batch_size(plan.micro_batch_size)
    engine.set_train_batch_size(plan.sequences_per_update)
    assert engine.gradient_accumulation_steps() == plan.grad_accum_steps, "DeepSpeed did not take the new A"


def train_update(
    engine, work, plan, first: int, rank: int, probe: Optional[GradNormProbe], naive: bool = False
) -> UpdateStats:
    """One optimizer update split as `plan`, from stream position `first`: A micro-batches on
    this worker, then DeepSpeed's step."""
    batches = [work.micro_batch(first, plan, rank, a) for a in range(plan.grad_accum_steps)]
    # The update's real-token count over all workers, known before the first backward.
    local_real = sum(mb.real_tokens for mb in batches)
    (global_real,) = _all_reduce([local_real])
    scale = plan.num_workers / max(global_real, 1.0)
    fp16 = engine.fp16_enabled()
    scale_before = loss_scale(engine.optimizer, fp16)

    adam = probe.adam if probe else None
    if adam:  # Adam's preconditioner from its state before this update (none before the first step)
        adam.refresh()

    loss_sum, small_sq_sum, small_adam_sum, small_count, own_sq, applied = 0.0, 0.0, 0.0, 0, None, 1.0
    big_adam = 0.0
    for i, mb in enumerate(batches):
        # The boundary is said, not counted: DeepSpeed's micro-step count restarts at a resume
        # and need not be a multiple of a new A after a batch.ramp step.
        last = i == len(batches) - 1
        engine.set_gradient_accumulation_boundary(last)
        if probe:
            probe.start()
        summed, count = work.summed_loss(engine, mb)
        if naive:  # per-micro-batch mean, DeepSpeed's 1/A: not invariant, kept for comparison
            applied = backward(engine, summed / count.clamp(min=1), fp16, gas=plan.grad_accum_steps)
        else:
            # With scale_wrt_gas=False DeepSpeed adds no 1/A of its own. (ZeRO 0/1 reduce
            # gradients once, at the accumulation boundary; ZeRO 2/3 reduce-scatter per micro-step.)
            applied = backward(engine, summed * scale, fp16)
        if probe and mb.real_tokens:
            # Hook gradients are of (summed * scale * applied): rescale to a per-token mean.
            raw_sq, adam_sq = probe.squared_norms()
            small_sq_sum += noise.per_token_sq_norm(raw_sq, scale * applied, mb.real_tokens)
            small_adam_sum += noise.per_token_sq_norm(adam_sq, scale * applied, mb.real_tokens)
            small_count += 1
        if last and engine.zero_optimization_stage() == 0:
            # ZeRO 0 with a torch optimizer keeps no global norm, but after the boundary
            # backward every rank's p.grad holds the all-reduced update gradient (before clipping).
            own_sq = summed_squares(engine.module.parameters())
        if last and adam and adam.ready:  # the reduced gradient, before the step uses and frees it
            big_adam = adam.update_sq_norm() / applied**2
        engine.step()
        loss_sum += float(summed.detach())

    grad_norm = update_grad_norm(
        engine.get_global_grad_norm(),
        zero_stage=engine.zero_optimization_stage(),
        applied_scale=applied,
        scale_before=scale_before,
        scale_after=loss_scale(engine.optimizer, fp16),
        own_sq=own_sq,
    )
    sources = list(work.source_names)
    local_source_tokens = [sum(mb.source_tokens.get(k, 0) for mb in batches) for k in sources]
    totals = _all_reduce([loss_sum, small_sq_sum, small_adam_sum, big_adam, small_count, *local_source_tokens])
    total_loss, total_small_sq, total_small_adam, total_big_adam, total_small, *source_tokens = totals
    measured_adam = adam is not None and adam.ready
    return UpdateStats(
        loss_sum=total_loss,
        real_tokens=global_real,
        loss=total_loss / max(global_real, 1.0),
        grad_norm=grad_norm,
        clipped=clipped(grad_norm, float(engine.gradient_clipping() or 0.0)),
        small_sq_mean=total_small_sq / max(total_small, 1.0),
        small_sq_mean_adam=total_small_adam / max(total_small, 1.0) if measured_adam else float("nan"),
        big_sq_adam=total_big_adam if measured_adam else float("nan"),
        local_slots=sum(mb.slots for mb in batches),
        source_tokens=dict(zip(sources, source_tokens)),  # all workers
    )


def backward(engine, loss: torch.Tensor, fp16: bool, gas: Optional[int] = None) -> float:
    """engine.backward(loss); returns the factor DeepSpeed multiplied the loss by inside it (its
    fp16 loss scale, or 1), so that gradients can be unscaled. `gas`: let DeepSpeed divide by
    the accumulation steps too (the naive mean), which is not part of that factor.

    The factor is measured, not read off the optimizer: the gradient reaching `loss` is exactly
    it. DeepSpeed 0.19.8 scales the loss in backward only for its ZeRO optimizers (ZeRO 1-3, and
    bf16); at ZeRO 0 its fp16 optimizers (FP16_UnfusedOptimizer) report a loss scale but the
    gradients are of the unscaled loss."""
    if not fp16:
        engine.backward(loss, scale_wrt_gas=gas is not None)
        return 1.0
    seen: List[torch.Tensor] = []
    handle = loss.register_hook(seen.append)
    try:
        engine.backward(loss, scale_wrt_gas=gas is not None)
    finally:
        handle.remove()
    return float(seen[0]) * (gas or 1) if seen else 1.0


def loss_scale(optimizer, fp16: bool) -> float:
    """fp16's current (dynamic) loss scale as DeepSpeed's optimizer states it, 1 otherwise."""
    if not fp16:
        return 1.0
    return float(getattr(optimizer, "loss_scale", None) or 1.0)


def summed_squares(parameters) -> float:
    """Sum of the squared gradients (each as the probe takes it, on the device): one host sync."""
    squares = [grad_squared_norm(p.grad) for p in parameters if p.grad is not None]
    return float(torch.stack(squares).double().sum()) if squares else 0.0


def update_grad_norm(
    reported: Optional[float],
    *,
    zero_stage: int,
    applied_scale: float,
    scale_before: float,
    scale_after: float,
    own_sq: Optional[float] = None,
) -> float:
    """The update's global gradient norm before clipping, of the unscaled loss: the big batch of
    the noise scale, and train/grad_norm.

    `reported`: DeepSpeed's norm after the step (engine.get_global_grad_norm()); None where it
    keeps none (ZeRO 0 with a torch optimizer), and then `own_sq`, the summed squares of p.grad
    after the boundary backward, stands in. `applied_scale`: the factor this update's backwards
    multiplied the loss by (`backward`); `scale_before`, `scale_after`: the loss scale DeepSpeed
    states before and after the step. DeepSpeed 0.19.8 divides its norm by a scale of its own:
    ZeRO 1/2 by the scale before the step (the one applied: right), ZeRO 3 by the scale after
    it (wrong by the growth factor in a step where a dynamic scale grew), ZeRO 0's fp16
    optimizers by none. Each is brought back to the norm of the gradients over applied_scale.
    """
    if reported is None:
        return math.sqrt(own_sq) / applied_scale if own_sq is not None else float("nan")
    divided_by = {0: 1.0, 3: scale_after}.get(zero_stage, scale_before)
    return float(reported) * divided_by / applied_scale


def clipped(grad_norm: float, grad_clip: float) -> float:
    """1.0 when DeepSpeed clipped the update (its pre-clip norm above optim.grad_clip > 0), else
    0.0; NaN (not logged) for a non-finite norm: an fp16 step skipped on overflow, not applied."""
    if not math.isfinite(grad_norm):
        return float("nan")
    return float(grad_clip > 0 and grad_norm > grad_clip)


@torch.no_grad()
def evaluate(engine, work, rank: int, world: int) -> Tuple[float, float]:
    """(the held-out loss per real token, its standard error): the ratio estimator's over the
    eval micro-batches, which sample the held-out sequences (NaN with fewer than two)."""
    engine.eval()
    sums = [0.0] * 6  # loss, tokens, batches, loss^2, loss x tokens, tokens^2, per micro-batch
    for mb in work.eval_batches(rank, world):
        summed, n = work.summed_loss(engine, mb)
        s, n = float(summed), float(n)
        if n:
            for i, v in enumerate((s, n, 1.0, s * s, s * n, n * n)):
                sums[i] += v
    engine.train()
    loss, tokens, k, s2, sn, n2 = _all_reduce(sums)
    mean = loss / max(tokens, 1.0)
    if k < 2:
        return mean, float("nan")
    spread = max(0.0, s2 - 2 * mean * sn + mean * mean * n2)  # sum of (s_i - mean n_i)^2
    return mean, math.sqrt(spread / (k * (k - 1))) / (tokens / k)


def _all_reduce(values: List[float]) -> List[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()
