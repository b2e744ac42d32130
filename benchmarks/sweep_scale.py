"""Does a sweep's cost per trial stay flat as it grows? `orchestrator sweep` of N short trials
(linear regression on a tiny budget, N learning rates, two at a time) at N = 8, 64 and 256: the
wall time per trial, the driver's peak memory and its growth per trial, and the MLflow writes.

    python benchmarks/sweep_scale.py [--sizes 8,64,256] [--concurrency 2] [--json PATH]

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
import resource, sys
from orchestrator import cli
code = cli.main(sys.argv[1:])
print("DRIVER_MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
raise SystemExit(code)
"""


def write_sweep(folder: Path, trials: int, concurrency: int) -> Path:
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
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def measure(trials: int, concurrency: int) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = write_sweep(folder, trials, concurrency)
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", DRIVER, "sweep", str(path)],
            cwd=folder,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(
                f"sweep of {trials} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        rss_kb = int(next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("DRIVER_MAXRSS_KB")))
        writes = _store_rows(folder / "mlflow.db")
    return {
        "trials": trials,
        "wall_s": wall,
        "wall_per_trial_s": wall / trials,
        "driver_peak_mb": rss_kb / 1024,
        **writes,
    }


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
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    load = os.getloadavg()[0]
    results = []
    for n in [int(s) for s in args.sizes.split(",")]:
        results.append(measure(n, args.concurrency))
        r = results[-1]
        per = f"{r['wall_per_trial_s']:.2f} s per trial"
        print(f"  {n} trials: {r['wall_s']:.0f} s, {per}, driver {r['driver_peak_mb']:.0f} MB")
    first = results[0]
    rows = [["trials", "wall (s)", "s per trial", "x the first", "driver peak (MB)", "MB per trial", "metric points"]]
    for r in results:
        rows.append(
            [
                f"{r['trials']}",
                f"{r['wall_s']:.0f}",
                f"{r['wall_per_trial_s']:.2f}",
                f"{r['wall_per_trial_s'] / first['wall_per_trial_s']:.2f}",
                f"{r['driver_peak_mb']:.0f}",
                f"{r['driver_peak_mb'] / r['trials']:.2f}",
                f"{r['mlflow_metrics']:,}",
            ]
        )
    common.print_table(rows)
    return common.finish({"sizes": results, "machine": common.machine(load)}, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
