"""The DeepSpeed side of a worker: the process group, the engine, one optimizer update
(`train_update`) and an evaluation pass. train_loop.py drives them; benchmarks call them directly.

Token-weighted accumulation (DESIGN.md 4.2): before the first backward of an update we count
the real tokens of all its micro-batches on all workers (N). Each micro-batch's *summed* token
loss is scaled by D / N: DeepSpeed averages gradients over the D workers, so the update's
gradient is exactly the mean over every real token, however the batch is split. We call
`backward(scale_wrt_gas=False)` so DeepSpeed's own 1/A scaling does not apply on top.
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Optional

import deepspeed
import torch
import torch.distributed as dist

from orchestrator import ds_config, noise
from orchestrator.config import Config, compile_enabled
from workloads.gns_probe import GradNormProbe


def ensure_process_group(cfg: Config) -> bool:
    """DeepSpeed needs torch.distributed. Ray Train sets it up for a worker group; in local mode
    there is none, so make one of size 1 (an in-memory store: no port to find), with the
    variables a launcher would set, which DeepSpeed reads. True if it made one."""
    if dist.is_initialized():
        return False
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    dist.init_process_group("nccl" if cfg.cluster.use_gpu else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    return True


def build_engine(cfg: Config, plan, work):
    """The DeepSpeed engine over the workload's model: AdamW, the DeepSpeed config from ds_config."""
    optimizer = torch.optim.AdamW(
        work.param_groups(),
        lr=cfg.optim.lr,
        betas=(cfg.optim.beta1, cfg.optim.beta2),
        eps=cfg.optim.eps,
        fused=cfg.cluster.use_gpu or None,
    )
    num_params = sum(p.numel() for p in work.model.parameters())
    config = ds_config.build(cfg, plan, num_params)
    engine, _, _, _ = deepspeed.initialize(model=work.model, optimizer=optimizer, config=config)
    if compile_enabled(cfg):
        # The whole model, in place (the state dict keeps its keys). Inductor keeps what it
        # compiles on disk, per node and user (TORCHINDUCTOR_CACHE_DIR, default
        # /tmp/torchinductor_<user>), so later trials of the same shape on the node load it.
        engine.compile()
    return engine


def set_lr(engine, lr: float) -> None:
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


def _all_reduce(values: List[float]) -> List[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()
