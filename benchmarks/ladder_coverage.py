"""How close a ladder's laws come to the truth, how often their 90% intervals at a target two decades
of compute beyond the largest rung hold it, and how often the backtest flags a law, on ladders
whose laws are known (tests/ladder_truth.py).

    python benchmarks/ladder_coverage.py [--draws 30] [--world all] [--json PATH]

Each draw is one ladder: 3 model sizes x 3 budgets (1.5 decades of compute; D/N ratios varied),
per rung 8-9 batch sizes in powers of two x the 3 values of one factor-sqrt(2) lr grid around
each batch size's best lr x 2 seeds, warmup 3% of the budget, wsd, seed luck 2%, per-update noise
on the logged loss, analysed in memory from its tables (orchestrator/analysis/ladder.py). Worlds:
power-law (the laws as power laws), lr-depends-on-b (the best lr also rising as sqrt(B / B_opt)),
curved (a bend in log D that no power law has: the CI's misspecified world), gently-curved (a
quarter of that bend), and three variants of power-law: known-truth-lr (the lr response of
tests/known_truth.py, steep above the best lr), factor-2-lrs (a factor-2 lr grid instead of
sqrt(2)), noisy-seeds (5x the seed noise: a seed moves the final loss by about 0.1% of it). Per
law: the share of draws with every exponent within 0.05 of the truth, the median and worst error
of the prediction at the target, the median width of its interval (high / low), its coverage, how
often the backtest flagged it, and how often it was covered or flagged. No Ray, no MLflow.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402

LAWS = ("b_opt", "b_crit", "lr_opt")


def worlds() -> Dict[str, object]:
    from tests.ladder_truth import WORLDS

    base = WORLDS["power-law"]
    return {
        **WORLDS,
        "gently-curved": base.with_(name="gently-curved", curvature=0.05),
        "known-truth-lr": base.with_(name="known-truth-lr", lr_response="known-truth"),
        "factor-2-lrs": base.with_(name="factor-2-lrs", lr_factor=2.0),
        "noisy-seeds": base.with_(name="noisy-seeds", seed_noise=0.1),
    }


def score(world, draws: int) -> Dict[str, Dict[str, float]]:
    """Per law: exponents within 0.05, coverage, backtest flags and prediction errors over `draws`."""
    import numpy as np

    from orchestrator.analysis import ladder
    from tests.ladder_truth import exponents, truth_at_target

    truth = truth_at_target(world)
    tally = {law: {"close": 0, "covered": 0, "flagged": 0, "honest": 0, "errors": [], "widths": []} for law in LAWS}
    for draw in range(draws):
        result = ladder.analyse(world.with_(draw=draw).trials(), (world.target_params, world.target_tokens))
        for name in LAWS:
            law, t = result.law(name), tally[name]
            if law.status != "fitted":
                continue
            expected = exponents(world, name, "B" in law.exponents)
            t["close"] += all(abs(v.value - expected[k]) <= 0.05 for k, v in law.exponents.items() if k in expected)
            lo, hi = law.prediction.interval
            covered, flagged = lo <= truth[name] <= hi, law.backtest is not None and law.backtest.held is False
            t["covered"] += covered
            t["flagged"] += flagged
            t["honest"] += covered or flagged
            t["errors"].append(law.prediction.value / truth[name] - 1)
            t["widths"].append(hi / lo)
    out = {}
    for name, t in tally.items():
        errors, widths = np.array(t.pop("errors")), t.pop("widths")
        out[name] = {k: v / draws for k, v in t.items()}
        out[name]["median_width"] = float(np.median(widths)) if widths else float("nan")
        out[name]["median_error"] = float(np.median(errors)) if len(errors) else float("nan")
        out[name]["worst_error"] = float(np.max(np.abs(errors))) if len(errors) else float("nan")
    return out


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=30)
    p.add_argument("--world", choices=[*worlds(), "all"], default="all")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)

    load_before, started = os.getloadavg()[0], time.perf_counter()
    header = (
        "world",
        "law",
        "exponents within 0.05",
        "median error",
        "worst error",
        "interval hi / lo",
        "coverage",
        "flagged",
        "covered or flagged",
    )
    rows, out = [header], {}
    for name, world in worlds().items():
        if args.world not in ("all", name):
            continue
        out[name] = score(world, args.draws)
        for law, r in out[name].items():
            rows.append(
                (
                    name,
                    law,
                    f"{r['close']:.2f}",
                    f"{r['median_error']:+.3f}",
                    f"{r['worst_error']:.3f}",
                    f"{r['median_width']:.2f}",
                    f"{r['covered']:.2f}",
                    f"{r['flagged']:.2f}",
                    f"{r['honest']:.2f}",
                )
            )
    common.print_table(rows)
    result = {
        "benchmark": "ladder_coverage",
        "worlds": out,
        "nominal": 0.9,
        "draws": args.draws,
        "wall_s": time.perf_counter() - started,
        "machine": common.machine(load_before),
    }
    return common.finish(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
