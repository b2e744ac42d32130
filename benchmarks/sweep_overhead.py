"""Sweep overhead: wall time of an N-trial sweep at concurrency c against the same trials run alone.

    python benchmarks/sweep_overhead.py [--json PATH] [--trials 2] [--concurrency 2] [key=value ...]

The trials: conf/train/tiny.yaml on a budget of about a minute each, one worker with
cluster.cpus_per_worker=0.8 (one torch thread), N learning rates (the compute of every trial is
the same). In the sweep each trial runs its worker in Ray Train's local mode inside the Tune
trial (the sweep's default for one worker; `--no-local-mode` starts a worker group per trial,
as `orchestrator train` does, where the Tune trial's 0.2 CPU + 0.8 still lets two trials share
two CPUs).

    ratio = wall(sweep) / (sum over trials of wall(trial alone) / c)

Everything runs in one Ray session, started once before the first measurement and not counted
on either side: "alone" is `launch.train` (what `orchestrator train` does after `ray.init`), the
sweep is `sweep.run` (what `orchestrator sweep` does after `ray.init`). The Ray start-up time is
measured and reported beside it, with the ratio a user would see comparing the commands
(N `orchestrator train` commands each pay it, one `orchestrator sweep` pays it once).
Order: half the alone runs, the sweep, the other half, so that drifting machine load hits both.

`--plain` compares instead with what a user would write without this tool (benchmarks/plain_tune.py:
a Ray Tune function trainable running a plain PyTorch loop of the same model and tokens, with
Tune's MLflowLoggerCallback), whole commands timed as a user runs them (Python start, imports,
`ray.init`, the sweep's checks and its closing report included), each on a fresh MLflow store,
in the order plain, sweep, sweep, plain per round:

    ratio = sum wall(orchestrator sweep) / sum wall(plain_tune.py)
"""

from __future__ import annotations

import contextlib
import copy
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

GOAL = 1.15
PLAIN_GOAL = 1.10
TRIAL_OVERRIDES = {
    "cluster.cpus_per_worker": 0.8,
    "train.total_tokens": 655360,  # 160 updates of 4096 tokens: about a minute alone
    "train.report_every_tokens": 16384,
    "train.eval_every_tokens": 131072,
    "train.checkpoint_every_tokens": 327680,
}


def write_sweep(
    tmp: Path, trials: int, concurrency: int, overrides: List[str], local_mode: bool, base_overrides=TRIAL_OVERRIDES
) -> Path:
    import yaml

    base = dict(base_overrides)
    for item in overrides:
        key, _, value = item.partition("=")
        base[key] = yaml.safe_load(value)
    lrs = [round(2e-3 + 1e-3 * i, 6) for i in range(trials)]
    sweep = {
        "name": "bench-overhead",
        "base": {"config": str(ROOT / "conf" / "train" / "tiny.yaml"), "overrides": base},
        "space": {"optim.lr": {"grid": lrs}},
        "search": {"algorithm": "grid", "max_concurrent": concurrency},
        "local_mode": local_mode,
    }
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def phases(uri: str, run_id: str) -> Dict[str, float]:
    """Where a run's time went, from its MLflow record: start-up (run opened -> first report
    window starts: Ray Train workers, DeepSpeed init, initial eval), the report windows (training,
    evaluations inside them), teardown (last point -> run closed: Ray Train shutdown, loss plot)
    and the steady tokens/s (perf/tokens_per_s windows, the first and the evaluation windows left out)."""
    from orchestrator.tracking.store import Store

    run = Store(uri).get_run(run_id)
    windows = common.report_windows(uri, run_id)
    steady = [w for w in windows[1:] if not w["eval"]]
    start, end = run.start_ms / 1000.0, run.end_ms / 1000.0
    first = windows[0]["logged_at"] - windows[0]["seconds"]
    return {
        "start": start,
        "end": end,
        "total_s": end - start,
        "startup_s": first - start,
        "windows_s": sum(w["seconds"] for w in windows),
        "eval_windows_s": sum(w["seconds"] for w in windows if w["eval"]),
        "teardown_s": end - windows[-1]["logged_at"],
        "steady_tokens_per_s": sum(w["tokens"] for w in steady) / sum(w["seconds"] for w in steady)
        if steady
        else float("nan"),
    }


def run_alone(trial_cfg, name: str) -> Dict[str, Any]:
    cfg = copy.deepcopy(trial_cfg)
    cfg.train.run_name = name
    run = common.run_training(cfg)
    return {"name": name, "lr": cfg.optim.lr, "wall_s": run["wall_s"], **phases(cfg.tracking.uri, run["run_id"])}


