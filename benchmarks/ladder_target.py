"""Does following a ladder's recommendation pay at its target? The target's recommended.yaml
trained at the recommended (B, lr) and at four neighbours, each on the same seeds: B x 2 and B / 2
(each at the lr the laws give for that batch: lr x (B'/B)^eta when the lr law has a B term, else
the same lr), lr x 2 and lr / 2 at the recommended B. The recommendation pays when its final eval
loss is the best of the five within the seed spread.

    python benchmarks/ladder_target.py REPORT_DIR [--seeds 0,1] [--jobs 2] [--json PATH]

REPORT_DIR is a ladder's report folder (`orchestrator report ladder` after `orchestrator sweep
conf/sweep/ladder.yaml` writes reports/ladder): report.json's `ladder.recommendation` and its
recommended.yaml. Each run is the command a user would type, `orchestrator train
recommended.yaml KEY=VALUE...`, --jobs of them at a time, tracked into the store the file names;
the final eval/loss is read back from MLflow.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402


def arms(batch: int, lr: float, eta: float, seq_len: int) -> List[Tuple[str, int, float]]:
    """(name, tokens per update, lr) of the recommendation and its four neighbours; a batch is
    whole sequences."""

    def whole(tokens: float) -> int:
        return max(seq_len, int(round(tokens / seq_len)) * seq_len)

    double, half = whole(2 * batch), whole(batch / 2)
    return [
        ("recommended", batch, lr),
        ("B x 2", double, lr * (double / batch) ** eta),
        ("B / 2", half, lr * (half / batch) ** eta),
        ("lr x 2", batch, 2 * lr),
        ("lr / 2", batch, lr / 2),
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", type=Path, help="a ladder's report folder holding report.json and recommended.yaml")
    p.add_argument("--seeds", default="0,1", help="seeds of every arm (default 0,1)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    from orchestrator.core import config
    from orchestrator.driver import launch
    from orchestrator.tracking.store import Store

    load = os.getloadavg()[0]
    rec = json.loads((args.report / "report.json").read_text())["ladder"]["recommendation"]
    path = (args.report / "recommended.yaml").resolve()
    cfg = config.load(path)
    eta = rec.get("lr_batch_exponent") or 0.0
    batch, lr = int(cfg.batch.tokens_per_update), float(cfg.optim.lr)
    seeds = [int(s) for s in args.seeds.split(",")]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs = [
        (name, b, x, seed, f"target-{stamp}-B{b}-lr{x:.3g}-s{seed}")
        for name, b, x in arms(batch, lr, eta, int(cfg.data.seq_len))
        for seed in seeds
    ]
    print(
        f"target: {rec['params']:.3g} parameters on {rec['tokens']:.3g} tokens; recommended B {batch:,} "
        f"(law {rec['tokens_per_update']['value']:.0f}), lr {lr:.3g}, eta {eta:+.2f}; "
        f"{len(runs)} runs, {args.jobs} at a time"
    )
    started = time.perf_counter()
    walls = _run_all(path, runs, args.jobs)
    store = Store(cfg.tracking.uri)
    results: Dict[str, Dict[str, Any]] = {}
    for name, b, x, _seed, run_name in runs:
        final = store.get_run(launch.recorded_run_id(cfg.train.storage_path, run_name)).metrics["eval/loss"]
        arm = results.setdefault(name, {"tokens_per_update": b, "lr": x, "finals": [], "wall_s": []})
        arm["finals"].append(final)
        arm["wall_s"].append(walls[run_name])
    for arm in results.values():
        arm["mean"] = statistics.fmean(arm["finals"])
        arm["spread"] = statistics.stdev(arm["finals"]) if len(arm["finals"]) > 1 else 0.0
        arm["steps_ratio"] = batch / arm["tokens_per_update"]
    best_name = min(results, key=lambda k: results[k]["mean"])
    ours, best = results["recommended"], results[best_name]
    gap = ours["mean"] - best["mean"]
    pays = gap <= max(ours["spread"], best["spread"])
    common.print_table(
        [["arm", "tokens/update", "lr", "final eval/loss", "spread", "optimizer steps (x recommended's)"]]
        + [
            [
                k,
                f"{a['tokens_per_update']:,}",
                f"{a['lr']:.3g}",
                f"{a['mean']:.4f}",
                f"{a['spread']:.4f}",
                f"{a['steps_ratio']:.2f}",
            ]
            for k, a in results.items()
        ]
    )
    print(
        f"\nbest arm: {best_name}; the recommendation is {gap:+.4f} from it "
        f"({'within' if pays else 'beyond'} the seed spread {max(ours['spread'], best['spread']):.4f}); "
        f"{time.perf_counter() - started:.0f} s in all"
    )
    result = {
        "recommendation": rec,
        "arms": results,
        "best_arm": best_name,
        "gap_to_best": gap,
        "recommended_is_best_within_spread": pays,
        "machine": common.machine(load),
    }
    return common.finish(result, args.json)


def _run_all(config_path: Path, runs, jobs: int) -> Dict[str, float]:
    """Each run as `orchestrator train`, `jobs` at a time; the wall time of each by run name."""
    pending, running, walls = list(runs), {}, {}
    while pending or running:
        while pending and len(running) < jobs:
            name, b, x, seed, run_name = pending.pop(0)
            command = [
                sys.executable,
                "-m",
                "orchestrator",
                "train",
                str(config_path),
                f"batch.tokens_per_update={b}",
                f"optim.lr={x!r}",
                f"train.seed={seed}",
                f"train.run_name={run_name}",
            ]
            log = tempfile.TemporaryFile("w+")  # not a pipe: a full pipe would stall the run
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
            running[run_name] = (proc, log, time.perf_counter())
            print(f"  started {run_name} ({name})", flush=True)
        time.sleep(2)
        for run_name, (proc, log, start) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[run_name]
            log.seek(0)
            if proc.returncode != 0:
                raise SystemExit(f"run {run_name} failed (exit {proc.returncode}):\n{log.read()[-3000:]}")
            log.close()
            walls[run_name] = time.perf_counter() - start
            print(f"  done {run_name} in {walls[run_name]:.0f} s", flush=True)
    return walls


if __name__ == "__main__":
    raise SystemExit(main())
