"""The schedule a branch study advises (orchestrator/analysis/branch_schedule.py), judged exactly
against the best fixed batch on issue 54's worlds (tests/schedule_worlds.py): SGD on a noisy
quadratic with the branches' lr scaled linearly and as its square root, a world where no schedule
pays, and Adam on an anisotropic quadratic; 5 draws each, conf/sweep/branches.yaml's layout.

    python benchmarks/schedule_choice.py [--draws 5] [--worlds sgd-linear,sgd-sqrt,no-pay,adam]
        [--branch-noise 0.003] [--trained] [--json PATH]

Per draw: the advice (a fixed batch or the suggested ramp), its exact loss over the best fixed
batch's (of the factors 1 to 16 from the start, the lr times k^alpha), its updates against that
batch's, the suggested ramp's own excess; per world, how many draws hold (at most 0.1 % above at no
more updates), how many advise a ramp only where it pays (the acceptance's other branch: where no
ramp ends within 0.1 % of the best fixed batch, none advised; where one does, the draw holds) and
the branched critical batch's interval coverage of the exact one. With
--branch-noise every branch also carries a training noise of its own that no standard error holds
(one seed per branch). With --trained the study is compared with a sweep of every factor trained
from the start to the budget (branch.compare_with), each run's final loss measured with the eval's
noise in place of the prediction at its batch. No Ray, no MLflow; about a minute and a half, most of
it the Adam world's bisections.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402
from orchestrator.analysis import branch_cbs, branch_schedule  # noqa: E402
from tests.schedule_worlds import AdamWorld, SGDWorld, judge, true_critical_batch  # noqa: E402

WORLDS = {
    "sgd-linear": lambda d, noise: SGDWorld(d, alpha=1.0, branch_noise=noise),
    "sgd-sqrt": lambda d, noise: SGDWorld(d, alpha=0.5, branch_noise=noise),
    "no-pay": lambda d, noise: SGDWorld(d, alpha=0.5, no_pay=True, branch_noise=noise),
    "adam": lambda d, noise: AdamWorld(d, branch_noise=noise),
}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=5)
    p.add_argument("--worlds", default=",".join(WORLDS))
    p.add_argument(
        "--branch-noise", type=float, default=0.0, help="a branch's own training noise, relative (0.003: the eval's)"
    )
    p.add_argument("--trained", action="store_true", help="compared with the factors trained to the budget")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    load_before, started = os.getloadavg()[0], time.perf_counter()
    tol = branch_schedule.SCHEDULE_TOLERANCE
    rows = [("world", "draw", "advice", "vs best fixed", "updates (best fixed's)", "best fixed", "ramp's own")]
    out = []
    for name in args.worlds.split(","):
        held = ramp_right = covered = points = 0
        for draw in range(args.draws):
            world = WORLDS[name](draw, args.branch_noise)
            j = judge(world, trained=args.trained)
            held += j.holds(tol)
            for point in branch_cbs.critical_batch_along(world.study().ends):
                truth = true_critical_batch(world, point["tokens"])
                low, high = point["cbs_interval"] or (None, None)
                covered += (low is None or truth >= low) and (high is None or truth <= high)
                points += 1
            ramp_excess = j.ramp_loss / j.best_fixed_loss - 1 if len(j.ramp) > 1 else None
            # The acceptance's other branch: where no ramp pays (none within the tolerance of the
            # best fixed batch), none is advised.
            ramp_pays = ramp_excess is not None and ramp_excess <= tol
            ramp_right += j.holds(tol) if ramp_pays else j.chosen != "suggested ramp"
            rows.append(
                (
                    name,
                    str(draw),
                    j.chosen,
                    f"{j.excess:+.3%}",
                    f"{j.chosen_updates:,} ({j.best_fixed_updates:,})",
                    f"{j.best_fixed_batch:,}",
                    "-" if ramp_excess is None else f"{ramp_excess:+.3%}",
                )
            )
            out.append(
                {"world": name, "draw": draw, "chosen": j.chosen, "excess": j.excess, "holds": j.holds(tol)}
                | {"updates": j.chosen_updates, "best_fixed_batch": j.best_fixed_batch, "ramp_excess": ramp_excess}
            )
        rows.append((name, "all", f"{held} of {args.draws} hold", "", "", "", f"coverage {covered}/{points}"))
        rows.append((name, "all", f"a ramp only where it pays: {ramp_right} of {args.draws}", "", "", "", ""))
    common.print_table(rows)
    result = {
        "benchmark": "schedule_choice",
        "tolerance": tol,
        "branch_noise": args.branch_noise,
        "trained": args.trained,
        "draws": out,
        "wall_s": time.perf_counter() - started,
        "machine": common.machine(load_before),
    }
    return common.finish(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
