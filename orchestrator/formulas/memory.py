"""Memory per worker of a training run, predicted before anything starts (pure arithmetic).

    memory per worker = model states + DeepSpeed's gradient bucket + activations of one micro-batch

Model states, in bytes per parameter P, are what DeepSpeed's optimizers hold at the peak of an
update (the end of a micro-batch's forward, when every activation is alive and the gradients of
the earlier micro-batches are too). Each stage keeps some of them whole on every worker
(`replicated`) and splits the rest over the D workers (`partitioned`):

    precision  stage  replicated             partitioned over D
    fp32       0      16 = w4 g4 adam8       0
    fp32       1       8 = w4 g4            12 = master4 adam8
    fp32       2       4 = w4               16 = g4 master4 adam8
    fp32       3       0                    20 = w4 g4 master4 adam8
    bf16/fp16  0       8 = w2 g2 + fp32 g4  12 = master4 adam8        (DeepSpeed's BF16_Optimizer)
    bf16/fp16  1       4 = w2 g2            12 = master4 adam8
    bf16/fp16  2       2 = w2               14 = g2 master4 adam8
    bf16/fp16  3       0                    20 = w2 g2 + fp32 g4 + master4 adam8

(w weights, g gradients, master the fp32 copy the optimizer updates, adam its two moments.) The
noise scale of the gradient as AdamW preconditions it (gns.adam) keeps a whole fp32 copy of
AdamW's denominator on every worker: 4 more bytes per parameter, replicated. ZeRO 1
to 3 also allocate one gradient bucket of `reduce_bucket_size` elements (two with overlap_comm at
ZeRO 1 and 2), which orchestrator/core/ds_config.py caps at the model's size.

Activations come from the workload (`activation_bytes`: for the GPT, workloads/builtin/gpt.py), for one
micro-batch of b sequences at the config's S and precision.

Assumptions: AdamW; no CPU or NVMe offload; DeepSpeed's default buffers apart from the bucket;
the CUDA context, cuBLAS workspaces and compiled kernels are not counted (max_memory_allocated
does not count them either). Checked on CPU in fp32 at ZeRO 0..3 with one worker against the
peak of live tensor bytes (tests/integration/test_memory_model.py, docs/benchmarks.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Optional

from orchestrator.formulas.errors import ConfigError

TOLERANCE = 0.15
"""How far the prediction may be from the measured peak (the goal, and what the tests allow)."""
HEADROOM = 0.10
"""Share of the device's memory `batch.micro_batch_size: auto` leaves free: allocator
fragmentation, the CUDA context and whatever the model above does not count."""
DEFAULT_BUCKET = 500_000_000  # DeepSpeed's reduce_bucket_size default, in elements

_STATE_BYTES = {  # (precision class, stage) -> (replicated, partitioned) bytes per parameter
    ("fp32", 0): (16, 0),
    ("fp32", 1): (8, 12),
    ("fp32", 2): (4, 16),
    ("fp32", 3): (0, 20),
    ("half", 0): (8, 12),
    ("half", 1): (4, 12),
    ("half", 2): (2, 14),
    ("half", 3): (0, 20),
}


@dataclass(frozen=True)
class ModelCosts:
    """What a workload costs, from its config alone (no model is built)."""

    params: int
    """Every parameter the optimizer holds (tied weights once)."""
    flops_per_token: float
    """Training FLOPs per token (forward + backward)."""
    activation_bytes_per_sequence: float
    """Bytes autograd keeps for one sequence of a micro-batch, at the config's S and precision."""
    compute_params: int = 0
    """The parameters that multiply every token, the N of 6 N D (embedding lookups left out, a
    tied output head once; 0: the workload does not say): the MLflow param `model.params`, which
    a ladder's laws use (docs/ladders.md)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak bytes of one worker, by part."""

    states: float
    """Weights, gradients and optimizer state held by this worker (and the noise scale's copy of
    AdamW's denominator, where it is measured)."""
    bucket: float
    """DeepSpeed's gradient reduction bucket (ZeRO 1..3)."""
    activations: float
    """Saved activations of one micro-batch."""

    @property
    def total(self) -> float:
        return self.states + self.bucket + self.activations


def _precision_class(precision: str) -> str:
    return "fp32" if precision == "fp32" else "half"


ADAM_PRECONDITIONER_BYTES = 4
"""Per parameter and worker: gns/b_simple_adam's fp32 copy of AdamW's 1 / (sqrt(v_hat) + eps)."""


def state_bytes_per_param(zero_stage: int, precision: str, num_workers: int, adam_noise_scale: bool = False) -> float:
    replicated, partitioned = _STATE_BYTES[(_precision_class(precision), zero_stage)]
    return replicated + partitioned / num_workers + (ADAM_PRECONDITIONER_BYTES if adam_noise_scale else 0)


def bucket_bytes(zero_stage: int, precision: str, zero_config: Optional[Dict[str, Any]] = None) -> float:
    """The gradient bucket DeepSpeed allocates at ZeRO 1..3 (`zero_config`: the DeepSpeed config's
    zero_optimization section, after the user's `deepspeed.extra`)."""
    if zero_stage == 0:
        return 0.0
    z = zero_config or {}
    elements = float(z.get("reduce_bucket_size", DEFAULT_BUCKET))
    buffers = 2 if zero_stage < 3 and z.get("overlap_comm", False) else 1  # ZeRO 3 keeps one either way
    return elements * (4 if precision == "fp32" else 2) * buffers


def estimate(
    costs: ModelCosts,
    micro_batch_size: int,
    zero_stage: int,
    precision: str,
    num_workers: int,
    zero_config: Optional[Dict[str, Any]] = None,
    adam_noise_scale: bool = False,
) -> MemoryEstimate:
    return MemoryEstimate(
        states=costs.params * state_bytes_per_param(zero_stage, precision, num_workers, adam_noise_scale),
        bucket=bucket_bytes(zero_stage, precision, zero_config),
        activations=costs.activation_bytes_per_sequence * micro_batch_size,
    )


def largest_micro_batch(fixed_bytes: float, bytes_per_sequence: float, capacity: float) -> int:
    """The largest b with fixed + b x per_sequence within capacity less the headroom (0: none fits)."""
    usable = capacity * (1 - HEADROOM) - fixed_bytes
    if usable < bytes_per_sequence:
        return 0
    return int(math.floor(usable / bytes_per_sequence))


_UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str, key: str = "--device-memory") -> int:
    """'80GiB', '141 GB', '2e9' -> bytes; a ConfigError naming `key` otherwise."""
    match = _SIZE.match(str(text))
    unit = match.group(2).upper() if match else None
    size = float(match.group(1)) * _UNITS[unit] if match and unit in _UNITS else math.nan
    if not 0 < size < 2**64:  # NaN and infinity fail too
        raise ConfigError(key, f"got {text!r}; use a positive size such as 80GiB, 141GB or 2e9 (bytes)")
    return int(size)


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"