def run_sweep(path: Path, overrides: List[str]) -> Dict[str, Any]:
    from orchestrator.driver import sweep
    from orchestrator.tracking.store import Store

    out = io.StringIO()
    started, clock = time.perf_counter(), time.time()
    with contextlib.redirect_stdout(out):
        code = sweep.run(str(path), overrides)
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"sweep failed (exit {code}):\n{out.getvalue()[-3000:]}")
    store = Store(overrides[0].split("=", 1)[1], "bench-sweep-overhead")
    parent = store.find_sweep_run("bench-overhead")
    trials = [{"name": run.name, **phases(store.uri, run.run_id)} for run in store.child_runs(parent)]
    # Outside every trial's run: sweep preflight, parent run, Tune start, trial actors; summary.
    before = min(t["start"] for t in trials) - clock
    after = clock + wall - max(t["end"] for t in trials)
    return {
        "wall_s": wall,
        "before_first_trial_s": before,
        "after_last_trial_s": after,
        "trials": sorted(trials, key=lambda t: t["name"]),
    }


def whole_command(command: List[str], cwd: Path) -> float:
    import subprocess

    started = time.perf_counter()  # each command finds its token cache where a user's would
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return wall


def against_plain_tune(args, tmp: Path) -> Dict[str, Any]:
    """`orchestrator sweep` against benchmarks/plain_tune.py, whole commands, ABBA rounds."""
    from orchestrator.core import config
    from orchestrator.driver import run_life

    trial = ["cluster.cpus_per_worker=0.8", *args.overrides]  # 0.8 + the trial's 0.2: two fit on two CPUs
    path = write_sweep(tmp, args.trials, args.concurrency, trial, local_mode=True, base_overrides={})
    run_life.preflight(config.load(str(ROOT / "conf" / "train" / "tiny.yaml"), list(args.overrides)))  # token cache
    walls: Dict[str, List[float]] = {"sweep": [], "plain": []}
    load_before = os.getloadavg()[0]
    for r in range(args.rounds):
        for side in ("plain", "sweep", "sweep", "plain"):
            folder = tmp / f"{side}-{len(walls[side])}"
            folder.mkdir()
            uri = f"sqlite:///{folder}/mlflow.db"
            if side == "sweep":
                command = [str(ROOT / ".venv" / "bin" / "orchestrator"), "sweep", str(path), f"tracking.uri={uri}"]
            else:
                command = [sys.executable, str(ROOT / "benchmarks" / "plain_tune.py"), f"--uri={uri}"]
                command += [f"--trials={args.trials}", f"--concurrency={args.concurrency}", *args.overrides]
            walls[side].append(whole_command(command, folder))
            print(f"round {r + 1} {side}: {walls[side][-1]:.1f} s", flush=True)
    ratio = sum(walls["sweep"]) / sum(walls["plain"])
    print(
        f"\norchestrator sweep {statistics.mean(walls['sweep']):.1f} s, plain Ray Tune + MLflowLoggerCallback "
        f"{statistics.mean(walls['plain']):.1f} s (means of {len(walls['sweep'])}): ratio {ratio:.3f} "
        f"-> {'meets' if ratio <= PLAIN_GOAL else 'misses'} the goal <= {PLAIN_GOAL}"
    )
    return {
        "benchmark": "sweep_overhead --plain",
        "ratio": ratio,
        "goal": f"ratio <= {PLAIN_GOAL}",
        "trials": args.trials,
        "concurrency": args.concurrency,
        "sweep_wall_s": walls["sweep"],
        "plain_wall_s": walls["plain"],
        "config": {"base": "conf/train/tiny.yaml", "overrides": trial},
        "machine": common.machine(load_before),
    }


