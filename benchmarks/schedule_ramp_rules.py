"""Why the suggested batch ramp lost loss, and which rule keeps it: the ramp rules on the schedule
world (tests/schedule_truth.py: McCandlish's progress model with an exact B_crit(t)), each read
from that world's branch study laid out as conf/sweep/branches.yaml's (base 256 tokens per update,
branch points at 9 %, 36 % and 91 % of the budget, factors 1 to 16, branches 9 % of the budget
long, tolerance 1 %). Per rule: optimizer steps and loss at the budget, against the best fixed
batch the study tried and against the oracle (B = B_crit(t)).

    python benchmarks/schedule_ramp_rules.py [--json PATH]     # a few seconds

The rules: the threshold (double when the measured critical batch size passes k x the batch:
Merrill et al.'s 2, or with a safety factor) and the reading of a resolved point (its value, or
the lower end of its 90 % interval). The lr jump at a change, Adam's memory and weight decay are
not in this world (it trains at the best lr of every step): they need ramp_vs_fixed's real runs.
Then the online rule (batch.schedule: adaptive) at its best: reading the exact B_crit where the
run is every 1,024 tokens, at the same thresholds (the rule's 2x times 1 / calibration).
No Ray, no DeepSpeed, no MLflow.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402
from orchestrator.analysis import branch_cbs, branch_ramp  # noqa: E402
from tests.schedule_truth import FIXED_SEED_SPREAD, STUDY_FACTORS, ScheduleWorld, branch_ends, online_schedule, regret  # noqa: E402

BASE = 256
THRESHOLDS = (2.0, 4.0, 6.0, 8.0)


def read_at_values(along: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The points without their intervals: suggested_ramp reads each resolved one at its value
    (it reads a point that has an interval at the interval's lower end)."""
    return [{k: v for k, v in p.items() if k != "cbs_interval"} for p in along]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    load_before, started = os.getloadavg()[0], time.perf_counter()
    world = ScheduleWorld()
    tried = [float(BASE * k) for k in STUDY_FACTORS]
    along = branch_cbs.critical_batch_along(branch_ends(world, BASE))
    fit = branch_ramp.power_law_fit(along)
    spread = FIXED_SEED_SPREAD * world.run([(0.0, float(BASE))]).loss
    for point in along:
        truth = world.b_crit(world.run([(0.0, float(BASE))], point["tokens"]).loss)
        print(f"branch point {point['tokens']:,}: {point['status']} {point['cbs']:,.0f} (B_crit there {truth:,.0f})")
    header = ("rule", "batches", "steps", "loss - best fixed", "steps to oracle's loss - oracle's")
    rows, out = [header], []
    for reading, points in (("value", read_at_values(along)), ("lower end", along)):
        for threshold in THRESHOLDS:
            ramp = branch_ramp.suggested_ramp(points, fit, BASE, int(world.total_tokens), 1, 1, threshold)
            r = regret([(s["from_tokens"], s["tokens_per_update"]) for s in ramp], world, tried)
            batches = [s["tokens_per_update"] for s in ramp]
            out.append(
                {"reading": reading, "threshold": threshold, "ramp": ramp, "steps": r.outcome.steps}
                | {k: getattr(r, k) for k in ("extra_loss_vs_best_fixed", "extra_steps_vs_oracle")}
            )
            rows.append(
                (
                    f"{threshold:g}x, {reading}",
                    " -> ".join(map(str, batches)),
                    f"{r.outcome.steps:,.0f} ({r.outcome.steps / r.best_fixed.steps - 1:+.0%})",
                    f"{r.extra_loss_vs_best_fixed:+.4f}"
                    + (" (within)" if r.extra_loss_vs_best_fixed <= spread else ""),
                    f"{r.extra_steps_vs_oracle:+,.0f} (oracle {r.oracle.steps:,.0f})",
                )
            )
    for batch in tried[1:3]:  # the next fixed batches: what a ramp must beat besides the best one
        r = regret([(0.0, batch)], world, tried)
        rows.append(
            (
                f"fixed {batch:g}",
                "",
                f"{r.outcome.steps:,.0f} ({r.outcome.steps / r.best_fixed.steps - 1:+.0%})",
                f"{r.extra_loss_vs_best_fixed:+.4f}" + (" (within)" if r.extra_loss_vs_best_fixed <= spread else ""),
                f"{r.extra_steps_vs_oracle:+,.0f}",
            )
        )
    online = [("online rule on the exact B_crit", "batches", "steps", "loss - best fixed", "")]
    for threshold in THRESHOLDS:
        schedule = online_schedule(world, float(BASE), threshold)
        r = regret(schedule, world, tried)
        online.append(
            (
                f"{threshold:g}x (calibration {2 / threshold:.3g})",
                " -> ".join(f"{b:g}" for _, b in schedule),
                f"{r.outcome.steps:,.0f} ({r.outcome.steps / r.best_fixed.steps - 1:+.0%})",
                f"{r.extra_loss_vs_best_fixed:+.4f}" + (" (within)" if r.extra_loss_vs_best_fixed <= spread else ""),
                "",
            )
        )
        out.append(
            {"online": True, "threshold": threshold, "ramp": schedule, "steps": r.outcome.steps}
            | {"extra_loss_vs_best_fixed": r.extra_loss_vs_best_fixed}
        )
    common.print_table(rows)
    common.print_table(online)
    print(
        f"best fixed batch {r.best_fixed_batch:g}: {r.best_fixed.steps:,.0f} steps, loss {r.best_fixed.loss:.4f}; "
        f"the seed spread ({FIXED_SEED_SPREAD:.2%} of it): {spread:.4f}"
    )
    result = {
        "benchmark": "schedule_ramp_rules",
        "points": along,
        "rules": out,
        "spread": spread,
        "wall_s": time.perf_counter() - started,
        "machine": common.machine(load_before),
    }
    return common.finish(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
