"""`orchestrator plan`: what a config means in sequences, tokens, steps and learning rates."""

from __future__ import annotations

import math
from typing import Any, Dict

from orchestrator import batching, ds_config
from orchestrator.config import Config, batch_plan
from orchestrator.schedules import lr_at


def lr_schedule(cfg: Config, tokens: float) -> float:
    s = cfg.schedule
    return lr_at(
        tokens,
        peak=cfg.optim.lr,
        total_tokens=rounded_budget(cfg),
        warmup_tokens=s.warmup_tokens,
        decay=s.decay,
        min_lr_ratio=s.min_lr_ratio,
        wsd_decay_share=s.wsd_decay_share,
    )


def rounded_budget(cfg: Config) -> int:
    """train.total_tokens rounded down to whole updates."""
    plan = batch_plan(cfg)
    return plan.tokens_for_steps(batching.total_steps(plan, cfg.train.total_tokens))


def describe(cfg: Config) -> Dict[str, Any]:
    plan = batch_plan(cfg)
    steps = batching.total_steps(plan, cfg.train.total_tokens)
    total = plan.tokens_for_steps(steps)
    tpu = plan.tokens_per_update
    warmup_steps = math.ceil(cfg.schedule.warmup_tokens / tpu)
    ds = ds_config.build(cfg, plan)
    quarter_points = {f"{int(q * 100)}%": q * total for q in (0.0, 0.25, 0.5, 0.75, 1.0)}
    return {
        "seq_len": plan.seq_len,
        "micro_batch_size": plan.micro_batch_size,
        "num_workers": plan.num_workers,
        "grad_accum_steps": plan.grad_accum_steps,
        "sequences_per_update": plan.sequences_per_update,
        "tokens_per_update": tpu,
        "total_tokens_requested": cfg.train.total_tokens,
        "total_tokens": total,
        "total_steps": steps,
        "warmup_steps": warmup_steps,
        "decay": cfg.schedule.decay,
        "decay_steps": steps - warmup_steps,
        "peak_lr": cfg.optim.lr,
        # The LR of the first and last update and at quarters of the budget.
        "lr_at": {"first update": lr_schedule(cfg, tpu), **{k: lr_schedule(cfg, v) for k, v in quarter_points.items()}},
        "deepspeed_train_batch_size": ds["train_batch_size"],
        "deepspeed_micro_batch_per_gpu": ds["train_micro_batch_size_per_gpu"],
        "deepspeed_gradient_accumulation_steps": ds["gradient_accumulation_steps"],
        "zero_stage": cfg.deepspeed.zero_stage,
        "precision": cfg.deepspeed.precision,
    }


def format_table(info: Dict[str, Any]) -> str:
    rows = [
        ("seq_len S", f"{info['seq_len']:,}"),
        ("micro_batch_size b", f"{info['micro_batch_size']:,}"),
        ("num_workers D", f"{info['num_workers']:,}"),
        ("grad_accum_steps A", f"{info['grad_accum_steps']:,}"),
        ("sequences / update", f"{info['sequences_per_update']:,}  (b x D x A)"),
        ("tokens / update", f"{info['tokens_per_update']:,}  (S x b x D x A)"),
        (
            "total tokens",
            f"{info['total_tokens']:,}"
            + (
                ""
                if info["total_tokens"] == info["total_tokens_requested"]
                else f"  (budget {info['total_tokens_requested']:,} rounded down to whole updates)"
            ),
        ),
        ("optimizer steps", f"{info['total_steps']:,}"),
        ("warmup steps", f"{info['warmup_steps']:,}"),
        (f"decay steps ({info['decay']})", f"{info['decay_steps']:,}"),
    ]
    rows += [(f"lr at {k}", f"{v:.3g}") for k, v in info["lr_at"].items()]
    rows += [
        ("DeepSpeed train_batch_size", f"{info['deepspeed_train_batch_size']:,}"),
        ("DeepSpeed micro batch / GPU", f"{info['deepspeed_micro_batch_per_gpu']:,}"),
        ("DeepSpeed grad accumulation", f"{info['deepspeed_gradient_accumulation_steps']:,}"),
        ("ZeRO stage / precision", f"{info['zero_stage']} / {info['precision']}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
