"""Does a sweep's cost per trial stay flat as it grows? `orchestrator sweep` of N short trials
(linear regression on a tiny budget, N learning rates, two at a time) at N = 8, 64 and 256: the
wall time per trial, the driver's peak memory and its growth per trial, and the MLflow writes.

    python benchmarks/sweep_scale.py [--sizes 8,64,256] [--concurrency 2] [--workload linreg|replay]
                                     [--json PATH]

`--workload replay`: the same sweep as a replay sweep (docs/sweeps.md, "Replaying recorded runs")
over tables written here, one recorded run per lr with the curves a trial of it logs, so every
trial is served instead of trained and what is measured is the orchestrator's own cost per trial
(Tune, MLflow, the live table, the report); run it at --sizes 100,500,2000 --concurrency 8. Goal
(issue 56): the wall time per trial and the driver's peak memory at 2,000 within 20 % of the
figures at 100, and the closing report of the 2,000 trials under a minute of CPU.

Each size is a fresh command in a subprocess on a fresh SQLite store, as a user runs it (Python
start, imports, `ray.init`, the sweep's checks, the live table and the closing report included).
The driver's peak resident memory is its own (getrusage of the command's process, read at its
exit: not Ray's workers). The trials' compute is the same at every size, so wall / N is the
fixed cost per trial over the concurrency, and the goal is that it and the driver's memory per
trial at 256 stay within 20 % of the figures at 8.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402

TRIAL = {  # linear regression on a budget of a few updates: the trial's own compute is a rounding error
    "train.total_tokens": 4096,
    "batch.tokens_per_update": 256,
    "train.report_every_tokens": 1024,
    "train.eval_every_tokens": 2048,
    "train.checkpoint_every_tokens": 4096,
    "schedule.warmup_tokens": 512,
    "cluster.cpus_per_worker": 0.4,
}
DRIVER = """
import resource, sys, time
from orchestrator import cli
from orchestrator.driver import sweep_summary
closing = sweep_summary.finish
def timed(*args, **kwargs):
    start = time.process_time()
    try:
        return closing(*args, **kwargs)
    finally:
        print("CLOSING_REPORT_CPU_S", time.process_time() - start)
sweep_summary.finish = timed
code = cli.main(sys.argv[1:])
usage = resource.getrusage(resource.RUSAGE_SELF)
print("DRIVER_MAXRSS_KB", usage.ru_maxrss)
print("DRIVER_CPU_S", usage.ru_utime + usage.ru_stime)
raise SystemExit(code)
"""
"""The command, in a process whose peak memory and CPU time it prints at its exit, and a sweep's
closing report's CPU time (sweep_summary.finish: reading every trial's run and curves, the
analysis, the report's files and figures, logging them)."""


def write_tables(folder: Path, lrs: List[float]) -> Path:
    """One finished run per lr, of TRIAL's budget and batch, with the curves a trained trial logs
    (a train/loss point per report, an eval/loss and its standard error per evaluation)."""
    from tests.known_truth import write_tables as write

    budget, batch = TRIAL["train.total_tokens"], TRIAL["batch.tokens_per_update"]
    rows, curves = [], []
    for i, lr in enumerate(lrs):
        name = f"recorded-{i}"
        rows.append(
            {
                "trial": name,
                "status": "FINISHED",
                "batch.tokens_per_update": batch,
                "optim.lr": lr,
                "train.seed": 0,
                "train.total_tokens": budget,
            }
        )
        for t in range(TRIAL["train.report_every_tokens"], budget + 1, TRIAL["train.report_every_tokens"]):
            curves.append((name, "train/loss", t, _loss(lr, t / batch)))
        for t in range(TRIAL["train.eval_every_tokens"], budget + 1, TRIAL["train.eval_every_tokens"]):
            curves += [(name, "eval/loss", t, _loss(lr, t / batch) + 0.01), (name, "eval/loss_se", t, 0.002)]
    return write(rows, curves, folder / "recorded")


def _loss(lr: float, updates: float) -> float:
    """A recorded run's loss: falling with updates x lr, higher the farther lr is from 0.5."""
    return round(1.0 + (lr - 0.5) ** 2 + 2.0 / (1 + lr * updates), 6)


