"""`orchestrator plan`: what a config means in sequences, tokens, steps and learning rates."""

from __future__ import annotations

import copy
import math
import os
from typing import Any, Dict, List, Optional, Tuple

from orchestrator.core import derived, ds_config
from orchestrator.core.derived import (
    adamw_constants,
    batch_plan,
    batch_segments,
    micro_batch_limit,
    min_micro_batches,
    scheduled_lr,
    sgd_weight_decay,
)
from orchestrator.core.schema import AUTO, Config
from orchestrator.driver import micro_batch
from orchestrator.formulas import adaptive_batch, batching, cost, memory, schedules

DEFAULT_GPU_MEMORY = 80 * 2**30  # planning for GPUs from a machine without one: an 80 GiB device


def describe(cfg: Config, device_memory: Optional[float] = None) -> Dict[str, Any]:
    """What the config means; `device_memory` (bytes) sizes the memory model's largest b (default:
    the visible GPU when training on GPU, else a CPU worker's share of this machine's memory).
    With `auto`, b is the memory model's answer for that memory."""

    capacity, capacity_from = device_memory_and_source(cfg, device_memory)
    auto = cfg.batch.micro_batch_size == AUTO
    if auto:
        cfg = copy.deepcopy(cfg)
        answer = micro_batch.from_model(cfg, capacity, micro_batch.per_worker_share(cfg))
        cfg.batch.micro_batch_size = micro_batch.fitting(cfg, answer["micro_batch_size"], capacity, capacity_from)
    plan, segments = batch_plan(cfg), batch_segments(cfg)  # computed once: a ramp may have 10,000 segments
    steps, total = derived.total_updates(cfg, segments), derived.rounded_budget(cfg, segments)
    tpu, warmup = plan.tokens_per_update, cfg.schedule.warmup_tokens
    warmup_steps = sum(
        min(s.updates, max(0, math.ceil((warmup - s.start_tokens) / s.plan.tokens_per_update))) for s in segments
    )
    decay_start = schedules.decay_start_tokens(total, warmup, cfg.schedule.decay, cfg.schedule.wsd_decay_share)
    # memory peaks at the largest micro-batch of any segment
    peak_b = max(s.plan.micro_batch_size for s in segments)
    predicted = micro_batch.predict(cfg, peak_b)
    ds = ds_config.build(cfg, plan, predicted[1].params if predicted else None)
    quarter_points = {f"{int(q * 100)}%": q * total for q in (0.0, 0.25, 0.5, 0.75, 1.0)}
    return {
        "seq_len": plan.seq_len,
        "micro_batch_size": plan.micro_batch_size,
        "micro_batch_auto": auto,
        "num_workers": plan.num_workers,
        "grad_accum_steps": plan.grad_accum_steps,
        "sequences_per_update": plan.sequences_per_update,
        "tokens_per_update": tpu,
        "total_tokens_requested": cfg.train.total_tokens,
        "total_tokens": total,
        "total_steps": steps,
        "warmup_steps": warmup_steps,
        "decay": cfg.schedule.decay,
        "decay_steps": steps - max(warmup_steps, _updates_ending_by(segments, decay_start)),
        "peak_lr": cfg.optim.lr,
        **_optimizer(cfg),
        "gns": gns_note(cfg, plan),
        "ramp": _ramp(cfg, segments) if cfg.batch.ramp else [],
        # The LR of the first and last update and at quarters of the budget.
        "lr_at": {
            "first update": scheduled_lr(cfg, tpu, segments),
            **{k: scheduled_lr(cfg, v, segments) for k, v in quarter_points.items()},
        },
        "deepspeed_train_batch_size": ds["train_batch_size"],
        "deepspeed_micro_batch_per_gpu": ds["train_micro_batch_size_per_gpu"],
        "deepspeed_gradient_accumulation_steps": ds["gradient_accumulation_steps"],
        "zero_stage": derived.zero_stage(cfg),  # the engine's: with one worker it can be below the given
        "zero_stage_given": cfg.deepspeed.zero_stage,
        "precision": cfg.deepspeed.precision,
        "memory": _memory(peak_b, predicted, capacity, capacity_from),
        "against_fixed": against_fixed(cfg, segments, predicted[1].flops_per_token if predicted else None),
    }


