"""What a sweep will cost and when it will end: pure arithmetic (no Ray, MLflow or torch) for
`orchestrator sweep --dry-run` (orchestrator/driver/dry_run.py) and for the live table of a running
sweep (orchestrator/driver/progress_table.py).

Before a sweep (a model, stated in the output):

    tokens/s of a trial  = devices x peak FLOP/s x MFU / FLOPs per token
    wall of a trial      = start-up + tokens / (tokens/s)
    device-hours         = wall x devices held / 3600

where devices are the trial's GPUs (D x cluster.gpus_per_worker) or, on CPU, its torch threads
(D x max(1, int(cluster.cpus_per_worker)), as the worker sets them), and the hours count what Ray
holds (GPUs, or D x cluster.cpus_per_worker CPUs). A GPU has a peak; 40% of it is what gpt-350m
reached on one H200 (163k tokens/s, MFU 39.9%, with the trainer's DeepSpeed step). A CPU has no
meaningful peak, so a CPU's figure is an effective one, measured: the steady tokens/s of
conf/train/tiny.yaml on one CPU (docs/benchmarks.md, trainer_overhead) times its FLOPs per token,
at MFU 1. Evaluations and checkpoints are not counted.

The sweep's ETA is the makespan of list scheduling: the trials in order, each starting on the
first free slot of `search.max_concurrent` (what Tune does when the cluster fits that many).

While a sweep runs: a trial's rate is its tokens since its first result over the time since
then, its ETA its remaining tokens at that rate (`rate`, `eta_s`); the sweep's ETA is the pace
of the trials done so far, in wall time (`sweep_eta_s`; driver/progress_table.py).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

GPU_PEAK_FLOPS = 989e12
"""H100/H200 SXM bf16 dense peak, per GPU."""
GPU_MFU = 0.40
"""gpt-350m on one H200 with the trainer's DeepSpeed step: 39.9% (163k tokens/s)."""
GPU_STARTUP_S = 60.0
"""Per trial: Ray Train workers, DeepSpeed initialisation, torch.compile of the first update."""
CPU_MEASURED_TOKENS_PER_S = 21_391.0
"""Steady tokens/s of conf/train/tiny.yaml on 1 CPU through the real trainer (docs/benchmarks.md,
trainer_overhead, ZeRO 0)."""
CPU_MEASURED_FLOPS_PER_TOKEN = 2_953_728.0
"""tiny.yaml's training FLOPs per token (workloads.builtin.gpt.flops_per_token: 6N + 12 L H Q S)."""
CPU_FLOPS = CPU_MEASURED_TOKENS_PER_S * CPU_MEASURED_FLOPS_PER_TOKEN
"""Effective FLOP/s of one CPU thread (about 63 GFLOP/s): the measured figure, MFU 1."""
CPU_MFU = 1.0
"""CPU_FLOPS is already what a thread achieves."""
CPU_STARTUP_S = 15.0
"""Per trial on CPU: Tune trial and local-mode worker start-up (docs/sweeps.md, docs/benchmarks.md)."""


@dataclass(frozen=True)
class Throughput:
    """The assumption that turns FLOPs into seconds, for one kind of device."""

    kind: str
    """'GPU' or 'CPU': what a device is, and what the hours count."""
    peak_flops: float
    """FLOP/s of one device (GPU, or CPU thread) at MFU 1."""
    mfu: float
    """Share of peak_flops a trial achieves, in (0, 1]."""
    startup_s: float
    """Seconds before a trial's first update (not counted in its tokens/s)."""

    def tokens_per_s(self, devices: float, flops_per_token: float) -> float:
        """Tokens per second of a trial computing on `devices` devices."""
        return devices * self.peak_flops * self.mfu / flops_per_token


def throughput(
    use_gpu: bool, peak_flops: Optional[float] = None, mfu: Optional[float] = None, startup_s: Optional[float] = None
) -> Throughput:
    """The defaults for GPU or CPU trials, each overridden when given."""
    if use_gpu:
        defaults = ("GPU", GPU_PEAK_FLOPS, GPU_MFU, GPU_STARTUP_S)
    else:
        defaults = ("CPU", CPU_FLOPS, CPU_MFU, CPU_STARTUP_S)
    kind, peak, util, start = defaults
    return Throughput(
        kind,
        peak if peak_flops is None else peak_flops,
        util if mfu is None else mfu,
        start if startup_s is None else startup_s,
    )


