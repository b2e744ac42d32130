"""Does the batch ramp a branch study suggests save optimizer steps? The suggested ramp against
the base's fixed batch size on the same budget and schedule, the real `orchestrator train`.

    python benchmarks/ramp_vs_fixed.py [--study-uri URI] [--json PATH] [--seeds 2]

1. Reads the branch study `conf/sweep/branches.yaml` from `--study-uri` (a store holding it),
   or runs it in a temporary folder, and takes its suggested ramp (`report`'s).
2. Trains the study's base config at its fixed batch size and with the ramp (batch.ramp, the
   study's lr scaling), `--seeds` seeds each, in one SQLite store.
3. Reports per arm: optimizer steps, tokens, final eval loss (mean and spread over seeds), and
   whether the ramp reaches the fixed run's final eval loss within its seed spread in fewer steps.
"""

from __future__ import annotations

import argparse
import json
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


def suggested_ramp(uri: str, folder: Path) -> Dict[str, Any]:
    cli("report", str(STUDY), f"tracking.uri={uri}", "--out", str(folder / "report"), cwd=folder)
    return json.loads((folder / "report" / "report.json").read_text())["branch"]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study-uri", help="a store holding a finished branches.yaml study")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ramp_vs_fixed-"))
    uri = f"sqlite:///{folder}/mlflow.db"
    study_uri = args.study_uri
    if not study_uri:
        cli("sweep", str(STUDY), f"tracking.uri={uri}", cwd=folder)
        study_uri = uri
    branch = suggested_ramp(study_uri, folder)
    alpha = branch["lr_scaling"]
    arms = {"fixed": [], "ramp": []}
    for seed in range(args.seeds):
        arms["fixed"].append(train(uri, folder, f"fixed-{seed}", [f"train.seed={seed}"]))
        ramp = [branch["ramp_override"], f"batch.ramp_lr_scaling={alpha}", f"train.seed={seed}"]
        arms["ramp"].append(train(uri, folder, f"ramp-{seed}", ramp))
    out: Dict[str, Any] = {"ramp": branch["ramp"], "lr_scaling": alpha}
    for arm, runs in arms.items():
        losses = [r["final_eval_loss"] for r in runs]
        out[arm] = {
            "steps": runs[0]["steps"],
            "tokens": runs[0]["tokens"],
            "final_eval_loss": statistics.mean(losses),
            "spread": statistics.stdev(losses) if len(losses) > 1 else 0.0,
            "losses": losses,
        }
    fixed, ramp = out["fixed"], out["ramp"]
    out["steps_saved"] = 1 - ramp["steps"] / fixed["steps"]
    out["reaches_fixed_loss"] = ramp["final_eval_loss"] <= fixed["final_eval_loss"] + max(fixed["spread"], 1e-9)
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
