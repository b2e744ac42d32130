"""Which noise scale is AdamW's critical batch size: B_simple, or B_simple_adam (the gradient as
AdamW preconditions it)? AdamW simulated on a noisy quadratic with an anisotropic Hessian
(tests/adam_quadratic.py: minibatch gradients, many seeds, steps for the expected loss to reach
a target at the best lr of a fine grid per batch size, fitted as the report fits them), beside
the exact noise scales of the best-lr runs: at the target and averaged along the runs, the
median over batch sizes. B_noise_adam (McCandlish's B_noise of the preconditioned step, which
needs the Hessian) is the theory's answer, shown beside the two a trainer can measure.

    python benchmarks/adam_quadratic_bcrit.py [--json PATH] [--seeds 32]     # about 6 minutes

No Ray, no DeepSpeed, no MLflow.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402
from tests.adam_quadratic import AdamQuadratic, compare  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BASE = AdamQuadratic(noise=2.0, target=0.01, lr_low=3e-4)
CASES = {  # name: the world
    "isotropic": replace(BASE, decades=0.0),
    "condition 100": BASE,
    "condition 1000": replace(BASE, decades=3.0),
    "condition 100, a 1,000th of the loss": replace(BASE, target=0.001, distance=4.0, lr_low=1e-4, max_steps=8000),
}
KEYS = ("b_simple", "b_simple_adam", "b_noise_adam")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--seeds", type=int, default=32)
    args = p.parse_args(argv)

    load_before, started = os.getloadavg()[0], time.perf_counter()
    header = ("case", "B_crit", "S_min", "B_simple: at target, along", "B_simple_adam", "B_noise_adam (theory)")
    rows, out = [header], {}
    for name, world in CASES.items():
        c = compare(replace(world, seeds=args.seeds), [float(b) for b in BATCHES])
        out[name] = {
            "world": asdict(world),
            "b_crit": c.b_crit,
            "s_min": c.s_min,
            "runs": [asdict(r) for r in c.runs],
            **{f"{k}_{where}": c.median(k, where) for k in KEYS for where in ("at_target", "along")},
        }
        cells = [
            f"{c.median(k):,.0f} ({c.ratio(k):.1f}x), {c.median(k, 'along'):,.0f} ({c.ratio(k, 'along'):.1f}x)"
            for k in KEYS
        ]
        rows.append((name, f"{c.b_crit:,.1f}", f"{c.s_min:.1f}", *cells))
        print(f"{name}: steps " + ", ".join(f"B={r.batch:g}: {r.steps}" for r in c.runs), flush=True)
    common.print_table(rows)
    result = {
        "benchmark": "adam_quadratic_bcrit",
        "cases": out,
        "batches": BATCHES,
        "seeds": args.seeds,
        "wall_s": time.perf_counter() - started,
        "machine": common.machine(load_before),
    }
    return common.finish(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
