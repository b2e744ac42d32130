"""Trials a ladder's search uses with prediction-placed first rounds (LadderSearch) against
independent bracket searches of the same rungs (BracketSearch), on a known-truth ladder
(tests/ladder_truth.py), every trial scored by the world's noise-free final loss.

    python benchmarks/ladder_placement.py [--world power-law] [--lrs 1e-3,2e-3,4e-3]

Both searches get the same groups: per rung (3 model sizes x 3 budgets, smallest compute first)
the batch sizes 32 .. 32,768 (11 powers of two, a space wider than any one rung needs) and the same
first-round lrs; one seed; step 2, at most 7 lrs per batch size. A placed rung's finished rungs are
read as the world's own tables of those rungs (tests/ladder_truth.LadderWorld.trials), not the
trials the search ran. Per rung: the trials each search ran, and for placed rungs the predicted
B_opt, B_crit and lr_opt against the world's brute-force truth. No Ray cluster, no MLflow (Ray
Tune's Searcher class is imported).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.studies.bracket_search import BracketSearch, LadderSearch  # noqa: E402
from tests.ladder_truth import WORLDS  # noqa: E402

GRID = [2**k for k in range(5, 16)]


def run(search, world, rungs) -> dict:
    """Every trial the search hands out, scored at once; trials per rung."""
    counts, n = {r: 0 for r in rungs}, 0
    while (suggested := search.suggest(str(n))) not in (None, BracketSearch.FINISHED):
        v = suggested["trial"]
        rung = (v["model.params"], v["train.total_tokens"])
        counts[rung] += 1
        loss = world.final_loss_at(*rung, v["batch.tokens_per_update"], v["optim.lr"])
        search.on_trial_complete(str(n), {"eval_loss": loss})
        n += 1
    assert search.suggest("end") == BracketSearch.FINISHED
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", default="power-law", choices=sorted(WORLDS))
    parser.add_argument("--lrs", default="1e-3,2e-3,4e-3")
    args = parser.parse_args()
    world = WORLDS[args.world]
    lrs = [float(x) for x in args.lrs.split(",")]
    rungs = sorted(world.rungs(), key=lambda r: r[0] * r[1])
    groups = [
        ({"model.params": n, "train.total_tokens": d, "batch.tokens_per_update": b}, lrs, None)
        for n, d in rungs
        for b in GRID
    ]
    rung_of = [i for i in range(len(rungs)) for _ in GRID]
    independent = run(BracketSearch(groups, step=2.0, max_lrs=7), world, rungs)

    def finished():  # the rungs whose brackets are all done, as the world's tables
        done = [r for i, r in enumerate(rungs) if all(b.done for b, j in zip(ladder.brackets, rung_of) if j == i)]
        return world.trials(done)

    ladder = LadderSearch(groups, rungs, rung_of, step=2.0, max_lrs=7, finished=finished)
    placed = run(ladder, world, rungs)
    print(f"world {args.world}, first-round lrs {lrs}, batch sizes {GRID[0]}..{GRID[-1]}")
    print(f"{'rung (N, D)':>24} {'independent':>12} {'ladder':>7}  placement vs truth")
    for i, rung in enumerate(rungs):
        truth = world.truth(*rung)
        p = ladder.placed.get(i)
        what = (
            f"B_opt {p['b_opt']:,.0f} ({p['b_opt'] / truth.b_opt - 1:+.0%}), "
            f"B_crit {p['b_crit']:,.0f} ({p['b_crit'] / truth.b_crit - 1:+.0%}), "
            f"lr {p['lr_opt']:.3g} ({p['lr_opt'] / truth.lr_opt - 1:+.0%}), {len(p['batches'])} batch sizes"
            if p
            else "space"
        )
        print(f"{str((int(rung[0]), int(rung[1]))):>24} {independent[rung]:>12} {placed[rung]:>7}  {what}")
    total_i, total_l = sum(independent.values()), sum(placed.values())
    print(f"{'total':>24} {total_i:>12} {total_l:>7}  ({total_l / total_i:.0%} of the independent searches' trials)")


if __name__ == "__main__":
    main()