def against_fixed(
    cfg: Config,
    segments: List[batching.Segment],
    flops_per_token: Optional[float],
    rate: Optional[cost.Throughput] = None,
) -> Optional[Dict[str, Any]]:
    """What a batch schedule buys: its optimizer steps and wall time against its first batch held
    fixed over the same tokens (None without one: a fixed batch). An adaptive run's ramp is not
    known before it runs, so its steps are a prediction: from the fewest (its noise scale past the
    threshold all along: adaptive_batch.fastest_ramp, up to batch.max_tokens_per_update) to the
    fixed batch's (never past it). Wall time is the cost model's (formulas/cost.py: FLOPs over
    throughput plus start-up), which counts tokens, not updates, so it is the same for both: what
    fewer updates save (the optimizer step, the gradient all-reduce per update, a larger b's better
    utilisation) is not in it. `rate`: the throughput assumed (cost.py's default for the device)."""
    rule = derived.adaptive_rule(cfg)
    if not cfg.batch.ramp and rule is None:
        return None
    tokens, first = segments[-1].end_tokens, segments[0].plan.tokens_per_update
    if rule:
        fewest = derived.batch_segments(cfg, adaptive_batch.fastest_ramp(rule, first, tokens))
        steps, ramp = derived.total_updates(cfg, fewest), [(s.start_tokens, s.plan.tokens_per_update) for s in fewest]
    else:
        steps, ramp = derived.total_updates(cfg, segments), None
    rate = rate or cost.throughput(cfg.cluster.use_gpu)
    devices, held = trial_devices(cfg)
    wall = cost.trial_cost(tokens, flops_per_token, devices, held, rate).wall_s
    return {
        "schedule": "adaptive" if rule else "ramp",
        "tokens": tokens,
        "steps": steps,
        "prediction": ramp,
        "fixed_tokens_per_update": first,
        "fixed_steps": tokens // first,
        "wall_s": wall,
        "fixed_wall_s": wall,
    }


def trial_devices(cfg: Config) -> Tuple[float, float]:
    """(devices that compute, devices held): GPUs; or on CPU, torch threads (one per whole CPU of
    cluster.cpus_per_worker, at least one, as the worker sets them) and the CPUs Ray reserves."""
    c = cfg.cluster
    if c.use_gpu:
        return c.num_workers * c.gpus_per_worker, c.num_workers * c.gpus_per_worker
    return c.num_workers * max(1, int(c.cpus_per_worker)), c.num_workers * c.cpus_per_worker


def _updates_ending_by(segments: List[batching.Segment], tokens: float) -> int:
    """The updates that end at or before `tokens`: an update's lr is the schedule's where it ends,
    so the decay's updates are the others."""
    return sum(
        min(s.updates, max(0, math.floor((tokens - s.start_tokens) / s.plan.tokens_per_update))) for s in segments
    )


def _ramp(cfg: Config, segments: List[batching.Segment]) -> List[Dict[str, Any]]:
    """Each batch.ramp segment (`segments`: batch_segments(cfg)): where it starts, its split, its
    updates, the lr right after the change and, where AdamW's beta2 or weight decay is given in
    tokens (so it moves with the batch), the segment's."""
    o = cfg.optim
    in_tokens = o.name == "adamw" and (
        o.beta2_half_life_tokens is not None or o.weight_decay_timescale_share is not None
    )
    return [
        {
            "from_tokens": s.start_tokens,
            "tokens_per_update": s.plan.tokens_per_update,
            "micro_batch_size": s.plan.micro_batch_size,
            "grad_accum_steps": s.plan.grad_accum_steps,
            "updates": s.updates,
            "lr_factor": s.lr_factor,
            "lr_after_change": scheduled_lr(cfg, s.start_tokens + s.plan.tokens_per_update, segments),
            "adamw": adamw_constants(cfg, s.plan.tokens_per_update, s.lr_factor)._asdict() if in_tokens else None,
        }
        for s in segments
    ]


