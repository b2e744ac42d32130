"""The one place that turns the typed config into a DeepSpeed config dict (pure, no imports of
DeepSpeed). The user's `deepspeed.extra` is merged last, and the batch invariant is asserted
after the merge so no override can silently change what an update means.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Optional

from orchestrator.core.derived import adamw_constants, sgd_weight_decay, zero_stage
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config
from orchestrator.formulas.batching import BatchPlan
from orchestrator.formulas.memory import DEFAULT_BUCKET


def _deep_merge(base: Dict[str, Any], extra: Dict[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _buckets(num_params: Optional[int]) -> Dict[str, int]:
    if not num_params:
        return {}
    # ZeRO 1 and 2 refuse an odd bucket (a multiple of their 2-element all-gather alignment)
    elements = min(DEFAULT_BUCKET, num_params + num_params % 2)
    return {"reduce_bucket_size": elements, "allgather_bucket_size": elements}


def _optimizer(cfg: Config) -> Dict[str, Any]:
    """The optimizer section. The worker hands DeepSpeed the torch optimizer itself
    (workloads/train/engine.py), which DeepSpeed uses instead of building one from this section; it
    records the same constants in deepspeed.json."""
    if cfg.optim.name == "sgd":
        params = {"lr": cfg.optim.lr, "momentum": cfg.optim.momentum, "weight_decay": sgd_weight_decay(cfg)}
        return {"type": "SGD", "params": params}
    adamw = adamw_constants(cfg)  # beta2 and weight decay as given per step or in tokens
    return {
        "type": "AdamW",
        "params": {
            "lr": cfg.optim.lr,
            "betas": [cfg.optim.beta1, adamw.beta2],
            "eps": cfg.optim.eps,
            "weight_decay": adamw.weight_decay,
        },
    }


def build(cfg: Config, plan: BatchPlan, num_params: Optional[int] = None) -> Dict[str, Any]:
    """DeepSpeed config for one worker of the run described by `cfg` and `plan`. `num_params`
    (the model's) caps DeepSpeed's gradient bucket: ZeRO allocates all of it up front, and a
    bucket larger than the model only holds memory."""
    ds: Dict[str, Any] = {
        "train_batch_size": plan.sequences_per_update,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum_steps,
        # The trainer sets the LR itself from schedules.lr_at(tokens), so no DeepSpeed scheduler.
        "optimizer": _optimizer(cfg),
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": {"stage": zero_stage(cfg), **_buckets(num_params)},
        "steps_per_print": 10**9,  # progress is ours; keep DeepSpeed's log quiet
        "wall_clock_breakdown": False,
    }
    if cfg.deepspeed.precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif cfg.deepspeed.precision == "fp16":
        ds["fp16"] = {"enabled": True, "initial_scale_power": 16}
    if not cfg.cluster.use_gpu:
        # CPU: DeepSpeed's fused CUDA Adam does not exist; use torch's AdamW implementation.
        ds["zero_force_ds_cpu_optimizer"] = False
    if cfg.optim.name == "sgd":
        # ZeRO 1-3 refuse a torch optimizer outside their tested list (Adam, AdamW, Adagrad, ...)
        # unless allowed; they step torch's SGD on the flat fp32 partitions like any other.
        ds["zero_allow_untested_optimizer"] = True
    ds = _deep_merge(ds, cfg.deepspeed.extra)

    micro = ds["train_micro_batch_size_per_gpu"]
    accum = ds["gradient_accumulation_steps"]
    if (
        ds["train_batch_size"] != micro * accum * plan.num_workers
        or ds["train_batch_size"] != plan.sequences_per_update
    ):
        raise ConfigError(
            "deepspeed.extra",
            f"changes the batch: train_batch_size={ds['train_batch_size']} must equal micro {micro} x accumulation "
            f"{accum} x workers {plan.num_workers} = {plan.sequences_per_update}; set batch sizes through batch.*",
        )
    return ds
