"""How often the 90% interval of B_crit holds the true value, on synthetic sweeps.

    python benchmarks/interval_coverage.py [--draws 200] [--seeds 3] [--noise 0.05] [--target 3.3] [--json PATH]

Each draw is a synthetic sweep of tests/synthetic_sweep.py (6 batch sizes x 3 learning rates x
`--seeds` replicates, each seed's progress rate off by exp(noise x N(0, 1)), true B_crit 5,000
tokens), analysed in memory by `orchestrator.analysis` as `orchestrator report` would; the draw
counts as covered when the reported interval at `--target` holds 5,000. No Ray, no MLflow.
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


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=200)
    p.add_argument("--seeds", type=int, default=3, help="replicates per configuration (>= 2)")
    p.add_argument("--noise", type=float, default=0.05, help="seed-to-seed spread of the progress rate (log scale)")
    p.add_argument("--target", type=float, default=3.3, help="target loss of the synthetic curves")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)

    import numpy as np

    from orchestrator import analysis
    from tests import synthetic_sweep as synthetic

    load_before, started = os.getloadavg()[0], time.perf_counter()
    covered, widths, below, above = 0, [], 0, 0
    for draw in range(args.draws):
        grid = synthetic.specs(np.random.default_rng(1000 + draw), seeds=args.seeds, noise=args.noise)
        lo, hi = analysis.analyse(synthetic.in_memory(grid), [args.target])["critical_batch"][0]["b_crit_interval"]
        covered += lo <= synthetic.B_CRIT <= hi
        below, above = below + (hi < synthetic.B_CRIT), above + (lo > synthetic.B_CRIT)
        widths.append(hi / lo)
    result = {
        "benchmark": "interval_coverage",
        "coverage": covered / args.draws,
        "nominal": 0.9,
        "missed_low": below / args.draws,
        "missed_high": above / args.draws,
        "median_width_ratio": float(np.median(widths)),
        "draws": args.draws,
        "seeds": args.seeds,
        "noise": args.noise,
        "target": args.target,
        "wall_s": time.perf_counter() - started,
        "machine": common.machine(load_before),
    }
    common.print_table(
        [
            ("seeds", "draws", "coverage", "interval above truth", "below", "median hi / lo"),
            (
                str(args.seeds),
                str(args.draws),
                f"{result['coverage']:.3f}",
                f"{result['missed_high']:.3f}",
                f"{result['missed_low']:.3f}",
                f"{result['median_width_ratio']:.2f}",
            ),
        ]
    )
    return common.finish(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