def _optimizer(cfg: Config) -> Dict[str, Any]:
    """The optimizer and its constants as the run resolves them (SGD: no beta2, coupled L2)."""
    if cfg.optim.name == "sgd":
        return {
            "optimizer": "sgd",
            "momentum": cfg.optim.momentum,
            "weight_decay": sgd_weight_decay(cfg),
            "weight_decay_from": "optim.weight_decay" if cfg.optim.weight_decay is not None else "default",
        }
    adamw = adamw_constants(cfg)
    return {
        "optimizer": "adamw",
        "beta2": adamw.beta2,
        "beta2_from": _form(cfg, "beta2", "beta2_half_life_tokens"),
        "weight_decay": adamw.weight_decay,
        "weight_decay_from": _form(cfg, "weight_decay", "weight_decay_timescale_share"),
    }


def _form(cfg: Config, step_key: str, token_key: str) -> str:
    """Which form gave an optimizer constant: the per-step key, the token key, or the default."""
    o = cfg.optim
    if getattr(o, step_key) is not None:
        return f"optim.{step_key}"
    if getattr(o, token_key) is not None:
        return f"optim.{token_key}={getattr(o, token_key):g}"
    return "default"


def gns_note(cfg: Config, plan) -> str:
    """Whether B_simple is measured, and why the b and A are what they are."""
    if not cfg.gns.enabled:
        return "off (gns.enabled=false)"
    if cfg.train.loss_normalization != "token":
        return "not measured (train.loss_normalization is not 'token')"
    if plan.micro_batches_per_update < 2:
        if cfg.batch.grad_accum_steps is not None:
            return (
                f"not measured: batch.grad_accum_steps={cfg.batch.grad_accum_steps} given, so D x A = 1 "
                "(omit it and the update is split in two)"
            )
        return "not measured: one sequence per update, no small batch"
    split = min_micro_batches(cfg) > 1 and plan != batching.solve(
        plan.seq_len, plan.tokens_per_update, micro_batch_limit(cfg), plan.num_workers
    )
    return f"measured over D x A = {plan.micro_batches_per_update} micro-batches per update" + (
        " (split for it: gns.enabled, batch.grad_accum_steps omitted)" if split else ""
    )


def _memory(b: int, predicted, capacity: float, capacity_from: str) -> Optional[Dict[str, Any]]:
    """The memory model's figures per worker at micro-batch b (orchestrator/formulas/memory.py), None if
    the workload gives none."""
    if predicted is None:
        return None
    estimate, costs = predicted
    fixed = estimate.states + estimate.bucket
    return {
        "micro_batch_size": b,
        "params": costs.params,
        "states_bytes": estimate.states,
        "bucket_bytes": estimate.bucket,
        "activation_bytes": estimate.activations,
        "total_bytes": estimate.total,
        "activation_bytes_per_sequence": costs.activation_bytes_per_sequence,
        "device_memory_bytes": capacity,
        "device_memory_from": capacity_from,
        "largest_micro_batch_size": memory.largest_micro_batch(fixed, costs.activation_bytes_per_sequence, capacity),
        "headroom": memory.HEADROOM,
    }


def visible_device_memory(cfg: Config) -> float:
    """The memory of the device a worker would train on, as seen from here."""
    return device_memory_and_source(cfg)[0]


def device_memory_and_source(cfg: Config, given: Optional[float] = None) -> Tuple[float, str]:
    """(bytes, what they are) of the memory a worker's micro-batch must fit in."""
    if given:
        return given, "--device-memory"
    if cfg.cluster.use_gpu:
        import torch

        if torch.cuda.is_available():
            return float(torch.cuda.get_device_properties(0).total_memory), "the visible GPU"
        return DEFAULT_GPU_MEMORY, "an 80 GiB GPU: none is visible here; --device-memory sets it"
    cpus = os.cpu_count() or 1
    return micro_batch.cpu_worker_memory(cfg), (
        f"the CPU worker's share of host memory: {cfg.cluster.cpus_per_worker:g} of {cpus} CPUs"
    )


