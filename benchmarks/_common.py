"""What the benchmarks share: the machine's facts, ABBA interleaving, the printed table, the end."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


def machine(load_before: float) -> Dict[str, Any]:
    """Recorded with every figure: on a shared machine the load explains most of the spread."""
    import torch

    return {
        "cpus": os.cpu_count(),
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": os.getloadavg()[0],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def abba(
    run_period: Callable[[bool], Optional[Dict[str, Any]]], seconds: float, min_periods: int = 8
) -> List[Dict[str, Any]]:
    """Run periods on/off in ABBA order (on, off, off, on, ...) for at least `seconds`, whole
    groups of four only, so a load that drifts during the run hits both sides alike. Each
    period: `on`, its process CPU and wall seconds, plus whatever `run_period(on)` returns."""
    periods: List[Dict[str, Any]] = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or len(periods) < min_periods or len(periods) % 4:
        on = (len(periods) % 4) in (0, 3)
        wall, cpu = time.perf_counter(), time.process_time()
        extra = run_period(on) or {}
        periods.append({"on": on, "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall, **extra})
    return periods


def abba_group_ratios(periods: List[Dict[str, Any]], key: str = "cpu_s") -> List[float]:
    """on / off of `key`, per ABBA group."""
    groups = [periods[j : j + 4] for j in range(0, len(periods), 4)]
    return [sum(q[key] for q in g if q["on"]) / sum(q[key] for q in g if not q["on"]) for g in groups]


@dataclass(frozen=True)
class OnOff:
    """What ABBA periods measured, per unit of work (an update, a token): seconds "on" and "off"
    by process CPU time and by wall clock, and the CPU seconds on/off of each ABBA group."""

    cpu_s: Dict[str, float]
    wall_s: Dict[str, float]
    group_ratios: List[float]


def on_off(periods: List[Dict[str, Any]], units_per_period: float) -> OnOff:
    """Seconds per unit of the on and off periods (each period did `units_per_period` units)."""
    sides = {"on": [q for q in periods if q["on"]], "off": [q for q in periods if not q["on"]]}

    def per_unit(key: str) -> Dict[str, float]:
        return {side: sum(q[key] for q in ps) / (len(ps) * units_per_period) for side, ps in sides.items()}

    return OnOff(per_unit("cpu_s"), per_unit("wall_s"), abba_group_ratios(periods))


def print_ratio_table(header: str, rows: Sequence[Tuple[str, Dict[str, float], float]], cell: str) -> None:
    """The on/off table: `header` over off, on and on/off; each row (label, {'off', 'on'} figures
    formatted by `cell`, ratio) or (label, None, ratio) for a ratio alone."""
    table = [(header, "off", "on", "on/off")]
    for label, figures, ratio in rows:
        off, on = (format(figures["off"], cell), format(figures["on"], cell)) if figures else ("", "")
        table.append((label, off, on, f"{ratio:.4f}"))
    print_table(table)


def print_verdict(what: str, result: Dict[str, Any], meets: bool, goal: str, load_before: float) -> None:
    """The closing line: the ratio, whether it meets the goal, the wall-clock ratio and the load."""
    print(
        f"ratio ({what}) = {result['ratio']:.4f} -> {'meets' if meets else 'misses'} the goal {goal}  "
        f"(wall clock {result['ratio_wall']:.3f}; load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs)"
    )


class PlainLoop:
    """What a user would write instead of the trainer, the baseline of trainer_overhead.py and
    plain_tune.py: the trainer's model (same seed), TokenDataset micro-batches, token-weighted
    loss (docs/design.md 4.2), torch AdamW with the trainer's parameter groups and constants,
    its schedule, gradient clipping and evaluations; no Ray, DeepSpeed or MLflow. Torch's
    threads are the caller's to set."""

    def __init__(self, cfg) -> None:
        import torch

        from orchestrator.core import derived
        from orchestrator.formulas import batching
        from orchestrator.formulas.schedules import lr_at
        from workloads.builtin import gpt
        from workloads.text.packing import TokenDataset

        self.cfg, self.plan = cfg, derived.batch_plan(cfg)
        self.steps = batching.total_steps(self.plan, cfg.train.total_tokens)
        self.budget = self.plan.tokens_for_steps(self.steps)
        torch.manual_seed(cfg.train.seed)
        self.model = gpt.GPT(cfg.model)
        self._token_losses, self._lr_at = gpt.token_losses, lr_at  # looked up once, not per update
        self.train, self.held = TokenDataset(cfg, "train"), TokenDataset(cfg, "eval")
        o, constants = cfg.optim, derived.adamw_constants(cfg)  # as the trainer resolves them
        self.opt = torch.optim.AdamW(
            gpt.param_groups(self.model, constants.weight_decay), lr=o.lr, betas=(o.beta1, constants.beta2), eps=o.eps
        )

    def _loss_of(self, batch):
        logits = self.model(batch.inputs, batch.positions, batch.doc_ids)
        return self._token_losses(logits, batch.targets, batch.loss_mask)

    def evaluate(self) -> float:
        """Mean loss per real token of the held-out tokens (train.eval_tokens)."""
        import torch

        self.model.eval()
        total, count = 0.0, 0.0
        with torch.no_grad():
            for batch in self.held.eval_batches(self.cfg.train.eval_tokens, self.plan.micro_batch_size):
                s, n = self._loss_of(batch)
                total, count = total + float(s), count + float(n)
        self.model.train()
        return total / max(count, 1.0)

    def update(self, update: int, before: int) -> float:
        """Optimizer update number `update`, after `before` tokens: its mean loss per real token."""
        import torch

        cfg, plan, o = self.cfg, self.plan, self.cfg.optim
        for group in self.opt.param_groups:
            group["lr"] = self._lr_at(
                before + plan.tokens_per_update,
                peak=o.lr,
                total_tokens=self.budget,
                warmup_tokens=cfg.schedule.warmup_tokens,
                decay=cfg.schedule.decay,
                min_lr_ratio=cfg.schedule.min_lr_ratio,
                wsd_decay_share=cfg.schedule.wsd_decay_share,
            )
        batches = [
            self.train.micro_batch(update * plan.sequences_per_update, plan, 0, a) for a in range(plan.grad_accum_steps)
        ]
        real = max(sum(b.real_tokens for b in batches), 1)  # token-weighted, as docs/design.md 4.2
        loss = 0.0
        for batch in batches:
            summed, _ = self._loss_of(batch)
            (summed / real).backward()
            loss += float(summed.detach()) / real
        if o.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), o.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss


def due(before: int, after: int, every: int) -> bool:
    """Whether an event every `every` tokens (0: never) falls in (before, after]."""
    return every > 0 and after // every > before // every


def run_training(cfg) -> Dict[str, Any]:
    """`launch.train(cfg)` (cfg.train.run_name set) with its output held back, shown only if it
    fails: the MLflow `run_id`, `wall_s` of the call and `started_at` (wall-clock time)."""
    from orchestrator.driver import launch

    out = io.StringIO()
    started, started_at = time.perf_counter(), time.time()
    with contextlib.redirect_stdout(out):
        code = launch.train(cfg)
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"run {cfg.train.run_name} failed (exit {code}):\n{out.getvalue()[-3000:]}")
    run_id = launch.recorded_run_id(cfg.train.storage_path, cfg.train.run_name)
    return {"run_id": run_id, "wall_s": wall, "started_at": started_at}


def report_windows(uri: str, run_id: str) -> List[Dict[str, Any]]:
    """A training run's report windows, read back from what it logged to MLflow: each
    `perf/tokens_per_s` point covers the tokens since the previous point (`tokens`, `seconds`);
    `eval` marks windows that end at an evaluation; `logged_at` is the point's wall-clock time."""
    from orchestrator.tracking.store import Store

    store = Store(uri)
    evals = {step for step, _ in store.metric_history(run_id, "eval/loss")}
    windows, previous = [], 0
    for m in store.metric_points(run_id, "perf/tokens_per_s"):
        tokens = m.step - previous
        windows.append(
            {
                "step": m.step,
                "tokens": tokens,
                "seconds": tokens / m.value,
                "eval": m.step in evals,
                "logged_at": m.timestamp_ms / 1000.0,
            }
        )
        previous = m.step
    return windows


def sweep_arguments(description: str, trials: int) -> argparse.ArgumentParser:
    """The arguments of the benchmarks that run a sweep: overrides, N, c, local mode, output."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="extra overrides of every trial's config")
    p.add_argument("--trials", type=int, default=trials, help=f"N trials (default {trials})")
    p.add_argument("--concurrency", type=int, default=2, help="c trials at a time (default 2)")
    p.add_argument(
        "--no-local-mode",
        dest="local_mode",
        action="store_false",
        help="trials start a Ray Train worker group instead of running in Ray Train's local mode",
    )
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--keep", action="store_true", help="keep the temporary MLflow store and runs")
    return p


def print_table(rows: Sequence[Sequence[str]]) -> None:
    """First column left-aligned, the others right-aligned; the first row is the header."""
    width = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    print()
    for r in rows:
        print("  ".join(c.ljust(width[0]) if k == 0 else c.rjust(width[k]) for k, c in enumerate(r)))


def finish(result: Dict[str, Any], json_path: Optional[str], tmp: Optional[Path] = None, keep: bool = False) -> int:
    """Write the JSON, stop the Ray this process started, remove the temporary store."""
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {json_path}")
    ray = sys.modules.get("ray")  # only if this benchmark used it
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    if tmp is not None and not keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0