@dataclass(frozen=True)
class TrialCost:
    """What one trial costs under a Throughput."""

    kind: str
    """'GPU' or 'CPU': what device_hours count."""
    tokens: int
    """Training tokens (the budget rounded down to whole updates)."""
    flops: Optional[float]
    """Training FLOPs (FLOPs per token x tokens); None when the workload states no costs."""
    tokens_per_s: Optional[float]
    """Predicted training throughput; None when unknown."""
    wall_s: Optional[float]
    """Start-up + training seconds; None when unknown."""
    device_hours: Optional[float]
    """wall x devices held / 3600 (GPU-hours or CPU-hours); None when unknown."""


def training_compute(params: float, tokens: float) -> float:
    """C = 6 N D: the training FLOPs of a dense model of N parameters on D tokens, the compute a
    ladder's rungs are ordered by and its laws extrapolate in."""
    return 6.0 * params * tokens


def decades_beyond(params: float, tokens: float, largest_compute: float) -> float:
    """How many decades of compute a run of N = params on D = tokens lies past `largest_compute`
    (a ladder's largest rung): how far its laws extrapolate."""
    return math.log10(training_compute(params, tokens) / largest_compute) if largest_compute > 0 else math.nan


def trial_cost(
    tokens: int,
    flops_per_token: Optional[float],
    devices: float,
    held: float,
    rate: Throughput,
) -> TrialCost:
    """A trial of `tokens` tokens computing on `devices` devices and holding `held` of them."""
    if flops_per_token is None:
        return TrialCost(rate.kind, tokens, None, None, None, None)
    tps = rate.tokens_per_s(devices, flops_per_token)
    wall = rate.startup_s + tokens / tps
    return TrialCost(rate.kind, tokens, flops_per_token * tokens, tps, wall, wall * held / 3600.0)


def list_schedule(durations: Sequence[float], slots: int) -> List[float]:
    """Start time of each job when the jobs, in order, each take the first slot to come free."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    free = [0.0] * min(slots, max(1, len(durations)))  # a heap of the times the slots come free
    starts = []
    for d in durations:
        start = heapq.heappop(free)
        starts.append(start)
        heapq.heappush(free, start + d)
    return starts


def makespan(durations: Sequence[float], slots: int) -> float:
    """When the last job of a list schedule ends (0 for no jobs)."""
    starts = list_schedule(durations, slots)
    return max((s + d for s, d in zip(starts, durations)), default=0.0)


@dataclass(frozen=True)
class SweepCost:
    """A sweep's totals over its trials."""

    trials: int
    """Trials counted."""
    flops: Optional[float]
    """Sum of their training FLOPs; None when any is unknown."""
    device_hours: Dict[str, float]
    """Sum of GPU-hours and of CPU-hours, by kind (trials of unknown cost left out)."""
    wall_s: Optional[float]
    """Sum of their wall times (what one slot would take); None when any is unknown."""
    eta_s: Optional[float]
    """Makespan of the list schedule on the sweep's concurrency; None when any wall is unknown."""
    unknown: int
    """Trials whose cost is unknown (a workload without costs)."""


def sweep_cost(costs: Sequence[TrialCost], slots: int) -> SweepCost:
    """Totals and ETA of trials run in order, `slots` at a time."""
    unknown = sum(c.wall_s is None for c in costs)
    hours: Dict[str, float] = {}
    for c in costs:
        if c.device_hours is not None:
            hours[c.kind] = hours.get(c.kind, 0.0) + c.device_hours
    known = not unknown
    return SweepCost(
        trials=len(costs),
        flops=sum(c.flops for c in costs) if known else None,  # type: ignore[misc]
        device_hours=hours,
        wall_s=sum(c.wall_s for c in costs) if known else None,  # type: ignore[misc]
        eta_s=makespan([c.wall_s for c in costs], slots) if known else None,  # type: ignore[misc]
        unknown=unknown,
    )