def main(argv: List[str] | None = None) -> int:
    p = common.sweep_arguments(__doc__.splitlines()[0], trials=2)
    p.add_argument("--plain", action="store_true", help="whole commands against benchmarks/plain_tune.py")
    p.add_argument("--rounds", type=int, default=1, help="--plain: ABBA rounds (default 1)")
    args = p.parse_args(argv)
    if args.plain:
        tmp = Path(tempfile.mkdtemp(prefix="bench-plain-"))
        return common.finish(against_plain_tune(args, tmp), args.json, tmp, args.keep)

    from orchestrator.driver import ray_session, run_life
    from orchestrator.studies import kinds

    tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    shared = [
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        f"train.storage_path={tmp}/runs",
        "tracking.experiment=bench-sweep-overhead",
    ]
    path = write_sweep(tmp, args.trials, args.concurrency, args.overrides, args.local_mode)
    spec = kinds.load(path)
    spec.base_overrides += shared
    configs = [t.cfg for t in kinds.expand(spec)]
    for cfg in configs:
        run_life.resolve_paths(cfg)
    run_life.preflight(configs[0])  # token cache built outside any timing
    load_before = os.getloadavg()[0]

    t = time.perf_counter()
    ray_session.ray_init(None)
    ray_init_s = time.perf_counter() - t
    print(f"ray.init: {ray_init_s:.1f} s (counted on neither side)", flush=True)

    alone: List[Dict[str, Any]] = []
    first_half = (len(configs) + 1) // 2
    for i, cfg in enumerate(configs[:first_half]):
        alone.append(run_alone(cfg, f"alone-{i}"))
        print(f"alone {i}: {alone[-1]['wall_s']:.1f} s", flush=True)
    sweep = run_sweep(path, shared)
    print(f"sweep of {args.trials} at concurrency {args.concurrency}: {sweep['wall_s']:.1f} s", flush=True)
    for i, cfg in enumerate(configs[first_half:], start=first_half):
        alone.append(run_alone(cfg, f"alone-{i}"))
        print(f"alone {i}: {alone[-1]['wall_s']:.1f} s", flush=True)

    c, n = args.concurrency, len(configs)
    alone_sum = sum(a["wall_s"] for a in alone)
    ratio = sweep["wall_s"] / (alone_sum / c)
    ratio_cli = (sweep["wall_s"] + ray_init_s) / ((alone_sum + n * ray_init_s) / c)
    alone_speed = statistics.mean(a["steady_tokens_per_s"] for a in alone)
    sweep_speed = statistics.mean(t["steady_tokens_per_s"] for t in sweep["trials"])
    result = {
        "benchmark": "sweep_overhead",
        "ratio": ratio,
        "ratio_with_ray_init": ratio_cli,
        "goal": f"ratio <= {GOAL}",
        "trials": n,
        "concurrency": c,
        "local_mode": args.local_mode,
        "sweep_wall_s": sweep["wall_s"],
        "alone_wall_s": [a["wall_s"] for a in alone],
        "alone_sum_s": alone_sum,
        "ray_init_s": ray_init_s,
        "steady_tokens_per_s_alone": alone_speed,
        "steady_tokens_per_s_in_sweep": sweep_speed,
        "sweep_before_first_trial_s": sweep["before_first_trial_s"],
        "sweep_after_last_trial_s": sweep["after_last_trial_s"],
        "sweep_trials": sweep["trials"],
        "alone": alone,
        "config": {
            "base": "conf/train/tiny.yaml",
            "overrides": {**TRIAL_OVERRIDES, **dict(o.split("=", 1) for o in args.overrides)},
        },
        "machine": common.machine(load_before),
    }
    print()
    header = f"{'run':30s}{'total s':>9s}{'start-up':>10s}{'windows':>9s}{'(evals)':>9s}{'teardown':>10s}{'tok/s':>9s}"
    print(header)
    for label, r in [(f"alone {a['name']}", a) for a in alone] + [(f"sweep {t['name']}", t) for t in sweep["trials"]]:
        print(
            f"{label[:30]:30s}{r['total_s']:9.1f}{r['startup_s']:10.1f}{r['windows_s']:9.1f}{r['eval_windows_s']:9.1f}"
            f"{r['teardown_s']:10.1f}{r['steady_tokens_per_s']:9,.0f}"
        )
    print(
        f"\nalone: {' + '.join(f'{a:.1f}' for a in result['alone_wall_s'])} = {alone_sum:.1f} s "
        f"(launch.train wall), / c = {alone_sum / c:.1f} s"
    )
    print(
        f"sweep: {sweep['wall_s']:.1f} s (sweep.run wall; "
        f"{sweep['before_first_trial_s']:.1f} s before the first trial's run opens, "
        f"{sweep['after_last_trial_s']:.1f} s after the last closes)"
    )
    print(f"ray.init: {ray_init_s:.1f} s, once, counted on neither side")
    print(
        f"steady tokens/s per trial: alone {alone_speed:,.0f}, inside the sweep {sweep_speed:,.0f} "
        f"({sweep_speed / alone_speed:.2f}x: {c} trials share the CPUs)"
    )
    verdict = "meets" if ratio <= GOAL else "misses"
    print(
        f"ratio = sweep / (sum alone / c) = {ratio:.3f} -> {verdict} the goal <= {GOAL}; "
        f"counting ray.init as the commands do: {ratio_cli:.3f}"
    )
    return common.finish(result, args.json, tmp, args.keep)


if __name__ == "__main__":
    sys.exit(main())
