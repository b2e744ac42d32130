"""Gradient-noise-scale overhead: tokens/s of the trainer's update with gns.enabled on against off.

    python benchmarks/gns_overhead.py [--json PATH] [--seconds 90] [key=value ...]

What it runs: the worker's own update, `workloads.train.engine.train_update`, on the engine that
`train_worker` builds (the workload of the config, default conf/train/tiny.yaml: the tiny GPT on
the built-in corpus; AdamW through DeepSpeed at the configured ZeRO stage, token-weighted
accumulation), in this process as a DeepSpeed world of one (gloo), with torch threads =
cluster.cpus_per_worker as in a Ray Train worker. "On" = what train_worker does with
gns.enabled: a GradNormProbe on the model's parameters (a hook per parameter, one host sync per
micro-batch), passed to train_update, and the EMA update of noise.estimate after it; with AdamW
(and gns.adam, the default) also the noise scale of the preconditioned gradient: the probe's
AdamPreconditioner, refreshed from AdamW's state once per update (a whole fp32 copy of its
denominator), the preconditioned norms in the same hooks and at the boundary, and its EMA.
`gns.adam=false` measures B_simple alone. "Off" = no probe at all (its hooks removed). Ray,
MLflow and checkpoints are left out: they cost the same either way and only dilute the
difference, so the figure is a lower bound of the full run's.

Measurement: periods of a few updates alternate on/off in ABBA order (on, off, off, on, ...),
so drifts of the machine's load cancel; the same micro-batches are replayed in every period,
so both sides see the same data. Time is process CPU time (all threads): on a shared machine
the wall clock of one update varies by tens of percent with other people's load, its CPU time
by a few percent. Wall-clock figures are printed too, and the probe's own CPU time (its hooks
and read-out, timed inside them) as a share of the "on" updates: the direct cost without the
noise of a difference.

ratio = tokens/s on / tokens/s off (CPU time). Goal: ratio >= 0.97.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import List

from orchestrator.core import derived

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402

DEFAULT_CONFIG = ROOT / "conf" / "train" / "tiny.yaml"
GOAL = 0.97
UPDATES_PER_PERIOD = 2
DATA_UPDATES = 8  # distinct global batches, replayed


class Spent:
    """Thread CPU seconds of the probe's own work: hooks and read-out (`probe`), and the Adam
    preconditioner's refresh and boundary norm (`adam`)."""

    probe = 0.0
    adam = 0.0


def timed(method, bucket: str):
    """`method`, adding the thread CPU time of each call to Spent.<bucket>: the probe's direct
    cost, a low-noise figure next to the on/off ratio (the timer itself costs about a
    microsecond per call, charged to the "on" side)."""

    def wrapper(*args, **kwargs):
        t = time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            setattr(Spent, bucket, getattr(Spent, bucket) + time.thread_time() - t)

    return wrapper


def timed_probe_class():
    """GradNormProbe whose hooks and read-out are timed (Spent.probe)."""
    from workloads.train.gns_probe import GradNormProbe

    class TimedProbe(GradNormProbe):
        def _hook_for(self, index: int):
            return timed(super()._hook_for(index), "probe")

        def squared_norms(self):
            return timed(super().squared_norms, "probe")()

    return TimedProbe


def timed_preconditioner(engine, params):
    """The AdamPreconditioner train_worker keeps, its refresh and boundary norm timed (Spent.adam)."""
    from workloads.train.adam_precondition import AdamPreconditioner

    adam = AdamPreconditioner(engine, params)
    adam.refresh = timed(adam.refresh, "adam")
    adam.update_sq_norm = timed(adam.update_sq_norm, "adam")
    return adam