@dataclass(frozen=True)
class Span:
    """A low .. high range of one figure."""

    low: float
    """The smallest value."""
    high: float
    """The largest value."""


@dataclass(frozen=True)
class CostRange:
    """The cost of a sweep whose trials are not known in advance (Optuna), from the costs of the
    corners of its space: num_samples trials, each somewhere between the cheapest and the dearest."""

    num_samples: int
    """Trials the sweep will run."""
    kind: str
    """'GPU' or 'CPU': what the hours count."""
    trial_flops: Span
    """FLOPs of one trial."""
    trial_wall_s: Span
    """Wall seconds of one trial."""
    trial_device_hours: Span
    """Device-hours of one trial."""
    flops: Span
    """Of the whole sweep: num_samples x the per-trial range."""
    device_hours: Span
    """Of the whole sweep: num_samples x the per-trial range."""
    eta_s: Span
    """Makespan of num_samples trials all at the low, or all at the high, wall time. Any mix of
    trials within the per-trial range ends within it: some slot runs ceil(n / slots) trials,
    and no trial of a list schedule starts later than floor(i / slots) x the longest wall."""


def cost_range(corners: Sequence[TrialCost], num_samples: int, slots: int) -> Optional[CostRange]:
    """The range over corner trials of known cost (None when there is none)."""
    known = [c for c in corners if c.wall_s is not None]
    if not known:
        return None

    def span(values: Sequence[float], times: float = 1.0) -> Span:
        return Span(min(values) * times, max(values) * times)

    flops = [c.flops for c in known]
    walls = [c.wall_s for c in known]
    hours = [c.device_hours for c in known]
    per_trial_wall = span(walls)  # type: ignore[arg-type]
    return CostRange(
        num_samples=num_samples,
        kind=known[0].kind,
        trial_flops=span(flops),  # type: ignore[arg-type]
        trial_wall_s=per_trial_wall,
        trial_device_hours=span(hours),  # type: ignore[arg-type]
        flops=span(flops, num_samples),  # type: ignore[arg-type]
        device_hours=span(hours, num_samples),  # type: ignore[arg-type]
        eta_s=Span(
            makespan([per_trial_wall.low] * num_samples, slots),
            makespan([per_trial_wall.high] * num_samples, slots),
        ),
    )


# ---------------------------------------------------------------- while a sweep runs


def rate(first_tokens: float, first_s: float, tokens: float, now_s: float) -> Optional[float]:
    """Tokens per second since the first result (None until time and tokens have moved on)."""
    if now_s <= first_s or tokens <= first_tokens:
        return None
    return (tokens - first_tokens) / (now_s - first_s)


def eta_s(remaining_tokens: float, tokens_per_s: Optional[float]) -> Optional[float]:
    """Seconds to process the remaining tokens at a rate (0 when nothing remains, None without a rate)."""
    if remaining_tokens <= 0:
        return 0.0
    if not tokens_per_s or tokens_per_s <= 0:
        return None
    return remaining_tokens / tokens_per_s


def sweep_eta_s(
    elapsed_s: float, ended_walls_s: Sequence[float], running_for_s: Sequence[float], total: int
) -> Optional[float]:
    """Seconds until a sweep of `total` trials ends, at the pace of the trials done so far: the
    time since the first trial started over the trials done, times the trials left. A running
    trial counts as done by the share of an ended trial's mean wall time it has run (start-up and
    evaluations are in both); a trial early stopping cut short counts as one ended trial, so the
    pace carries the searcher's stopping. None until a trial has ended."""
    if not ended_walls_s or elapsed_s <= 0:
        return None
    mean_wall = sum(ended_walls_s) / len(ended_walls_s)
    done = len(ended_walls_s) + sum(min(1.0, r / mean_wall) for r in running_for_s if mean_wall > 0)
    return max(0.0, total - done) * elapsed_s / done


def format_duration(seconds: Optional[float]) -> str:
    """'45 s', '12m 05s', '3h 07m', '2d 04h'; '-' for None."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"
