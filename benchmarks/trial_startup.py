"""Trial start-up: where a sweep trial's fixed cost goes, from its start to its first update and
from its last update to its end.

    python benchmarks/trial_startup.py [--json PATH] [--trials 8] [--concurrency 2] [--no-local-mode] [key=value ...]

The trials: conf/train/tiny.yaml on a small budget (16 updates of 4,096 tokens), one worker with
cluster.cpus_per_worker=0.8, N learning rates. A real `sweep.run` after `ray.init` (timed apart).
Every trial logs its phases to MLflow (orchestrator/core/phases.py): `startup/*` from its
process's start (a fresh trial actor) or from the trial function's call (a reused one) to the
first update, `teardown/final_report_s` and `teardown/finish_s` after the last; the rest of the
teardown (closing the logger, Ray Train's exit) is the run's MLflow end time less the last
update's loss timestamp less those two.

    fixed cost of a trial = startup/total_s + (run end - last update's train/loss timestamp)

The goal is on its median over the sweep's trials. `--no-local-mode` starts a Ray Train worker
group per trial (what multi-worker trials do), `cluster.num_workers=2` gives each trial two.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")

GOAL_S = 1.5
EXPERIMENT = "bench-trial-startup"
TRIAL_OVERRIDES = {
    "cluster.cpus_per_worker": 0.8,
    "train.total_tokens": 65536,  # 16 updates of 4096 tokens
    "train.report_every_tokens": 16384,
    "train.eval_every_tokens": 32768,
    "train.eval_tokens": 4096,
    "train.checkpoint_every_tokens": 65536,
}


def write_sweep(tmp: Path, trials: int, concurrency: int, overrides: List[str], local_mode: bool) -> Path:
    import yaml

    base = dict(TRIAL_OVERRIDES)
    for item in overrides:
        key, _, value = item.partition("=")
        base[key] = yaml.safe_load(value)
    sweep = {
        "name": "bench-startup",
        "base": {"config": str(ROOT / "conf" / "train" / "tiny.yaml"), "overrides": base},
        "space": {"optim.lr": {"grid": [round(1e-3 + 5e-4 * i, 6) for i in range(trials)]}},
        "search": {"algorithm": "grid", "max_concurrent": concurrency},
        "local_mode": local_mode,
    }
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def trial_phases(uri: str, run) -> Dict[str, Any]:
    """One trial's account, from its MLflow record (a tracking.records.RunRecord)."""
    from orchestrator.tracking.store import Store

    metrics = run.metrics
    losses = Store(uri).metric_points(run.run_id, "train/loss")
    end = run.end_ms / 1000.0
    teardown_s = end - losses[-1].timestamp_ms / 1000.0
    known = metrics.get("teardown/final_report_s", 0.0) + metrics.get("teardown/finish_s", 0.0)
    phases = {k: v for k, v in metrics.items() if k.startswith(("startup/", "teardown/"))}
    phases["teardown/close_s"] = teardown_s - known  # logger close, Ray Train's exit
    phases["teardown/total_s"] = teardown_s
    return {
        "name": run.name,
        "fresh_process": "startup/process_s" in metrics,
        "fixed_s": metrics["startup/total_s"] + teardown_s,
        "first_update_s": (losses[0].timestamp_ms / 1000.0) - (run.start_ms / 1000.0),
        "phases": phases,
    }


def main(argv: List[str] | None = None) -> int:
    p = common.sweep_arguments(__doc__.splitlines()[0], trials=8)
    args = p.parse_args(argv)

    from orchestrator.driver import ray_session, sweep
    from orchestrator.tracking.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    uri = f"sqlite:///{tmp}/mlflow.db"
    shared = [f"tracking.uri={uri}", f"train.storage_path={tmp}/runs", f"tracking.experiment={EXPERIMENT}"]
    path = write_sweep(tmp, args.trials, args.concurrency, args.overrides, args.local_mode)
    load_before = os.getloadavg()[0]
    t = time.perf_counter()
    ray_session.ray_init(None)
    ray_init_s = time.perf_counter() - t

    out = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = sweep.run(str(path), shared)
    wall = time.perf_counter() - t
    if code != 0:
        raise SystemExit(f"sweep failed (exit {code}):\n{out.getvalue()[-3000:]}")
    store = Store(uri, EXPERIMENT)
    parent = store.find_sweep_run("bench-startup")
    trials = sorted((trial_phases(uri, r) for r in store.child_runs(parent)), key=lambda t: t["name"])

    names = sorted({k for t in trials for k in t["phases"]}, key=lambda k: (not k.startswith("startup"), k))
    fresh = [t for t in trials if t["fresh_process"]]
    reused = [t for t in trials if not t["fresh_process"]]

    def median(group, key):
        values = [t["phases"][key] for t in group if key in t["phases"]]
        return statistics.median(values) if values else float("nan")

    rows = [["phase (median s)", f"fresh process ({len(fresh)})", f"reused process ({len(reused)})"]]
    rows += [[k, f"{median(fresh, k):.3f}", f"{median(reused, k):.3f}"] for k in names]
    common.print_table(rows)
    fixed = statistics.median(t["fixed_s"] for t in trials)
    result = {
        "benchmark": "trial_startup",
        "fixed_cost_median_s": fixed,
        "goal": f"median fixed cost <= {GOAL_S} s",
        "fixed_cost_s": [t["fixed_s"] for t in trials],
        "sweep_wall_s": wall,
        "ray_init_s": ray_init_s,
        "trials": trials,
        "local_mode": args.local_mode,
        "concurrency": args.concurrency,
        "config": {
            "base": "conf/train/tiny.yaml",
            "overrides": {**TRIAL_OVERRIDES, **dict(o.split("=", 1) for o in args.overrides)},
        },
        "machine": common.machine(load_before),
    }
    each = ", ".join(f"{t['fixed_s']:.2f}" for t in trials)
    print(f"\nfixed cost per trial (s): {each}")
    print(f"sweep of {len(trials)} at concurrency {args.concurrency}: {wall:.1f} s (ray.init {ray_init_s:.1f} s apart)")
    verdict = "meets" if fixed <= GOAL_S else "misses"
    print(f"median fixed cost {fixed:.2f} s -> {verdict} the goal <= {GOAL_S} s")
    return common.finish(result, args.json, tmp, args.keep)


if __name__ == "__main__":
    sys.exit(main())
