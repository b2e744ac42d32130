"""Does a batch schedule save optimizer steps without losing loss? The ramp a branch study
suggests, the same study's ramp at the old 2x rule, and the online schedule (batch.schedule:
adaptive, calibrated by the study), each against the base's fixed batch size on the same budget
and lr schedule, the real `orchestrator train`.

    python benchmarks/ramp_vs_fixed.py [--study-uri URI] [--json PATH] [--seeds 3]
                                        [--arms fixed,ramp,ramp_2x,adaptive]

1. Reads the branch study `conf/sweep/branches.yaml` from `--study-uri` (a store holding it),
   or runs it in a temporary folder, and takes its report (`report.json`): the suggested ramp
   (branch_ramp.THRESHOLD, 8x), its points and power law.
2. Trains the study's base config per arm, `--seeds` seeds each (the issue asks for 3), in one
   SQLite store: `fixed` (its batch), `fixed_end` and `fixed_mid` (a fixed batch from the start at
   the batch the suggested ramp ends at, and at the power of 2 x the base halfway to it in log B,
   each with the lr the ramp trains that batch at: the study's lr scaling), `ramp` (the suggested
   ramp, the study's lr scaling),
   `ramp_2x` (suggested_ramp at threshold 2 from the same points: the rule before the schedule
   world's measurement), `adaptive` (doubling from its own B_simple up to 8 x the base, at the
   calibration `batch.calibration_from` gives, branch_ramp.online_calibration: the study's median
   branched critical batch size over B_simple times a quarter, so it doubles where that passes 8 x
   the batch, as the suggested ramp does).
3. Reports per arm: optimizer steps (mean over seeds: an adaptive run's vary), tokens, final eval
   loss (mean and spread over seeds), the steps saved against `fixed` and whether the arm reaches
   the fixed runs' final eval loss within their seed spread in fewer steps; and the best fixed
   batch (issue 54): of the fixed arms, the one with the fewest steps whose loss is within the
   base's seed spread of the lowest fixed loss, with every schedule's loss and steps against it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
STUDY = ROOT / "conf" / "sweep" / "branches.yaml"


def cli(*args: str, cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"orchestrator {' '.join(args[:2])} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc.stdout


def study_report(uri: str, folder: Path) -> Dict[str, Any]:
    """The branch study's report.json (its `branch`, `branch_cbs` and `branch_fit`)."""
    cli("report", str(STUDY), f"tracking.uri={uri}", "--out", str(folder / "report"), cwd=folder)
    return json.loads((folder / "report" / "report.json").read_text())


def train(uri: str, folder: Path, name: str, overrides: List[str]) -> Dict[str, float]:
    from orchestrator.core import yaml_files
    from orchestrator.tracking.store import Store

    study = yaml_files.read_mapping(STUDY, "SWEEP")[0]
    base = [f"{k}={yaml_files.dotlist_value(v)}" for k, v in study["base"]["overrides"].items()]
    config = str((STUDY.parent / study["base"]["config"]).resolve())
    cli("train", config, *base, *overrides, f"tracking.uri={uri}", f"train.run_name={name}", cwd=folder)
    store = Store(uri)
    run = store.find_runs_named(name)[0]
    steps = store.metric_history(run.run_id, "train/optimizer_step")
    return {
        "steps": len(steps),
        "tokens": int(run.params["train.total_tokens_rounded"]),
        "final_eval_loss": run.metrics["eval/loss"],
    }


ARMS = ("fixed", "fixed_mid", "fixed_end", "ramp", "ramp_2x", "adaptive")
FIXED_ARMS = ("fixed", "fixed_mid", "fixed_end")
ADAPTIVE_GROWTH = 8
"""The adaptive arm's cap: the base batch times this (262,144 tokens are whole updates of 2,048)."""


