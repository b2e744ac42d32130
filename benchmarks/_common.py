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
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence


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
