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

Then the basin worlds (tests/basin_truth.py: the loss rises on both sides of a loss-optimal batch B*
and the best lr moves with B; a target 1.5 decades of compute past 3 x 3 rungs of 6 batch sizes x 9
lrs): basin (2 seeds), basin-one-seed, and two drifts of the penalty's shape that the pooled
penalty laws cannot follow: basin-skew-drift (its asymmetry turns with D) and
basin-curvature-drift (its curvature falls as D^-0.1). Per quantity at the target (B*, the lr at
B*, the predicted loss there, the tolerance point): the median and worst error, the median
interval width and its coverage; the largest error of the penalty curve between B* / 4 and 4 B*
(as a function of B / B*, absolute, in % of the loss), and the true penalty of the recommended
batch (at its best lr) against the 0.5 % tolerance.
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


def basin_worlds() -> Dict[str, object]:
    from tests.basin_truth import WORLDS as BASINS

    base = BASINS["basin"]
    return {
        **BASINS,
        "basin-skew-drift": base.with_(skew_d=0.1),
        "basin-curvature-drift": base.with_(curvature_d=-0.1),
    }


def score_basin(world, draws: int) -> Dict[str, Dict[str, float]]:
    """The two points at the target against the world's closed-form truth over `draws`."""
    import numpy as np

    from orchestrator.analysis import ladder

    n, d = world.target
    truth = {"b_star": world.b_star(n, d), "lr": world.lr_star(n, d), "loss": world.loss_star(n, d)}
    tally = {k: {"errors": [], "widths": [], "covered": 0} for k in truth}
    shape, true_penalty, flagged = [], [], 0
    ratios = 2.0 ** np.linspace(-2, 2, 17)
    for draw in range(draws):
        result = ladder.analyse(world.with_(draw=draw).trials(), world.target)
        t = result.tradeoff
        o = t.loss_optimal
        for key, value in (("b_star", o.tokens_per_update), ("lr", o.lr), ("loss", o.predicted_loss)):
            lo, hi = value.interval
            tally[key]["errors"].append(value.value / truth[key] - 1)
            tally[key]["widths"].append(hi / lo)
            tally[key]["covered"] += lo <= truth[key] <= hi
        b_star = o.tokens_per_update.value
        predicted = np.array([t.curve.penalty(b_star * r)[0] for r in ratios])
        shape.append(float(np.max(np.abs(predicted - world.penalty(n, d, truth["b_star"] * ratios)))))
        true_penalty.append(float(world.penalty(n, d, t.tolerance_point.tokens_per_update.value)))
        flagged += result.law("b_star").backtest.held is False
    out = {}
    for key, t in tally.items():
        errors = np.array(t["errors"])
        out[key] = {
            "median_error": float(np.median(errors)),
            "worst_error": float(np.max(np.abs(errors))),
            "median_width": float(np.median(t["widths"])),
            "covered": t["covered"] / draws,
        }
    out["penalty_curve"] = {"median_max_error": float(np.median(shape)), "worst_max_error": float(np.max(shape))}
    out["tolerance_point"] = {
        "median_true_penalty": float(np.median(true_penalty)),
        "worst_true_penalty": float(np.max(true_penalty)),
        "b_star_backtest_flagged": flagged / draws,
    }
    return out


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=30)
    p.add_argument("--world", choices=[*worlds(), *basin_worlds(), "all"], default="all")
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
    rows = [("world", "quantity", "median error", "worst error", "interval hi / lo", "coverage")]
    for name, world in basin_worlds().items():
        if args.world not in ("all", name):
            continue
        out[name] = score_basin(world, args.draws)
        for key in ("b_star", "lr", "loss"):
            r = out[name][key]
            rows.append(
                (
                    name,
                    key,
                    f"{r['median_error']:+.3f}",
                    f"{r['worst_error']:.3f}",
                    f"{r['median_width']:.2f}",
                    f"{r['covered']:.2f}",
                )
            )
        curve, point = out[name]["penalty_curve"], out[name]["tolerance_point"]
        rows.append(
            (
                name,
                "penalty B*/4..4B*",
                f"{100 * curve['median_max_error']:.2f}% (max abs)",
                f"{100 * curve['worst_max_error']:.2f}%",
                "",
                "",
            )
        )
        rows.append(
            (
                name,
                "true penalty at the tolerance point",
                f"{100 * point['median_true_penalty']:.2f}%",
                f"{100 * point['worst_true_penalty']:.2f}%",
                f"B* backtest flagged {point['b_star_backtest_flagged']:.2f}",
                "",
            )
        )
    if len(rows) > 1:
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
