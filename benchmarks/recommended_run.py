"""Does following the report's "what to run" pay? The recommended config of a finished sweep
(`recommended.yaml`, orchestrator/analysis/launch_choice.py) trained on its seeds beside the sweep's
best configuration: its final loss within the stated tolerance of the best's, in fewer
optimizer steps (a larger batch at the same tokens).

    python benchmarks/recommended_run.py REPORT_DIR [--seeds 0,1] [--json PATH]

REPORT_DIR is a sweep's report folder (`make demo` writes reports/demo): its recommended.yaml is
trained once per seed (train.seed=S, tracking into the store the file names), and its final
eval/loss compared with report.json's best configuration (mean and spread of its seeds) and with
the tolerance the rule used. In-process runs (launch.train) on the local Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", type=Path, help="a sweep's report folder holding report.json and recommended.yaml")
    p.add_argument("--seeds", default="0,1", help="seeds to train the recommendation on (default 0,1)")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    from orchestrator.core import config
    from orchestrator.tracking.store import Store

    load = os.getloadavg()[0]
    answer = json.loads((args.report / "report.json").read_text())
    rec, best = answer["recommendation"], answer["best"]
    runs: List[Dict[str, Any]] = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        name = f"recommended-B{rec['tokens_per_update']}-lr{rec['lr']:.3g}-s{seed}"  # a new name: never a resume
        cfg = config.load(args.report / "recommended.yaml", [f"train.seed={seed}", f"train.run_name={name}"])
        done = common.run_training(cfg)
        record = Store(cfg.tracking.uri).get_run(done["run_id"])
        runs.append({"seed": seed, "final_eval": record.metrics["eval/loss"], "wall_s": done["wall_s"]})
        print(f"  seed {seed}: final eval/loss {runs[-1]['final_eval']:.4f} ({done['wall_s']:.0f} s)")
    finals = [r["final_eval"] for r in runs]
    tolerance = rec["b_opt"]["tolerance"]
    result = {
        "recommended": {"tokens_per_update": rec["tokens_per_update"], "lr": rec["lr"], "runs": runs},
        "recommended_mean": statistics.fmean(finals),
        "recommended_spread": statistics.stdev(finals) if len(finals) > 1 else None,
        "best": {k: best[k] for k in ("batch", "final_loss", "spread", "seeds", "lr")},
        "loss_ratio": statistics.fmean(finals) / best["final_loss"],
        "tolerance": tolerance,
        "steps_ratio": best["batch"] / rec["tokens_per_update"],
        "machine": common.machine(load),
    }
    common.print_table(
        [
            ["config", "tokens/update", "lr", "final eval/loss", "spread", "optimizer steps (x best's)"],
            [
                "best tried",
                f"{best['batch']:,}",
                f"{best['lr']:.3g}",
                f"{best['final_loss']:.4f}",
                _g(best["spread"]),
                "1.00",
            ],
            [
                "recommended",
                f"{rec['tokens_per_update']:,}",
                f"{rec['lr']:.3g}",
                f"{result['recommended_mean']:.4f}",
                _g(result["recommended_spread"]),
                f"{result['steps_ratio']:.2f}",
            ],
        ]
    )
    within = result["loss_ratio"] - 1 <= tolerance
    print(
        f"\nrecommended / best final loss = {result['loss_ratio']:.4f} ({'within' if within else 'beyond'} the "
        f"{tolerance:.1%} tolerance), in {result['steps_ratio']:.2f}x the optimizer steps"
    )
    return common.finish(result, args.json)


def _g(x) -> str:
    return "-" if x is None else f"{x:.4f}"


if __name__ == "__main__":
    raise SystemExit(main())