def arm_overrides(report: Dict[str, Any]) -> Dict[str, List[str]]:
    """Each arm's overrides of the study's base config, from the study's report.json."""
    from orchestrator.analysis import branch_ramp
    from orchestrator.core import yaml_files

    branch, points, fit = report["branch"], report["branch_cbs"], report["branch_fit"]
    base = yaml_files.read_mapping(STUDY, "SWEEP")[0]["base"]["overrides"]
    first = int(branch["ramp"][0]["tokens_per_update"])
    at_2x = branch_ramp.suggested_ramp(
        points, fit, first, int(base["train.total_tokens"]), int(base["data.seq_len"]), 1, threshold=2.0
    )
    scaling = [f"batch.ramp_lr_scaling={branch['lr_scaling']}"]
    # what batch.calibration_from gives: the study's cbs / B_simple with the ramp's safety factor
    # (taken here whether or not it is resolved, which the arm's line says)
    online = branch_ramp.online_calibration(points)
    calibration = online.value if online else branch_ramp.ONLINE_FACTOR
    if online and not online.resolved:
        print(f"the adaptive arm's calibration is not resolved ({online.why_not()}); calibration_from refuses it")
    end = int(branch["ramp"][-1]["tokens_per_update"])
    mid = first * 2 ** math.ceil(math.log2(end / first) / 2)
    alpha, lr = float(branch["lr_scaling"]), float(base["optim.lr"])
    fixed = {"fixed": []}  # the fixed batches the ramp passes through, each once
    if mid not in (first, end):
        fixed["fixed_mid"] = fixed_at(mid, first, alpha, lr)
    if end != first:
        fixed["fixed_end"] = fixed_at(end, first, alpha, lr)
    return {
        **fixed,
        "ramp": [branch["ramp_override"], *scaling],
        "ramp_2x": [branch_ramp.ramp_override(at_2x), *scaling],
        "adaptive": [
            "batch.schedule=adaptive",
            f"batch.max_tokens_per_update={ADAPTIVE_GROWTH * first}",
            f"batch.calibration={calibration:.6g}",
            *scaling,
        ],
    }


def fixed_at(batch: int, base_batch: int, alpha: float, lr: float) -> List[str]:
    """A fixed batch from the start at `batch`, with the lr the study's scaling gives it (the lr
    the ramp trains that batch at)."""
    return [f"batch.tokens_per_update={batch}", f"optim.lr={lr * (batch / base_batch) ** alpha:.6g}"]


def best_fixed(out: Dict[str, Any], fixed_arms: List[str]) -> str:
    """Of the fixed arms, the one with the fewest steps whose mean loss is within the base's seed
    spread of the lowest fixed loss (the base arm's spread: the noise any fixed arm's mean has)."""
    lowest = min(out[a]["final_eval_loss"] for a in fixed_arms)
    near = [a for a in fixed_arms if out[a]["final_eval_loss"] <= lowest + max(out["fixed"]["spread"], 1e-9)]
    return min(near, key=lambda a: out[a]["steps"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study-uri", help="a store holding a finished branches.yaml study")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--arms", default=",".join(ARMS), help=f"a comma-separated subset of {', '.join(ARMS)}")
    args = parser.parse_args()
    chosen = ["fixed"] + [a for a in args.arms.split(",") if a in ARMS and a != "fixed"]
    folder = Path(tempfile.mkdtemp(prefix="ramp_vs_fixed-"))
    uri = f"sqlite:///{folder}/mlflow.db"
    study_uri = args.study_uri
    if not study_uri:
        cli("sweep", str(STUDY), f"tracking.uri={uri}", cwd=folder)
        study_uri = uri
    report = study_report(study_uri, folder)
    overrides = arm_overrides(report)
    chosen = [a for a in chosen if a in overrides]  # a ramp that ends where it starts has no fixed_end
    arms: Dict[str, List[Dict[str, float]]] = {arm: [] for arm in chosen}
    for seed in range(args.seeds):  # seeds outermost: a load that drifts hits every arm alike
        for arm in chosen:
            arms[arm].append(train(uri, folder, f"{arm}-{seed}", [*overrides[arm], f"train.seed={seed}"]))
    out: Dict[str, Any] = {"overrides": {arm: overrides[arm] for arm in chosen}, "seeds": args.seeds}
    for arm, runs in arms.items():
        losses, steps = [r["final_eval_loss"] for r in runs], [r["steps"] for r in runs]
        out[arm] = {
            "steps": statistics.mean(steps),
            "steps_per_seed": steps,
            "tokens": runs[0]["tokens"],
            "final_eval_loss": statistics.mean(losses),
            "spread": statistics.stdev(losses) if len(losses) > 1 else 0.0,
            "losses": losses,
        }
    fixed = out["fixed"]
    for arm in chosen[1:]:
        result = out[arm]
        result["steps_saved"] = 1 - result["steps"] / fixed["steps"]
        result["loss_difference"] = result["final_eval_loss"] - fixed["final_eval_loss"]
        result["reaches_fixed_loss"] = (
            result["final_eval_loss"] <= fixed["final_eval_loss"] + max(fixed["spread"], 1e-9)
            and result["steps"] < fixed["steps"]
        )
    fixed_arms = [a for a in chosen if a in FIXED_ARMS]
    best = best_fixed(out, fixed_arms)
    out["best_fixed"] = best
    for arm in chosen:
        if arm not in FIXED_ARMS:
            out[arm]["vs_best_fixed"] = {
                "loss_difference": out[arm]["final_eval_loss"] - out[best]["final_eval_loss"],
                "steps_saved": 1 - out[arm]["steps"] / out[best]["steps"],
            }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