def write_sweep(folder: Path, trials: int, concurrency: int, workload: str = "linreg") -> Path:
    import yaml

    sweep = {
        "name": f"scale-{trials}",
        "base": {
            "config": str(ROOT / "conf" / "train" / "linreg.yaml"),
            "overrides": {**TRIAL, "tracking.uri": f"sqlite:///{folder / 'mlflow.db'}"},
        },
        "space": {"optim.lr": {"grid": [round(0.01 + 0.001 * i, 6) for i in range(trials)]}},
        "search": {"algorithm": "grid", "max_concurrent": concurrency},
    }
    if workload == "replay":
        sweep["replay"] = {"tables": str(write_tables(folder, sweep["space"]["optim.lr"]["grid"]))}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def measure(trials: int, concurrency: int, workload: str = "linreg") -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = write_sweep(folder, trials, concurrency, workload)
        started = time.perf_counter()
        proc = _run_driver(["sweep", str(path)], folder)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(
                f"sweep of {trials} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        rss_kb = int(_printed(proc.stdout, "DRIVER_MAXRSS_KB"))
        closing_cpu_s = _printed(proc.stdout, "CLOSING_REPORT_CPU_S")
        writes = _store_rows(folder / "mlflow.db")
        report_cpu_s = _report_cpu_seconds(path, folder)
    return {
        "trials": trials,
        "wall_s": wall,
        "closing_report_cpu_s": closing_cpu_s,
        "report_cpu_s": report_cpu_s,
        "wall_per_trial_s": wall / trials,
        "driver_peak_mb": rss_kb / 1024,
        **writes,
    }


def _run_driver(args: List[str], folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", DRIVER, *args],
        cwd=folder,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _report_cpu_seconds(sweep: Path, folder: Path) -> float:
    """CPU seconds of `orchestrator report SWEEP` on the finished sweep's store (the closing report
    again, as a command of its own: Python's start and imports included)."""
    proc = _run_driver(["report", str(sweep), "--out", str(folder / "report-again")], folder)
    if proc.returncode != 0:
        raise SystemExit(f"report failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return _printed(proc.stdout, "DRIVER_CPU_S")


def _printed(stdout: str, name: str) -> float:
    return float(next(line.split()[1] for line in stdout.splitlines() if line.startswith(name)))


def _store_rows(db: Path) -> Dict[str, int]:
    """What the sweep wrote to MLflow: runs, params, metric points, tags."""
    import sqlite3

    with sqlite3.connect(db) as con:
        return {
            f"mlflow_{table}": con.execute(f"select count(*) from {table}").fetchone()[0]  # noqa: S608 (table names are ours)
            for table in ("runs", "params", "metrics", "tags")
        }


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8,64,256")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--workload", choices=("linreg", "replay"), default="linreg")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    load = os.getloadavg()[0]
    results = []
    for n in [int(s) for s in args.sizes.split(",")]:
        results.append(measure(n, args.concurrency, args.workload))
        r = results[-1]
        per = f"{r['wall_per_trial_s']:.2f} s per trial"
        report = f"closing report {r['closing_report_cpu_s']:.1f} CPU s, `report` again {r['report_cpu_s']:.1f}"
        print(f"  {n} trials: {r['wall_s']:.0f} s, {per}, driver {r['driver_peak_mb']:.0f} MB, {report}")
    first = results[0]
    rows = [
        [
            "trials",
            "wall (s)",
            "s per trial",
            "x the first",
            "driver peak (MB)",
            "x the first",
            "metric points",
            "closing report CPU (s)",
            "`report` again CPU (s)",
        ]
    ]
    for r in results:
        rows.append(
            [
                f"{r['trials']}",
                f"{r['wall_s']:.0f}",
                f"{r['wall_per_trial_s']:.2f}",
                f"{r['wall_per_trial_s'] / first['wall_per_trial_s']:.2f}",
                f"{r['driver_peak_mb']:.0f}",
                f"{r['driver_peak_mb'] / first['driver_peak_mb']:.2f}",
                f"{r['mlflow_metrics']:,}",
                f"{r['closing_report_cpu_s']:.1f}",
                f"{r['report_cpu_s']:.1f}",
            ]
        )
    common.print_table(rows)
    return common.finish({"sizes": results, "machine": common.machine(load)}, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
