"""`batch.micro_batch_size: auto`, resolved before a run opens its MLflow run, once per shape.

A shape is what the answer depends on: the model section, S, ZeRO stage, precision, D and the
device. Its answer is kept in `<train.storage_path>/micro_batch/<digest>.json`, so the trials of
a sweep (and later runs) reuse it; the sweep resolves each distinct shape before its trials start.

- GPU: probed on a device of the trial's kind, by a Ray task holding one worker's resources
  (workloads/train/micro_batch_probe.py).
- CPU: the memory model (orchestrator/formulas/memory.py) against the worker's share of the node's
  memory (its share of the CPUs). With ORCHESTRATOR_DEVICE_MEMORY set (bytes, e.g. 2GiB: a test
  hook), the device is taken to have that much, and the probe runs on CPU.

Then b is the largest divisor of the per-worker share of the update not above the answer, and A
follows, exactly as for a given b (orchestrator/formulas/batching.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any, Dict, Iterable, Optional, Tuple

from orchestrator.core import ds_config, storage
from orchestrator.core.config import to_dict
from orchestrator.core.derived import (
    batch_plan,
    batch_segments,
    measures_adam_noise_scale,
    worker_resources,
    zero_stage,
)
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import AUTO, Config
from orchestrator.formulas import memory

DEVICE_MEMORY_ENV = "ORCHESTRATOR_DEVICE_MEMORY"
log = logging.getLogger(__name__)


def shape(cfg: Config) -> Dict[str, Any]:
    fake = os.environ.get(DEVICE_MEMORY_ENV)
    return {
        "model": to_dict(cfg)["model"],
        "seq_len": cfg.data.seq_len,
        "zero_stage": zero_stage(cfg),
        "precision": cfg.deepspeed.precision,
        "num_workers": cfg.cluster.num_workers,
        "device": f"gpu x {cfg.cluster.gpus_per_worker}" if cfg.cluster.use_gpu else "cpu",
        **({"device_memory": fake} if fake else {}),
    }


def _cache_file(cfg: Config) -> str:
    digest = hashlib.sha256(json.dumps(shape(cfg), sort_keys=True, default=str).encode()).hexdigest()[:16]
    return storage.join(cfg.train.storage_path, "micro_batch", f"{digest}.json")


def per_worker_share(cfg: Config) -> int:
    """Sequences per worker per update (of the largest batch.ramp segment): b can never usefully exceed it."""
    return max(s.plan.sequences_per_update for s in batch_segments(cfg)) // cfg.cluster.num_workers


def resolve(cfg: Config, upper: Optional[int] = None, one_run: bool = True) -> None:
    """Replace `auto` in cfg by the largest micro-batch that fits (cached per shape); a no-op for a
    given b. `upper`: the most any run of this shape needs (default: this run's per-worker share).
    ConfigError when not even one sequence fits. A new answer is printed; for `one_run` (not a
    sweep's shapes) with the split this run trains with, which the update's sequences per worker
    and B_simple's two micro-batches can make smaller than what fits."""
    if cfg.batch.micro_batch_size != AUTO:
        return
    upper = max(upper or 0, per_worker_share(cfg))
    where = _cache_file(cfg)
    answer = storage.read_json(where)
    # An answer capped by a smaller search than this run needs says nothing beyond its cap.
    probed = not answer or (answer["micro_batch_size"] >= answer["searched_up_to"] and upper > answer["searched_up_to"])
    if probed:
        answer = {**_find(cfg, upper), "searched_up_to": upper, "shape": shape(cfg)}
        storage.write_json(where, answer)
    cfg.batch.micro_batch_size = fitting(cfg, answer["micro_batch_size"], answer["capacity_bytes"], answer["device"])
    plan = batch_plan(cfg)  # with batch.grad_accum_steps given, the b it implies must fit
    if probed:
        found = f"up to {answer['micro_batch_size']} fit ({answer['method']}, {answer['device']}); kept in {where}"
        trains = f"; this run trains with b = {plan.micro_batch_size} x A = {plan.grad_accum_steps}" if one_run else ""
        print(f"batch.micro_batch_size auto: {found}{trains}")


def resolve_all(configs: Iterable[Config]) -> None:
    """Resolve every config, probing each distinct shape once with the largest share any needs."""
    keyed = [(c, _cache_file(c)) for c in configs if c.batch.micro_batch_size == AUTO]
    uppers: Dict[str, int] = {}
    for c, key in keyed:
        uppers[key] = max(uppers.get(key, 0), per_worker_share(c))
    for c, key in keyed:
        resolve(c, uppers[key], one_run=False)


def _find(cfg: Config, upper: int) -> Dict[str, Any]:
    fake = os.environ.get(DEVICE_MEMORY_ENV)
    if cfg.cluster.use_gpu or fake:
        capacity = memory.parse_bytes(fake, DEVICE_MEMORY_ENV) if fake else None
        return _probe_on_worker(cfg, upper, capacity)
    capacity = cpu_worker_memory(cfg)
    return {**from_model(cfg, capacity, upper), "device": "cpu"}


def cpu_worker_memory(cfg: Config) -> float:
    """A CPU worker's share of this node's memory: its share of the node's CPUs."""
    import psutil

    share = min(1.0, cfg.cluster.cpus_per_worker / (os.cpu_count() or 1))
    return psutil.virtual_memory().total * share


def fitting(cfg: Config, b: int, capacity: float, device: str) -> int:
    """`auto`'s answer b, or ConfigError when not even one sequence fits: `train`, `sweep`,
    `plan` and `--dry-run` refuse alike."""
    if b < 1:
        raise ConfigError(
            "batch.micro_batch_size",
            f"auto: not even one sequence of data.seq_len={cfg.data.seq_len} fits the "
            f"{memory.format_bytes(capacity)} of {device}; shorten data.seq_len, raise deepspeed.zero_stage "
            "or add workers",
        )
    return b


def from_model(cfg: Config, capacity: float, upper: int) -> Dict[str, Any]:
    """The memory model's answer (plan, dry-run, CPU): the largest b it predicts to fit."""
    predicted = predict(cfg, 0)
    if predicted is None:
        raise ConfigError(
            "batch.micro_batch_size", f"auto: workload {cfg.model.name!r} states no costs(cfg); give a number"
        )
    fixed, costs = predicted
    b = memory.largest_micro_batch(fixed.total, costs.activation_bytes_per_sequence, capacity)
    return {"micro_batch_size": min(b, upper), "capacity_bytes": capacity, "method": "memory model"}


def predict(cfg: Config, micro_batch_size: int) -> Optional[Tuple[memory.MemoryEstimate, memory.ModelCosts]]:
    """The memory model's peak per worker at b = micro_batch_size, with the workload's costs
    (None when the workload states no costs)."""
    from workloads import workload

    costs = workload.costs(cfg)
    if costs is None:
        return None
    zero = ds_config.build(cfg, batch_plan(cfg), costs.params)["zero_optimization"]
    d, workers = cfg.deepspeed, cfg.cluster.num_workers
    adam = measures_adam_noise_scale(cfg)
    return memory.estimate(costs, micro_batch_size, zero["stage"], d.precision, workers, zero, adam), costs


def _probe_on_worker(cfg: Config, upper: int, capacity: Optional[float]) -> Dict[str, Any]:
    import ray

    from workloads.train.micro_batch_probe import probe

    resources = worker_resources(cfg)
    task = ray.remote(num_cpus=resources["CPU"], num_gpus=resources.get("GPU", 0), max_calls=1)(probe)
    return ray.get(task.remote(to_dict(cfg, redact=False), upper, capacity))