class ReplayedData:
    """The workload's first DATA_UPDATES updates, built once: update u reads update u % N, so
    the data pipeline is outside the timing and on and off periods see the same batches."""

    def __init__(self, work, plan):
        self.work, self.n = work, plan.sequences_per_update
        self._batches = {
            (u, a): work.micro_batch(u * self.n, plan, 0, a)
            for u in range(DATA_UPDATES)
            for a in range(plan.grad_accum_steps)
        }

    def micro_batch(self, first: int, plan, rank: int, accum_step: int):
        return self._batches[(first // self.n % DATA_UPDATES, accum_step)]

    def __getattr__(self, name):  # summed_loss, source_names, ...
        return getattr(self.work, name)


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (OmegaConf dotlist)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="train config (default conf/train/tiny.yaml)")
    p.add_argument("--seconds", type=float, default=90.0, help="wall-clock length of the interleaved phase")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)

    os.environ.setdefault("ORCHESTRATOR_CACHE_DIR", str(Path(".cache/tokens").resolve()))
    import torch

    from orchestrator.core import config
    from orchestrator.formulas import noise
    from workloads import workload as workloads
    from workloads.train.engine import build_engine, ensure_process_group, train_update

    cfg = config.load(args.config, [*args.overrides, "cluster.num_workers=1"])
    plan = derived.batch_plan(cfg)
    if plan.micro_batches_per_update < 2:
        raise SystemExit(
            f"D x A = {plan.micro_batches_per_update}: the trainer measures no noise scale; use a config with A >= 2"
        )
    ensure_process_group(cfg)  # a DeepSpeed world of one, as in Ray Train's local mode
    torch.set_num_threads(max(1, int(cfg.cluster.cpus_per_worker)))
    work = workloads.build(cfg, plan, torch.device("cpu"))
    engine = build_engine(cfg, plan, work)
    data = ReplayedData(work, plan)
    gns = noise.NoiseScaleEMA(derived.gns_ema_tokens(cfg))
    gns_adam = noise.NoiseScaleEMA(derived.gns_ema_tokens(cfg))
    naive = cfg.train.loss_normalization == "micro_batch"
    Probe = timed_probe_class()
    params = [p for p in work.model.parameters() if p.requires_grad]
    adam = timed_preconditioner(engine, params) if derived.measures_adam_noise_scale(cfg) else None

    update = 0

    def run_period(on: bool) -> None:
        nonlocal update
        probe = Probe(work.model) if on else None
        if probe:
            probe.adam = adam
        for _ in range(UPDATES_PER_PERIOD):
            stats = train_update(engine, data, plan, update * plan.sequences_per_update, 0, probe, naive)
            if probe:  # what train_worker does after each update
                b_big, b_small = stats.real_tokens, stats.real_tokens / plan.micro_batches_per_update
                gns.update(*noise.estimate(stats.small_sq_mean, b_small, stats.grad_norm**2, b_big), tokens=b_big)
                if adam:
                    gns_adam.update(
                        *noise.estimate(stats.small_sq_mean_adam, b_small, stats.big_sq_adam, b_big), tokens=b_big
                    )
            update += 1
        if probe:
            probe.remove()

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    run_period(True)  # warm-up: allocator, autograd caches, DeepSpeed's lazy set-up
    run_period(False)
    Spent.probe = Spent.adam = 0.0
    periods = common.abba(run_period, args.seconds)

    on_p = [q for q in periods if q["on"]]
    measured = common.on_off(periods, UPDATES_PER_PERIOD * plan.tokens_per_update)  # seconds per token
    cpu = {side: 1 / s for side, s in measured.cpu_s.items()}  # tokens per second
    wall = {side: 1 / s for side, s in measured.wall_s.items()}
    group_ratios = [1 / r for r in measured.group_ratios]  # tokens/s on/off = CPU off/on
    result = {
        "benchmark": "gns_overhead",
        "measures": (
            "tokens/s of workloads.train.engine.train_update (DeepSpeed engine, one process), GNS probe on vs off"
        ),
        "ratio": cpu["on"] / cpu["off"],
        "ratio_wall": wall["on"] / wall["off"],
        "ratio_median_abba_group": statistics.median(group_ratios),
        "goal": f"ratio >= {GOAL}",
        "probe_share_of_on_cpu": (Spent.probe + Spent.adam) / sum(q["cpu_s"] for q in on_p),
        "probe_cpu_ms_per_update": 1000 * Spent.probe / (len(on_p) * UPDATES_PER_PERIOD),
        "adam_refresh_cpu_ms_per_update": 1000 * Spent.adam / (len(on_p) * UPDATES_PER_PERIOD),
        "adam_preconditioner_bytes": adam.nbytes if adam else 0,
        "tokens_per_cpu_s": cpu,
        "tokens_per_wall_s": wall,
        "updates": {"on": len(on_p) * UPDATES_PER_PERIOD, "off": (len(periods) - len(on_p)) * UPDATES_PER_PERIOD},
        "b_simple_after_run": gns.b_simple,
        "b_simple_adam_after_run": gns_adam.b_simple if adam else None,
        "wall_s": time.perf_counter() - started,
        "config": {
            "file": os.path.relpath(args.config, ROOT),
            "overrides": args.overrides,
            "model": cfg.model.name,
            "seq_len": plan.seq_len,
            "micro_batch_size": plan.micro_batch_size,
            "grad_accum_steps": plan.grad_accum_steps,
            "tokens_per_update": plan.tokens_per_update,
            "zero_stage": cfg.deepspeed.zero_stage,
            "precision": cfg.deepspeed.precision,
            "gns_adam": adam is not None,
            "torch_threads": torch.get_num_threads(),
            "parameters": sum(p.numel() for p in work.model.parameters()),
        },
        "machine": common.machine(load_before),
    }
    rows = [
        ("per CPU second", cpu, result["ratio"]),
        ("per wall second", wall, result["ratio_wall"]),
        ("CPU, median of ABBA groups", None, result["ratio_median_abba_group"]),
        ("1 - probe's own CPU share", None, 1 - result["probe_share_of_on_cpu"]),
    ]
    adam_note = (
        f"; with AdamW's preconditioner ({result['adam_preconditioner_bytes'] / 1e6:.2f} MB, refreshed and read at "
        f"the boundary in {result['adam_refresh_cpu_ms_per_update']:.2f} ms CPU per update; B_simple_adam at the end "
        f"{result['b_simple_adam_after_run'] or float('nan'):.0f})"
        if adam
        else " (B_simple alone: gns.adam off or SGD)"
    )
    common.print_ratio_table("tokens/s", rows, ",.0f")
    print(
        f"\n{result['updates']['on']} updates on, {result['updates']['off']} off, "
        f"{plan.tokens_per_update:,} tokens each "
        f"(b={plan.micro_batch_size} x A={plan.grad_accum_steps} micro-batches, ZeRO {cfg.deepspeed.zero_stage}); "
        f"B_simple at the end {result['b_simple_after_run'] or float('nan'):.0f} tokens; "
        "the probe's hooks and read-out "
        f"took {result['probe_cpu_ms_per_update']:.2f} ms CPU per update{adam_note}"
    )
    common.print_verdict("tokens/s per CPU second, on/off", result, result["ratio"] >= GOAL, f">= {GOAL}", load_before)
    return common.finish(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