def format_table(info: Dict[str, Any]) -> str:
    rows = [
        ("seq_len S", f"{info['seq_len']:,}"),
        (
            "micro_batch_size b",
            f"{info['micro_batch_size']:,}" + ("  (auto: the memory model's)" if info["micro_batch_auto"] else ""),
        ),
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
    rows += [("peak lr", f"{info['peak_lr']:.3g}  (optim.lr)")]
    rows += [(f"lr at {k}", f"{v:.3g}") for k, v in info["lr_at"].items()]
    for s in info["ramp"]:
        rows.append(
            (
                f"ramp from {s['from_tokens']:,} tokens",
                f"B {s['tokens_per_update']:,} (b {s['micro_batch_size']} x A {s['grad_accum_steps']}), "
                f"{s['updates']:,} updates, lr x {s['lr_factor']:.3g}: {s['lr_after_change']:.3g} after the change"
                + (
                    f"; beta2 {s['adamw']['beta2']:.6g}, weight decay {s['adamw']['weight_decay']:.6g}"
                    if s["adamw"]
                    else ""
                ),
            )
        )
    rows += against_fixed_rows(info["against_fixed"])
    if info["optimizer"] == "sgd":
        rows += [
            ("SGD momentum", f"{info['momentum']:.6g}"),
            ("SGD weight decay (L2)", f"{info['weight_decay']:.6g}  ({info['weight_decay_from']})"),
        ]
    else:
        rows += [
            ("AdamW beta2", f"{info['beta2']:.6g}  ({info['beta2_from']})"),
            ("AdamW weight decay", f"{info['weight_decay']:.6g}  ({info['weight_decay_from']})"),
        ]
    rows += [("gradient noise scale", info["gns"])]
    rows += [
        ("DeepSpeed train_batch_size", f"{info['deepspeed_train_batch_size']:,}"),
        ("DeepSpeed micro batch / GPU", f"{info['deepspeed_micro_batch_per_gpu']:,}"),
        ("DeepSpeed grad accumulation", f"{info['deepspeed_gradient_accumulation_steps']:,}"),
        ("ZeRO stage / precision", f"{_zero_stage_text(info)} / {info['precision']}"),
    ]
    m = info["memory"]
    if m:
        gib = memory.format_bytes
        rows += [
            ("parameters", f"{m['params']:,}"),
            (
                "memory / worker (model)",
                f"{gib(m['total_bytes'])} = states {gib(m['states_bytes'])} + bucket {gib(m['bucket_bytes'])} "
                f"+ activations {gib(m['activation_bytes'])} (b={m['micro_batch_size']})",
            ),
            ("activations / sequence", gib(m["activation_bytes_per_sequence"])),
            (
                "largest b that fits",
                f"{m['largest_micro_batch_size']:,} in {gib(m['device_memory_bytes'])} ({m['device_memory_from']}), "
                f"{m['headroom']:.0%} of it left free",
            ),
        ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def against_fixed_rows(against: Optional[Dict[str, Any]]) -> List[Tuple[str, str]]:
    """against_fixed's lines of the plan table (none for a fixed batch)."""
    if not against:
        return []
    fixed = (
        f"{against['fixed_steps']:,} at a fixed {against['fixed_tokens_per_update']:,} "
        f"over the same {against['tokens']:,} tokens"
    )
    saved = 1 - against["steps"] / against["fixed_steps"]
    if against["prediction"] is None:
        steps = ("optimizer steps vs fixed", f"{against['steps']:,} with the ramp against {fixed} ({-saved:+.0%})")
    else:
        top = against["prediction"][-1]
        steps = (
            "optimizer steps vs fixed",
            f"predicted: {against['steps']:,} ({-saved:+.0%}; B {top[1]:,} from {top[0]:,} tokens, doubling at "
            f"every chance) to {fixed} (never doubling); the run decides from its noise scale",
        )
    wall = against["wall_s"]
    return [
        steps,
        (
            "wall time vs fixed",
            "unknown (the workload states no FLOPs)"
            if wall is None
            else f"{cost.format_duration(wall)} both: the cost model counts tokens, not updates",
        ),
    ]


def _zero_stage_text(info: Dict[str, Any]) -> str:
    run, given = info["zero_stage"], info["zero_stage_given"]
    return str(run) if run == given else f"{run} (given {given}; one worker: docs/configuration.md)"
