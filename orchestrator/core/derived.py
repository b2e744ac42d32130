"""What a config implies beyond its keys: the batch plan (S x b x D x A) and the segments of a
batch ramp, the beta2 and weight decay AdamW uses, SGD's L2 coefficient, the ZeRO stage the
engine runs, the gradient noise scale's EMA, whether to compile, and what Ray reserves for a
run's workers and a sweep's trial (its shape, which formulas/feasibility checks against a
cluster). The one place each is computed: the trainer, the DeepSpeed config, `plan`, validation
and the MLflow params all read them here.

Pure: the schema and the formulas only (which take the config's plain numbers, never the config).
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from orchestrator.core.schema import AUTO, DEFAULT_BETA2, DEFAULT_WEIGHT_DECAY, Config, RampStep
from orchestrator.formulas import batching, feasibility, memory, schedules
from orchestrator.formulas.adaptive_batch import AdaptiveRule


def compile_enabled(cfg: Config) -> bool:
    """model.compile, or by default: on GPU yes, on CPU no."""
    return cfg.model.compile if cfg.model.compile is not None else cfg.cluster.use_gpu


GNS_EMA_SHARE = 50
"""gns.ema_tokens defaults to the budget / GNS_EMA_SHARE. The EMA is logged at its centre of mass,
which leaves a lag of second order only (curvature x ema_tokens^2); on linear regression with
AdamW a fiftieth keeps it under 5 % of B_simple while it changes (docs/critical-batch.md)."""


def gns_ema_tokens(cfg: Config) -> int:
    """The GNS EMA's time constant in tokens (a fiftieth of the budget unless given)."""
    return cfg.gns.ema_tokens or max(1, cfg.train.total_tokens // GNS_EMA_SHARE)


class AdamWConstants(NamedTuple):
    beta2: float
    weight_decay: float


def adamw_constants(cfg: Config, tokens_per_update: Optional[int] = None, lr_factor: float = 1.0) -> AdamWConstants:
    """The beta2 and weight decay a run uses: the per-step value given, else the one its token
    form gives, else the default. The one place they are resolved: the torch optimizer
    (workloads/train/engine.py), the DeepSpeed config (ds_config.py), `plan` and the MLflow params read it.

    A token form holds in tokens along a batch.ramp: it is resolved at `tokens_per_update` and the
    peak lr times `lr_factor` (a segment's; default the run's first batch and its lr), and the
    trainer sets it at every update as it sets the lr. Per-step values stay as given."""
    o = cfg.optim
    tokens_per_update = tokens_per_update or cfg.batch.tokens_per_update
    lr = o.lr * lr_factor
    if o.beta2 is not None:
        beta2 = o.beta2
    elif o.beta2_half_life_tokens is not None:  # an old gradient's weight halves every N tokens
        beta2 = 0.5 ** (tokens_per_update / o.beta2_half_life_tokens)
    else:
        beta2 = DEFAULT_BETA2
    if o.weight_decay is not None:
        weight_decay = o.weight_decay
    elif o.weight_decay_timescale_share is not None:
        # AdamW shrinks weights by (1 - lr x wd) per update: a timescale of 1 / (lr x wd) updates,
        # B / (lr x wd) tokens, here a share of the run (validation refuses it with lr = 0).
        weight_decay = tokens_per_update / (lr * o.weight_decay_timescale_share * cfg.train.total_tokens)
    else:
        weight_decay = DEFAULT_WEIGHT_DECAY
    return AdamWConstants(float(beta2), float(weight_decay))


def sgd_weight_decay(cfg: Config) -> float:
    """optim.name=sgd: torch SGD's coupled L2 coefficient (added to the gradient, so it passes
    through the momentum), optim.weight_decay as given, 0 when null: AdamW's default 0.1 is a
    decoupled decay and does not carry over. The torch optimizer, the DeepSpeed config, `plan`
    and the MLflow params read it."""
    return float(cfg.optim.weight_decay or 0.0)


def zero_extra(cfg: Config) -> Dict[str, Any]:
    """The user's `deepspeed.extra.zero_optimization` section ({} unless it is a mapping)."""
    section = (cfg.deepspeed.extra or {}).get("zero_optimization")
    return section if isinstance(section, dict) else {}


def zero_stage(cfg: Config) -> int:
    """The ZeRO stage the DeepSpeed engine runs: deepspeed.zero_stage, except with one worker.

    ZeRO splits model states over the D workers. With one, every split is whole: a higher stage
    holds no less memory, and DeepSpeed's machinery for it only costs time (stage 2 reduces the
    gradients after every micro-batch, stage 3 gathers and releases each module's parameters
    around its forward and backward; docs/benchmarks.md, trainer_overhead). So a one-worker run
    runs, of the stages up to the one given, the one holding the least memory per parameter
    (memory.state_bytes_per_param at D = 1): 0 in fp32, 1 in bf16 and fp16 (fp16 needs ZeRO 1
    or more; validation). `deepspeed.extra.zero_optimization.stage` is what DeepSpeed gets
    whatever the workers (the way to run a stage as such on one worker), and an offload set
    there keeps the stage given (the offloaded parts are what it saves)."""
    given, precision, extra = cfg.deepspeed.zero_stage, cfg.deepspeed.precision, zero_extra(cfg)
    if "stage" in extra:
        return int(extra["stage"])
    if cfg.cluster.num_workers > 1 or any(str(k).startswith("offload") for k in extra):
        return given
    allowed = [s for s in range(given + 1) if s > 0 or precision != "fp16"] or [given]
    return min(allowed, key=lambda s: (memory.state_bytes_per_param(s, precision, 1), s))


def micro_batch_limit(cfg: Config) -> Optional[int]:
    """batch.micro_batch_size as the solver's bound; None while it is `auto` (not yet resolved)."""
    b = cfg.batch.micro_batch_size
    return None if b == AUTO else b


def min_micro_batches(cfg: Config) -> int:
    """Micro-batches (D x A) an update needs at least: two when the gradient noise scale is
    measured and A is left to the solver, since B_simple compares a micro-batch's gradient with
    the update's. Token-weighted accumulation makes the split invisible in the loss curve
    (docs/design.md 4.1); the naive per-micro-batch mean is not split-invariant, so it is not split."""
    measured = cfg.gns.enabled and cfg.train.loss_normalization == "token"
    return 2 if measured and cfg.batch.grad_accum_steps is None else 1


def measures_adam_noise_scale(cfg: Config) -> bool:
    """Whether a run keeps AdamW's preconditioner for gns/b_simple_adam (a whole fp32 copy per
    worker: 4 bytes per parameter, which the memory model counts)."""
    measured = cfg.gns.enabled and cfg.train.loss_normalization == "token"
    return measured and cfg.gns.adam and cfg.optim.name == "adamw"


ADAPTIVE = "adaptive"


def batch_segments(cfg: Config, realised: Optional[Sequence[Tuple[int, int]]] = None) -> List[batching.Segment]:
    """The run's batch sizes along its budget (batch.ramp; one segment without it; `realised`:
    the (from_tokens, tokens_per_update) an adaptive run has decided so far, which hold to the
    end), each decomposed by batch_plan's rule, with the lr factor batch.ramp_lr_scaling gives it."""
    steps = realised or [
        (r.from_tokens, r.tokens_per_update) for r in cfg.batch.ramp or [RampStep(0, cfg.batch.tokens_per_update)]
    ]
    alpha = batching.alpha_of(cfg.batch.ramp_lr_scaling, "batch.ramp_lr_scaling")
    plan_for = functools.lru_cache(maxsize=None)(lambda B: _plan(cfg, B))  # a ramp repeats its batch sizes
    return batching.segments(list(steps), cfg.train.total_tokens, plan_for, alpha)


def adaptive_rule(cfg: Config) -> Optional[AdaptiveRule]:
    """batch.schedule=adaptive's rule (None for a fixed schedule); batch.calibration is the one
    the driver resolved (from batch.calibration_from, when given)."""
    b = cfg.batch
    if b.schedule != ADAPTIVE:
        return None
    return AdaptiveRule(max_tokens_per_update=int(b.max_tokens_per_update), calibration=float(b.calibration))


def adaptive_batches(cfg: Config) -> List[int]:
    """The batch sizes an adaptive run may double to: tokens_per_update x 2, 4, ... up to the cap."""
    out, batch = [], cfg.batch.tokens_per_update
    while cfg.batch.max_tokens_per_update and 2 * batch <= cfg.batch.max_tokens_per_update:
        batch *= 2
        out.append(batch)
    return out


def batch_plan(cfg: Config) -> batching.BatchPlan:
    """S x b x D x A of the config (plan, dry-run, the memory model, the trainer and the MLflow
    params all read this one). With `auto` not yet resolved (orchestrator/driver/micro_batch.py), b is
    bounded by the per-worker share of the update alone: right for checking that the batch
    decomposes, not for running."""
    return _plan(cfg, cfg.batch.tokens_per_update)


def _plan(cfg: Config, tokens_per_update: int) -> batching.BatchPlan:
    return batching.solve(
        cfg.data.seq_len,
        tokens_per_update,
        micro_batch_limit(cfg),
        cfg.cluster.num_workers,
        cfg.batch.grad_accum_steps,
        min_micro_batches(cfg),
    )


def scheduled_lr(cfg: Config, tokens: float, segments: Optional[List[batching.Segment]] = None) -> float:
    """The lr of the update that ends at `tokens`, as the trainer sets it and `plan` prints it:
    the schedule over the budget in whole updates, times the batch.ramp segment's factor
    (`segments`: batch_segments(cfg), when the caller has them)."""
    segments = segments or batch_segments(cfg)
    s = cfg.schedule
    return batching.segment_ending(segments, tokens).lr_factor * schedules.lr_at(
        tokens,
        peak=cfg.optim.lr,
        total_tokens=segments[-1].end_tokens,
        warmup_tokens=s.warmup_tokens,
        decay=s.decay,
        min_lr_ratio=s.min_lr_ratio,
        wsd_decay_share=s.wsd_decay_share,
    )


def rounded_budget(cfg: Config, segments: Optional[List[batching.Segment]] = None) -> int:
    """train.total_tokens rounded down to whole updates (of the last batch.ramp segment;
    `segments`: batch_segments(cfg), when the caller has them)."""
    return (segments or batch_segments(cfg))[-1].end_tokens


def total_updates(cfg: Config, segments: Optional[List[batching.Segment]] = None) -> int:
    """Optimizer updates over the rounded budget, along every batch.ramp segment (`segments` as
    for rounded_budget)."""
    last = (segments or batch_segments(cfg))[-1]
    return last.start_update + last.updates


def worker_resources(cfg: Config) -> Dict[str, float]:
    """What Ray reserves for one worker, e.g. {"CPU": 8, "GPU": 1} (cluster.cpus_per_worker, and
    cluster.gpus_per_worker with cluster.use_gpu)."""
    c = cfg.cluster
    return feasibility.bundle(c.cpus_per_worker, c.gpus_per_worker if c.use_gpu else 0.0)


def shape_of(cfg: Config, trial: Optional[Dict[str, float]] = None) -> feasibility.Shape:
    """What a run of `cfg` holds: D worker bundles in cluster.placement_strategy, plus `trial`
    (a Tune trial's own resources)."""
    c = cfg.cluster
    return feasibility.Shape(c.num_workers, worker_resources(cfg), c.placement_strategy, dict(trial or {}))


TRIAL_DRIVER_CPUS = 0.2  # a Tune trial that only waits on its worker group; the workers hold the CPUs


def in_trial_process(cfg: Config, local_mode: bool) -> bool:
    """Does a sweep's trial of `cfg` run its one worker in the Tune trial's process (Ray Train
    local mode, the sweep file's `local_mode`)?"""
    return local_mode and batch_plan(cfg).num_workers == 1


def trial_resources(cfg: Optional[Config], local_mode: bool) -> Dict[str, float]:
    """What a sweep's Tune trial of `cfg` holds: the worker's CPUs (and GPU) when the worker runs
    inside it, else a fraction of a CPU for waiting on its worker group (None: an infeasible point)."""
    if cfg is None or not in_trial_process(cfg, local_mode):
        return {"CPU": TRIAL_DRIVER_CPUS}
    return worker_resources(cfg)


def trial_shape(cfg: Config, local_mode: bool) -> feasibility.Shape:
    """What a sweep's trial of `cfg` holds: its worker bundles and the Tune trial's own CPU, or,
    when the worker runs inside the trial, one bundle for both."""
    if in_trial_process(cfg, local_mode):
        return shape_of(cfg)
    return shape_of(cfg, trial={"CPU": TRIAL_DRIVER_CPUS})
