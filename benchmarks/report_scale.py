"""How `orchestrator report DIR` scales with the trials and curve points a study holds: user CPU
and peak memory of the whole command on known-truth tables grown by replicating trials.

    python benchmarks/report_scale.py [--sizes 72,288,1152] [--points 3000] [--big] [--json PATH]

The tables are one known-truth world (tests/known_truth.py: 6 batch sizes x 6 lrs x 2 seeds = 72
trials, B_noise 700 tokens), each trial's train/loss thinned or thickened to --points points (plus
its eval/loss and gns/b_simple), then replicated as more seeds of the same configurations (k x 72
trials, seeds 0 .. 2k - 1, each replica's curves with its own noise). --big adds 1,000 trials x
10,000 points (10M rows: every run's train/loss interpolated onto 10,000 positions), the goal's
size. Each size is a fresh `python -m orchestrator report DIR
--out OUT` in a subprocess: its user + system CPU and peak resident memory (getrusage of the
child), and the wall time. No Ray, no MLflow.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402


def write_tables(folder: Path, trials: int, points: int, seed: int = 0, thicken: bool = False) -> int:
    """trials.csv and curves.csv of `trials` trials of `points` train/loss points each (a known-truth
    world's 72, replicated as more seeds); returns the rows of curves.csv. thicken: a run with
    fewer updates than `points` gets its train/loss interpolated onto `points` token positions, as
    a trainer logging more often than once an update would write it (the goal's 10M rows)."""
    from tests.known_truth import World, factor_grid

    world = World(max_points=points)
    runs = world.grid(lrs=factor_grid(0.001, 0.032), seeds=2)
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    rows = 0
    with (folder / "trials.csv").open("w", newline="") as t, (folder / "curves.csv").open("w", newline="") as c:
        params = list(world.params(runs[0]))
        trial_writer = csv.writer(t)
        trial_writer.writerow(["trial", "status", *params])
        curve_writer = csv.writer(c)
        curve_writer.writerow(["trial", "metric", "tokens", "value"])
        for k in range(trials):
            run = runs[k % len(runs)]
            replica = k // len(runs)
            seed_value = run.seed + 2 * replica
            name = f"B={run.batch} lr={run.lr:.4g} seed={seed_value}"
            values = {**world.params(run), "train.seed": seed_value}
            trial_writer.writerow([name, run.status, *(values[p] for p in params)])
            noise = 0.0 if replica == 0 else 0.002
            train = _thickened(run.train, points) if thicken else run.train
            for metric, curve in (("train/loss", train), ("eval/loss", run.eval), ("gns/b_simple", run.b_simple)):
                shift = noise * rng.standard_normal(len(curve)) if curve else []
                curve_writer.writerows((name, metric, tok, v + s) for (tok, v), s in zip(curve, shift))
                rows += len(curve)
    return rows


def _thickened(curve, points: int):
    """The curve linearly interpolated onto `points` whole token positions from its first to its last."""
    if len(curve) >= points or len(curve) < 2:
        return curve
    tokens, values = np.array(curve, dtype=float).T
    grid = np.unique(np.linspace(tokens[0], tokens[-1], points).round().astype(np.int64))
    return list(zip(grid.tolist(), np.interp(grid, tokens, values).tolist()))


def measure(folder: Path, out: Path) -> Dict[str, Any]:
    """`orchestrator report folder --out out` in a child process: CPU, peak memory, wall."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "report", str(folder), "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"report failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {
        "user_s": after.ru_utime - before.ru_utime,
        "system_s": after.ru_stime - before.ru_stime,
        "peak_rss_gb": after.ru_maxrss / 2**20,  # kilobytes on Linux; the largest child so far
        "wall_s": wall,
    }


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="72,288,1152", help="trial counts, multiples of 72")
    p.add_argument("--points", type=int, default=3000, help="train/loss points per trial")
    p.add_argument("--big", action="store_true", help="also 1,000 trials x 10,000 points")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    load_before = os.getloadavg()[0]
    cases = [(int(n), args.points) for n in args.sizes.split(",")] + ([(1000, 10_000)] if args.big else [])
    rows = [("trials", "curve rows", "user CPU", "peak memory", "wall", "us / row")]
    results = []
    with tempfile.TemporaryDirectory(prefix="report-scale-") as tmp:
        for trials, points in cases:
            folder = Path(tmp) / f"t{trials}-p{points}"
            curve_rows = write_tables(folder, trials, points, thicken=(trials, points) == (1000, 10_000))
            # peak RSS of the children is a running maximum: measure the sizes in ascending order
            figures = measure(folder, Path(tmp) / f"out-{trials}-{points}")
            cpu = figures["user_s"] + figures["system_s"]
            results.append({"trials": trials, "points": points, "curve_rows": curve_rows, **figures})
            rows.append(
                (
                    f"{trials:,}",
                    f"{curve_rows:,}",
                    f"{cpu:.1f} s",
                    f"{figures['peak_rss_gb']:.2f} GB",
                    f"{figures['wall_s']:.1f} s",
                    f"{1e6 * cpu / curve_rows:.1f}",
                )
            )
    common.print_table(rows)
    return common.finish(
        {"benchmark": "report_scale", "cases": results, "machine": common.machine(load_before)}, args.json
    )


if __name__ == "__main__":
    raise SystemExit(main())
