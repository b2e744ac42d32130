"""How well the critical batch size is recovered, and how often its 90% interval holds the truth,
on simulated training whose noise scale is known (tests/known_truth.py).

    python benchmarks/interval_coverage.py [--draws 100] [--seeds 3] [--world constant] [--json PATH]

Each draw is one world (6 batch sizes x a factor-2 lr grid fixed across B x `--seeds`
replicates; B_noise 700 tokens, warmup 3% of the budget, wsd, per-update noise and seed luck),
analysed in memory from its tables as `orchestrator report DIR` would. Worlds: constant (the
acceptance world), sharp / soft (knees of the progress model sharper or softer than the
hyperbola), point-noise (4x the per-update noise), sqrt-b (seed noise growing with sqrt(B)),
log-gain (an lr response smooth in log lr); and the review's worlds (tests/known_truth.py
REVIEW_WORLDS: log-normal lr response, stretched-exponential loss, runs diverging above 1.5x the
optimal lr, seed noise growing at small B), each with two seeds and the lr grid at a different
offset from the optimum in every draw; and issue 57's shapes (tests/known_truth.py SHAPE_WORLDS:
cosine decay, linear decay to zero, a stretched exponential under a log-normal lr response, a slow
power law), each at its own batch grid and seeds. For each: the median and worst relative error of
the primary B_crit, coverage, how often the lack-of-fit test flags a target, how often the primary
is marked `imprecise` (its interval does not hold it to 20 %), how often it is within 20 % or
flagged (either mark), how often the trend's interval holds 0. No Ray, no MLflow.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402

WORLDS = {
    "constant": {},
    "sharp": {"knee": 2.0},
    "soft": {"knee": 0.5},
    "point-noise": {"update_noise": 4.0},
    "sqrt-b": {"seed_noise": 0.03, "seed_noise_growth": 0.5},
    "log-gain": {"gain": "log"},
}
REVIEW = {"lognormal": 0, "stretched": 1, "diverge": 2, "small-b-seeds": 3}
"""The review's worlds, by their place in tests/known_truth.REVIEW_WORLDS."""
SHAPES = {"cosine": 0, "linear-to-zero": 1, "stretched-lognormal": 2, "slow-power": 3}
"""Issue 57's worlds, by their place in tests/known_truth.SHAPE_WORLDS."""


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=100)
    p.add_argument("--seeds", type=int, default=3, help="replicates per configuration (>= 2)")
    p.add_argument("--world", choices=[*WORLDS, *REVIEW, *SHAPES, "all"], default="all")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)

    import numpy as np

    from orchestrator.analysis import sweep_analysis
    from tests.known_truth import REVIEW_WORLDS, SHAPE_LRS, SHAPE_WORLDS, World, factor_grid, offset_grid

    load_before, started = os.getloadavg()[0], time.perf_counter()
    lrs = factor_grid(0.001, 0.032)
    header = ("world", "draws", "median error", "worst error", "coverage", "lack of fit", "imprecise")
    rows, out = [(*header, "within 20% or flagged", "trend holds 0")], {}
    for name in [*WORLDS, *REVIEW, *SHAPES] if args.world == "all" else [args.world]:
        errors, covered, flagged, imprecise, within, flat = [], 0, 0, 0, 0, 0
        for draw in range(args.draws):
            if name in REVIEW:  # two seeds, the grid at the draw's own offset
                world = list(REVIEW_WORLDS.values())[REVIEW[name]].with_(draw=draw)
                runs = world.grid(lrs=offset_grid(draw, lrs), seeds=2)
            elif name in SHAPES:  # their own batch grid and seeds, a wider lr grid at the draw's offset
                shape, batches, seeds = list(SHAPE_WORLDS.values())[SHAPES[name]]
                world = shape.with_(draw=draw)
                runs = world.grid(batches, lrs=offset_grid(draw, factor_grid(*SHAPE_LRS)), seeds=seeds)
            else:
                world = World(draw=draw, **WORLDS[name])
                runs = world.grid(lrs=lrs, seeds=args.seeds)
            result = sweep_analysis.analyse(world.trials(runs))
            primary, truth = result.primary, world.b_noise
            errors.append(primary.b_crit / truth - 1 if primary.b_crit else float("nan"))
            lo, hi = primary.b_crit_interval or (float("nan"),) * 2
            covered += lo <= truth <= hi
            flagged += any(f.lack_of_fit.flagged for f in result.critical_batch)
            marked = {"lack_of_fit", "imprecise"} & set(primary.flags)
            imprecise += "imprecise" in marked
            within += bool(marked) or abs(errors[-1]) <= 0.2
            trend = result.trend.b_crit_slope_interval
            flat += bool(trend) and trend[0] <= 0 <= trend[1]
        out[name] = {
            "median_error": float(np.nanmedian(errors)),
            "worst_error": float(np.nanmax(np.abs(errors))),
            "coverage": covered / args.draws,
            "lack_of_fit_flagged": flagged / args.draws,
            "imprecise": imprecise / args.draws,
            "within_20_or_flagged": within / args.draws,
            "trend_holds_zero": flat / args.draws,
        }
        r = out[name]
        rows.append(
            (
                name,
                str(args.draws),
                f"{r['median_error']:+.3f}",
                f"{r['worst_error']:.3f}",
                f"{r['coverage']:.2f}",
                f"{r['lack_of_fit_flagged']:.2f}",
                f"{r['imprecise']:.2f}",
                f"{r['within_20_or_flagged']:.2f}",
                f"{r['trend_holds_zero']:.2f}",
            )
        )
    common.print_table(rows)
    result = {
        "benchmark": "interval_coverage",
        "worlds": out,
        "nominal": 0.9,
        "draws": args.draws,
        "seeds": args.seeds,
        "wall_s": time.perf_counter() - started,
        "machine": common.machine(load_before),
    }
    return common.finish(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
