"""Tracking overhead: update time with MetricLogger on against off, interleaved.

    python benchmarks/tracking_overhead.py [--json PATH] [--seconds 90] [key=value ...]

The update: the tiny GPT of workloads/builtin/gpt.py as conf/train/tiny.yaml configures it (plus any
overrides), A micro-batches of b x S bytes with the token-weighted loss, backward, AdamW step,
torch threads = cluster.cpus_per_worker, as in a Ray Train worker. No Ray, no DeepSpeed: the
plainer the step, the larger tracking's share of it, so the figure is an upper bound.

Tracking on: a MetricLogger on an embedded SQLite store (the default store) receives, as
train_loop.py logs them, the update's train/loss, train/lr and train/grad_norm after every
update, and the report (5 train/perf/data metrics, perf/mfu being NaN on CPU, plus the 3 source
shares) every `train.report_every_tokens`; its points are sent
every `tracking.flush_every_s` seconds of "on" CPU time (what that many wall-clock seconds
are on an idle machine). The send runs synchronously inside the "on" period that triggers it,
on the training thread; the trainer sends from a background thread: an upper bound.

Report periods (the updates between two reports) alternate on/off in ABBA order (on, off,
off, on, ...), so drifts of the machine's load cancel. Time is process CPU time (all threads,
so a send's CPU counts wherever it runs): on a shared machine the wall clock of one update
varies by tens of percent with other people's load, its CPU time by about 2%. Wall-clock
figures are printed too.

ratio = CPU time per "on" update / CPU time per "off" update. Goal: ratio <= 1.01.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from orchestrator.core import derived

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402

DEFAULT_CONFIG = ROOT / "conf" / "train" / "tiny.yaml"
GOAL = 1.01


def build(cfg):
    import torch

    from orchestrator.core.derived import batch_plan
    from workloads.builtin import gpt as model_lib

    plan = batch_plan(cfg)
    torch.manual_seed(cfg.train.seed)
    torch.set_num_threads(max(1, int(cfg.cluster.cpus_per_worker)))
    net = model_lib.GPT(cfg.model)
    constants = derived.adamw_constants(cfg)  # as the trainer resolves them
    opt = torch.optim.AdamW(
        model_lib.param_groups(net, constants.weight_decay), lr=cfg.optim.lr, betas=(cfg.optim.beta1, constants.beta2)
    )
    b, S = plan.micro_batch_size, plan.seq_len
    # Byte batches: random bytes, two documents per sequence (the mask is block-diagonal).
    batches = []
    for _ in range(plan.grad_accum_steps):
        tokens = torch.randint(0, 256, (b, S + 1))
        doc_ids = (torch.arange(S) >= S // 2).long().expand(b, S)
        positions = torch.where(doc_ids == 0, torch.arange(S), torch.arange(S) - S // 2)
        batches.append((tokens[:, :-1], tokens[:, 1:], positions, doc_ids, torch.ones(b, S)))

    def update() -> float:
        real = sum(float(m.sum()) for *_, m in batches)
        total = 0.0
        for inputs, targets, positions, doc_ids, mask in batches:
            summed, _ = model_lib.token_losses(net(inputs, positions, doc_ids), targets, mask)
            (summed / real).backward()
            total += float(summed.detach())
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total / real

    return plan, update


def update_metrics(loss: float) -> Dict[str, float]:
    """What train_loop.py logs after every update."""
    return {"train/loss": loss, "train/lr": 3e-3, "train/grad_norm": 0.5}


def report(update: int, tokens: int, sources: List[str]) -> Dict[str, float]:
    """What train_loop.py logs at a report (perf/mfu is NaN on CPU and dropped by log())."""
    metrics = {
        "train/optimizer_step": update,
        "train/tokens": tokens,
        "perf/tokens_per_s": 12345.0,
        "perf/mfu": float("nan"),
        "data/packing_efficiency": 0.98,
    }
    metrics.update({f"data/share/{s}": 1 / len(sources) for s in sources})
    return metrics


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (OmegaConf dotlist)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="train config (default conf/train/tiny.yaml)")
    p.add_argument("--seconds", type=float, default=90.0, help="wall-clock length of the interleaved phase")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)

    from orchestrator.core import config
    from orchestrator.tracking import metric_logger
    from orchestrator.tracking.store import Store

    cfg = config.load(args.config, args.overrides)
    plan, update = build(cfg)
    every = max(1, cfg.train.report_every_tokens // plan.tokens_per_update)  # updates per report
    sources = [s.name for s in cfg.data.sources]
    tmp = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    uri = f"sqlite:///{tmp}/mlflow.db"
    run_id = Store(uri, "bench").create_run("tracking-overhead")
    # The sender thread never wakes by itself: sends happen where the loop below asks, so
    # that their cost lands in "on" periods.
    logger = metric_logger.MetricLogger(uri, run_id, flush_every_s=3600)

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    for _ in range(3):  # warm-up: allocator, autograd caches
        update()
    u, on_since_send, sends = 0, 0.0, []

    def run_period(on: bool) -> Dict[str, float]:
        nonlocal u, on_since_send
        cpu = time.process_time()
        log_s = send_s = 0.0
        for _ in range(every):
            loss = update()
            u += 1
            if on:
                t = time.perf_counter()
                logger.log(update_metrics(loss), u * plan.tokens_per_update)
                log_s += time.perf_counter() - t
        if on:
            t = time.perf_counter()
            logger.log(report(u, u * plan.tokens_per_update, sources), u * plan.tokens_per_update)
            log_s += time.perf_counter() - t
            log_cpu = time.process_time()
            on_since_send += log_cpu - cpu
            if on_since_send >= cfg.tracking.flush_every_s:
                t = time.perf_counter()
                assert logger.flush(timeout_s=60), logger.last_error
                send_s, send_cpu, on_since_send = time.perf_counter() - t, time.process_time() - log_cpu, 0.0
                sends.append({"wall_s": send_s, "cpu_s": send_cpu})
        return {"log_s": log_s, "send_s": send_s}

    periods = common.abba(run_period, args.seconds)
    t = time.perf_counter()
    logger.close(timeout_s=60)
    last_send = time.perf_counter() - t

    on_p = [q for q in periods if q["on"]]
    measured = common.on_off(periods, every)  # seconds per update
    cpu, wall = measured.cpu_s, measured.wall_s
    result = {
        "benchmark": "tracking_overhead",
        "ratio": cpu["on"] / cpu["off"],
        "ratio_wall": wall["on"] / wall["off"],
        "ratio_median_abba_group": statistics.median(measured.group_ratios),
        "ratio_from_tracking_wall_time": 1
        + sum(q["log_s"] + q["send_s"] for q in on_p) / sum(q["cpu_s"] for q in on_p),
        "goal": f"ratio <= {GOAL}",
        "update_cpu_ms": {side: 1000 * s for side, s in cpu.items()},
        "update_wall_ms": {side: 1000 * s for side, s in wall.items()},
        "log_us_per_report_median_wall": 1e6 * statistics.median(q["log_s"] for q in on_p),
        "send_ms": {
            "wall_median": 1000 * statistics.median(x["wall_s"] for x in sends) if sends else None,
            "cpu_median": 1000 * statistics.median(x["cpu_s"] for x in sends) if sends else None,
        },
        "sends": len(sends),
        "final_send_ms": 1000 * last_send,
        "updates": {"on": len(on_p) * every, "off": (len(periods) - len(on_p)) * every},
        "updates_per_report": every,
        "metrics_per_update": len(update_metrics(1.0)),
        "metrics_per_report": len([v for v in report(1, 1, sources).values() if v == v]),
        "points_sent": logger.sent_points,
        "wall_s": time.perf_counter() - started,
        "config": {
            "file": os.path.relpath(args.config, ROOT),
            "overrides": args.overrides,
            "seq_len": plan.seq_len,
            "micro_batch_size": plan.micro_batch_size,
            "grad_accum_steps": plan.grad_accum_steps,
            "tokens_per_update": plan.tokens_per_update,
            "report_every_tokens": cfg.train.report_every_tokens,
            "flush_every_s": cfg.tracking.flush_every_s,
            "torch_threads": max(1, int(cfg.cluster.cpus_per_worker)),
            "store": "sqlite (embedded)",
            "model": {"n_layers": cfg.model.n_layers, "d_model": cfg.model.d_model, "n_heads": cfg.model.n_heads},
        },
        "machine": common.machine(load_before),
    }
    rows = [
        ("CPU time, ms", result["update_cpu_ms"], result["ratio"]),
        ("wall clock, ms", result["update_wall_ms"], result["ratio_wall"]),
        ("CPU, median of ABBA groups", None, result["ratio_median_abba_group"]),
        ("tracking's own wall time", None, result["ratio_from_tracking_wall_time"]),
    ]
    common.print_ratio_table("per update", rows, ".2f")
    print(
        f"\n{result['updates']['on']} updates on, {result['updates']['off']} off; "
        f"{result['metrics_per_update']} metrics "
        f"every update and a report of {result['metrics_per_report']} every {every} updates: log() calls "
        f"{result['log_us_per_report_median_wall']:.0f} us per report period (median); "
        f"{len(sends)} sends of the buffered "
        f"points, median {result['send_ms']['wall_median'] or 0:.1f} ms wall, "
        f"{result['send_ms']['cpu_median'] or 0:.1f} ms CPU; {logger.sent_points:,} points"
    )
    common.print_verdict("CPU time per update, on/off", result, result["ratio"] <= GOAL, f"<= {GOAL}", load_before)
    return common.finish(result, args.json, tmp)


if __name__ == "__main__":
    raise SystemExit(main())
