"""`batch.micro_batch_size: auto` on the device itself: the largest b whose update fits.

`search` is the arithmetic: given `peak_at(b)` (the peak bytes of a run at b, or None when it ran
out of memory) it finds the largest b within the device's memory less the headroom. Memory grows
about linearly in b (fixed states + b x activations), so it measures b = 1 and 2, follows the
line through the measured peaks nearest the boundary to the b where it meets the limit, and
confirms that b and the one above it: four to six runs, where a bisection would take log2(upper).

`probe` runs it on this process's device, each b a fresh engine doing two optimizer updates (the
second holds the optimizer state the first created) of the real workload at the real S, ZeRO
stage and precision, in a world of one worker: under ZeRO 1..3 the states are then not split
over D, so the answer errs on the safe side. The model runs uncompiled; compiled, it needs less.
"""

from __future__ import annotations

import gc
from typing import Any, Callable, Dict, Optional

import torch

from orchestrator.core.config import from_dict, to_dict
from orchestrator.core.derived import batch_plan, measures_adam_noise_scale
from orchestrator.core.schema import AUTO, Config
from orchestrator.formulas.memory import HEADROOM


def search(peak_at: Callable[[int], Optional[float]], capacity: float, upper: int) -> int:
    """The largest b in 1..upper whose peak fits capacity less the headroom (0: not even one)."""
    usable = capacity * (1 - HEADROOM)
    peaks: Dict[int, Optional[float]] = {}

    def fits(b: int) -> bool:
        if b not in peaks:
            peaks[b] = peak_at(b)
        return peaks[b] is not None and peaks[b] <= usable

    if not fits(1):
        return 0
    if upper == 1 or not fits(2):
        return 1
    good, bad = 2, upper + 1  # good fits, bad does not (upper + 1: not tried)
    while bad - good > 1:
        # Where the line through the measured peaks around the boundary reaches `usable`.
        other = bad if peaks.get(bad) is not None else max(b for b in peaks if b < good and peaks[b] is not None)
        slope = max((peaks[other] - peaks[good]) / (other - good), 1.0)
        guess = min(bad - 1, max(good + 1, good + int((usable - peaks[good]) // slope)))
        if not fits(guess):
            bad = guess
            continue
        good = guess
        if good + 1 < bad and not fits(good + 1):  # the line is usually right: confirm the next
            bad = good + 1
    return good


def _config_at(cfg: Config, b: int) -> Config:
    """One worker accumulating two micro-batches of b sequences (so one micro-batch's forward
    meets the gradients of the one before, as in any run with A > 1), two updates, no probe."""
    data = to_dict(cfg, redact=False)
    tokens = 2 * cfg.data.seq_len * b
    data["cluster"]["num_workers"] = 1
    data["batch"].update(tokens_per_update=tokens, micro_batch_size=b, grad_accum_steps=2)
    data["train"]["total_tokens"] = 2 * tokens
    data["gns"]["enabled"] = False
    data["model"]["compile"] = False
    return from_dict(data)


def peak_at(cfg: Config, b: int, device: torch.device) -> Optional[float]:
    """Peak bytes of building the engine and two updates at b (None: out of memory), with the
    noise scale's copy of AdamW's denominator where the run keeps one."""
    from workloads import workload as workloads
    from workloads.train.adam_precondition import AdamPreconditioner
    from workloads.train.engine import build_engine, train_update
    from workloads.train.peak_memory import PeakMemory

    trial = _config_at(cfg, b)
    plan = batch_plan(trial)
    work = engine = copy = None
    try:
        with PeakMemory(device) as peak:
            work = workloads.build(trial, plan, device)
            engine = build_engine(trial, plan, work)
            if measures_adam_noise_scale(cfg):
                copy = AdamPreconditioner(engine, [p for p in work.model.parameters() if p.requires_grad])
            for update in range(2):
                train_update(engine, work, plan, update, 0, None)
        return float(peak.bytes)
    except torch.OutOfMemoryError:
        return None
    finally:
        del work, engine, copy
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def probe(config: Dict[str, Any], upper: int, capacity: Optional[float] = None) -> Dict[str, Any]:
    """Run `search` on this process's device (a Ray task holding one worker's resources, in a
    process of its own).
    capacity None: the GPU's total memory; on CPU it must be given."""
    from workloads.train.engine import ensure_process_group

    cfg = from_dict(config)
    assert cfg.batch.micro_batch_size == AUTO
    if cfg.cluster.use_gpu:
        device = torch.device("cuda", torch.cuda.current_device())
        name, total = torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory
    else:
        device, name, total = torch.device("cpu"), "cpu", None
    capacity = capacity or total
    assert capacity, "probing on CPU needs the memory to probe against"
    # A world of one that stays: DeepSpeed remembers its groups, and the Ray task's process exits
    # after this one call (max_calls=1), handing back the device whole.
    ensure_process_group(cfg)
    b = search(lambda b: peak_at(cfg, b, device), capacity, upper)
    return {"micro_batch_size": b, "device": name, "capacity_bytes": capacity, "method": "probe"}
