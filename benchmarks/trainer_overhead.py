"""Trainer overhead: tokens/s of the real worker path against a plain PyTorch loop.

    python benchmarks/trainer_overhead.py [--json PATH] [--pairs 3] [key=value ...]

Real path: `launch.train` (Ray Train TorchTrainer, 1 worker, DeepSpeed ZeRO as configured,
token-weighted accumulation, gradient-noise probe, batched MLflow logging, checkpoints).
Plain path: the same model (same seed), the same TokenDataset micro-batches, the same
token-weighted loss, torch AdamW with the same groups and gradient clipping, the same
evaluations, in this process, with torch threads = cluster.cpus_per_worker like the worker.
Runs are interleaved (plain, real, plain, real, ...) in one Ray session so that the machine's
background load hits both alike.

Throughput figures (tokens per second):
- steady: what the run logs as `perf/tokens_per_s`, one value per report window, read back from
  MLflow. A window ends at a report; windows that end at an evaluation include the evaluation
  (train_loop computes the window's elapsed time after evaluating) and the first window includes
  the first update's lazy set-up, so both are excluded; checkpoints fall between windows and
  never count. The plain loop is timed over exactly the same windows.
- train phase: all windows, evaluations included (checkpoints and start-up excluded).
- whole run: budget / wall time of the whole call (Ray Train start-up, DeepSpeed init, MLflow
  run, checkpoints, final plot for the real path; model build and evaluations for the plain one).
ratio = real / plain of the steady figure (geometric mean of the interleaved pairs).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")

DEFAULT_CONFIG = ROOT / "conf" / "train" / "tiny.yaml"
GOAL = 0.90


def machine() -> Dict[str, Any]:
    import platform

    import torch

    return {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0], "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def load_config(path: str, overrides: List[str], tmp: Path):
    from orchestrator import config, launch

    cfg = config.load(path, [f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"train.storage_path={tmp}/runs",
                             "tracking.experiment=bench-trainer-overhead", *overrides])
    launch.resolve_paths(cfg)
    launch.preflight(cfg)  # builds the token cache outside any timing
    return cfg


# ---------------------------------------------------------------- the plain loop


def run_plain(cfg) -> Dict[str, Any]:
    """Same model, data, loss, optimizer, clipping and evaluations; no Ray, DeepSpeed or MLflow."""
    import torch

    from orchestrator import batching
    from orchestrator.config import batch_plan
    from orchestrator.schedules import lr_at
    from workloads import model as gpt
    from workloads.data import TokenDataset

    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(cfg.cluster.cpus_per_worker)))  # as train_worker does
    try:
        plan = batch_plan(cfg)
        steps = batching.total_steps(plan, cfg.train.total_tokens)
        budget = plan.tokens_for_steps(steps)
        torch.manual_seed(cfg.train.seed)
        model = gpt.GPT(cfg.model)
        train, held = TokenDataset(cfg, "train"), TokenDataset(cfg, "eval")
        o = cfg.optim
        opt = torch.optim.AdamW(gpt.param_groups(model, o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)

        def loss_of(batch):
            return gpt.token_losses(model(batch.inputs, batch.positions, batch.doc_ids), batch.targets, batch.loss_mask)

        @torch.no_grad()
        def evaluate() -> float:
            model.eval()
            total, count = 0.0, 0.0
            for batch in held.eval_batches(cfg.train.eval_tokens, plan.micro_batch_size):
                s, n = loss_of(batch)
                total, count = total + float(s), count + float(n)
            model.train()
            return total / max(count, 1.0)

        evaluate()
        windows: List[Dict[str, float]] = []
        tokens, window_start, window_tokens = 0, time.perf_counter(), 0
        for update in range(steps):
            before = tokens
            for group in opt.param_groups:
                group["lr"] = lr_at(before + plan.tokens_per_update, peak=o.lr, total_tokens=budget,
                                    warmup_tokens=cfg.schedule.warmup_tokens, decay=cfg.schedule.decay,
                                    min_lr_ratio=cfg.schedule.min_lr_ratio, wsd_decay_share=cfg.schedule.wsd_decay_share)
            batches = [train.micro_batch(update, plan, 0, a) for a in range(plan.grad_accum_steps)]
            real = max(sum(b.real_tokens for b in batches), 1)  # token-weighted, as DESIGN.md 4.2
            for batch in batches:
                summed, _ = loss_of(batch)
                (summed / real).backward()
                float(summed.detach())
            if o.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            tokens += plan.tokens_per_update
            window_tokens += plan.tokens_per_update
            last = update + 1 == steps
            evaluated = _due(before, tokens, cfg.train.eval_every_tokens) or last
            if evaluated:
                evaluate()
            if _due(before, tokens, cfg.train.report_every_tokens) or evaluated:
                now = time.perf_counter()
                windows.append({"step": tokens, "tokens": window_tokens, "seconds": now - window_start, "eval": evaluated})
                window_start, window_tokens = time.perf_counter(), 0
    finally:
        torch.set_num_threads(threads)
    return {"windows": windows, "wall_s": time.perf_counter() - started, "budget": budget}


def _due(before: int, after: int, every: int) -> bool:
    return every > 0 and after // every > before // every


# ---------------------------------------------------------------- the real path


def run_real(cfg, name: str) -> Dict[str, Any]:
    """launch.train on Ray Train; the windows are read back from what the run logged to MLflow."""
    import copy

    from orchestrator import batching, launch, tracking
    from orchestrator.config import batch_plan

    cfg = copy.deepcopy(cfg)
    cfg.train.run_name = name
    out = io.StringIO()
    started, wall_clock = time.perf_counter(), time.time()
    with contextlib.redirect_stdout(out):
        code = launch.train(cfg)
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"real run {name} failed (exit {code}):\n{out.getvalue()[-3000:]}")
    record = Path(cfg.train.storage_path) / name / launch.RUN_RECORD
    run_id = json.loads(record.read_text())["mlflow_run_id"]
    client = tracking.client(cfg.tracking.uri)
    speed = sorted(client.get_metric_history(run_id, "perf/tokens_per_s"), key=lambda m: m.step)
    evals = {m.step for m in client.get_metric_history(run_id, "eval/loss")}
    windows, previous = [], 0
    for m in speed:
        tokens = m.step - previous
        windows.append({"step": m.step, "tokens": tokens, "seconds": tokens / m.value, "eval": m.step in evals,
                        "logged_at": m.timestamp / 1000.0})
        previous = m.step
    # Where the rest of the wall time went (metric timestamps are wall-clock times of log()).
    first_start = windows[0]["logged_at"] - windows[0]["seconds"]
    covered = sum(w["seconds"] for w in windows)
    between = (windows[-1]["logged_at"] - first_start) - covered  # checkpoints + Ray reports
    plan = batch_plan(cfg)
    budget = plan.tokens_for_steps(batching.total_steps(plan, cfg.train.total_tokens))
    return {"windows": windows, "wall_s": wall, "budget": budget, "run_id": run_id,
            "startup_s": first_start - wall_clock, "between_windows_s": between,
            "teardown_s": wall_clock + wall - windows[-1]["logged_at"]}


# ---------------------------------------------------------------- summary


def throughput(windows: List[Dict[str, float]], steady: bool) -> float:
    chosen = [w for i, w in enumerate(windows) if not steady or (i > 0 and not w["eval"])]
    return sum(w["tokens"] for w in chosen) / sum(w["seconds"] for w in chosen)


def figures(run: Dict[str, Any]) -> Dict[str, float]:
    steady = [w["tokens"] / w["seconds"] for i, w in enumerate(run["windows"]) if i > 0 and not w["eval"]]
    evals = [w["tokens"] / w["seconds"] for i, w in enumerate(run["windows"]) if i > 0 and w["eval"]]
    out = {"steady_tokens_per_s": throughput(run["windows"], True),
           "steady_median_window_tokens_per_s": statistics.median(steady),
           "train_phase_tokens_per_s": throughput(run["windows"], False),
           "whole_run_tokens_per_s": run["budget"] / run["wall_s"], "wall_s": run["wall_s"],
           "eval_window_tokens_per_s": statistics.mean(evals) if evals else float("nan"),
           "first_window_tokens_per_s": run["windows"][0]["tokens"] / run["windows"][0]["seconds"]}
    for k in ("startup_s", "between_windows_s", "teardown_s", "run_id"):
        if k in run:
            out[k] = run[k]
    out["windows"] = [[w["step"], round(w["seconds"], 4), int(w["eval"])] for w in run["windows"]]  # [tokens, s, eval]
    return out


def geomean(xs: List[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (OmegaConf dotlist)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="train config (default conf/train/tiny.yaml)")
    p.add_argument("--pairs", type=int, default=3, help="interleaved (plain, real) pairs")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--keep", action="store_true", help="keep the temporary MLflow store and runs")
    args = p.parse_args(argv)

    from orchestrator import launch
    from orchestrator.config import batch_plan

    tmp = Path(tempfile.mkdtemp(prefix="bench-trainer-"))
    cfg = load_config(args.config, args.overrides, tmp)
    plan = batch_plan(cfg)
    load_before = os.getloadavg()[0]
    launch.ray_init(cfg.cluster.address)  # once, before the first plain run: same background for both
    plain, real = [], []
    for i in range(args.pairs):
        plain.append(figures(run_plain(cfg)))
        print(f"pair {i + 1}: plain {plain[-1]['steady_tokens_per_s']:,.0f} tok/s", flush=True)
        real.append(figures(run_real(cfg, f"real-{i}")))
        print(f"pair {i + 1}: real  {real[-1]['steady_tokens_per_s']:,.0f} tok/s", flush=True)

    ratios = {k: [r[k] / q[k] for q, r in zip(plain, real)]
              for k in ("steady_tokens_per_s", "train_phase_tokens_per_s", "whole_run_tokens_per_s")}
    result = {
        "benchmark": "trainer_overhead",
        "ratio": geomean(ratios["steady_tokens_per_s"]),
        "ratio_pairs": ratios["steady_tokens_per_s"],
        "ratio_train_phase": geomean(ratios["train_phase_tokens_per_s"]),
        "ratio_whole_run": geomean(ratios["whole_run_tokens_per_s"]),
        "goal": f"ratio >= {GOAL}",
        "plain": plain, "real": real,
        "config": {"file": os.path.relpath(args.config, ROOT), "overrides": args.overrides, "seq_len": cfg.data.seq_len,
                   "micro_batch_size": plan.micro_batch_size, "grad_accum_steps": plan.grad_accum_steps,
                   "tokens_per_update": plan.tokens_per_update, "total_tokens": cfg.train.total_tokens,
                   "zero_stage": cfg.deepspeed.zero_stage, "gns": cfg.gns.enabled,
                   "torch_threads": max(1, int(cfg.cluster.cpus_per_worker)),
                   "model": {"n_layers": cfg.model.n_layers, "d_model": cfg.model.d_model, "n_heads": cfg.model.n_heads}},
        "machine": {**machine(), "load_avg_1m_before": load_before},
    }
    rows = [("tokens/s", "plain", "real", "real/plain")]
    for key, label in (("steady_tokens_per_s", "steady (perf/tokens_per_s windows)"),
                       ("steady_median_window_tokens_per_s", "steady, median window"),
                       ("train_phase_tokens_per_s", "train phase (evals in)"),
                       ("whole_run_tokens_per_s", "whole run (start-up in)")):
        a, b = statistics.mean(x[key] for x in plain), statistics.mean(x[key] for x in real)
        rows.append((label, f"{a:,.0f}", f"{b:,.0f}", f"{b / a:.3f}"))
    width = [max(len(r[i]) for r in rows) for i in range(4)]
    print()
    for r in rows:
        print("  ".join(c.ljust(width[0]) if i == 0 else c.rjust(width[i]) for i, c in enumerate(r)))
    r0 = real[-1]
    print(f"\nreal run wall {statistics.mean(x['wall_s'] for x in real):.1f} s: start-up to first window "
          f"{statistics.mean(x['startup_s'] for x in real):.1f} s, checkpoints/reports between windows "
          f"{statistics.mean(x['between_windows_s'] for x in real):.1f} s, teardown {statistics.mean(x['teardown_s'] for x in real):.1f} s")
    print(f"perf/tokens_per_s in windows that end at an evaluation: {r0['eval_window_tokens_per_s']:,.0f} "
          f"(steady {r0['steady_tokens_per_s']:,.0f}); first window: {r0['first_window_tokens_per_s']:,.0f}")
    verdict = "meets" if result["ratio"] >= GOAL else "misses"
    print(f"ratio (steady, real/plain) = {result['ratio']:.3f}  pairs {', '.join(f'{x:.3f}' for x in result['ratio_pairs'])}  "
          f"-> {verdict} the goal >= {GOAL}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.json}")
    import ray

    ray.shutdown()
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
