"""What an answer costs on real runs: the searchers' trials against the full grid, and the held-out
loss of the recommendation each leads to, every trial served from Li et al. 2025's published
mixture-of-experts runs as a replay sweep serves it (orchestrator/driver/replay.find).

    python benchmarks/replay_search.py [--data ../shared/data/steplaw_moe_lr_bs_loss.csv]
                                       [--seeds 5] [--tolerance 0.005] [--json PATH]

The data and the held-out rungs are benchmarks/real_runs.py's (7 rungs held out, one at a time,
each a grid of 9 lrs x 5 batch sizes). For each held-out rung, each searcher runs over the other
15 rungs, and the ladder fitted to the trials it ran (orchestrator/analysis/ladder.py, as `report`
fits a sweep) recommends its loss-optimal point for the held-out rung, read off that rung's grid
(real_runs.read_off) against the grid's best: its excess.

- grid: every recorded run of every rung.
- bracket: the bracket search of the lr per batch size on every rung (BracketSearch; first-round
  lrs two grid steps apart, drawn per seed; step sqrt(2), the grid's spacing; at most 7 lrs).
- ladder: the same with placement (LadderSearch: every rung after the first placed from the
  finished ones, as `ladder.predict` does; at this step of sqrt(2), no refinement round), its
  finished rungs read from the trials it ran.
- random, tpe: per rung as many trials as the ladder search ran there, drawn uniformly from the
  rung's grid, or proposed by Optuna's TPE sampler (seeded), each over the rung's (B, lr) grid.

A searcher's trial is answered by the replay's own lookup: the recorded run, else the grid
interpolated in (log B, log lr), else refused (an infinite loss, as Tune hears it). Goal (issue 56):
the ladder within 0.1 % (absolute) of the grid's held-out excess with at most a quarter of its
trials. No Ray, no MLflow (Ray Tune's Searcher class is imported).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from real_runs import DATA, held_out_rungs, read_grid, read_off, trials_of  # noqa: E402
from steplaw_tables import convert  # noqa: E402

from orchestrator.core.sweep_schema import ReplayConfig, Sweep  # noqa: E402
from orchestrator.driver import replay  # noqa: E402
from orchestrator.studies.bracket_search import BracketSearch, LadderSearch  # noqa: E402

Rung = Tuple[int, int]
GOAL_EXCESS, GOAL_SHARE = 0.001, 0.25


class Answered:
    """Every trial answered as the replay serves it, counted per rung."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.ran: Dict[Rung, List[Tuple[float, float, float]]] = {}

    def __call__(self, rung: Rung, batch: float, lr: float) -> float:
        sweep = Sweep(path=self.folder / "sweep.yaml", replay=ReplayConfig(str(self.folder), rung[0]))
        try:
            served = replay.find(dict(zip(replay.KEY, (batch, lr, 0, rung[1]))), sweep)
            run = served.run
            loss = run.eval[-1][1] * served.scale if run.status == "FINISHED" else math.inf
        except replay.NotRecorded:
            loss = math.inf
        self.ran.setdefault(rung, []).append((batch, lr, loss))
        return loss

    def grids(self) -> Dict[Rung, np.ndarray]:
        """What was run, per rung, as real_runs' grids: its finite losses, each configuration once
        (a searcher that proposes one twice paid for both)."""
        return {
            r: np.array([t for t in dict(((b, lr), (b, lr, v)) for b, lr, v in rows).values() if math.isfinite(t[2])])
            for r, rows in self.ran.items()
        }


def searched(search, served: Answered, rungs: List[Rung]) -> None:
    """Every trial the search hands out, answered at once (one at a time, as with max_concurrent 1)."""
    n = 0
    while (suggested := search.suggest(str(n))) not in (None, BracketSearch.FINISHED):
        v = suggested["trial"]
        rung = (int(v["model.params"]), int(v["train.total_tokens"]))
        search.on_trial_complete(str(n), {"eval_loss": served(rung, v["batch.tokens_per_update"], v["optim.lr"])})
        n += 1


def bracket_groups(rungs: List[Rung], batches: List[float], lrs: List[float]):
    groups = [
        ({"model.params": n, "train.total_tokens": d, "batch.tokens_per_update": b}, lrs, None)
        for n, d in rungs
        for b in batches
    ]
    return groups, [i for i in range(len(rungs)) for _ in batches]


def run_bracket(folder, rungs, batches, lrs) -> Answered:
    served = Answered(folder)
    groups, _ = bracket_groups(rungs, batches, lrs)
    searched(BracketSearch(groups, step=math.sqrt(2), max_lrs=7), served, rungs)
    return served


def run_ladder(folder, rungs, batches, lrs, tolerance) -> Answered:
    served = Answered(folder)
    groups, rung_of = bracket_groups(rungs, batches, lrs)

    def finished():
        done = [r for i, r in enumerate(rungs) if all(b.done for b, j in zip(search.brackets, rung_of) if j == i)]
        return trials_of({r: g for r, g in served.grids().items() if r in done})

    search = LadderSearch(groups, rungs, rung_of, step=math.sqrt(2), max_lrs=7, tolerance=tolerance, finished=finished)
    searched(search, served, rungs)
    return served


def run_sampled(folder, rungs, grids, counts, seed: int, tpe: bool) -> Answered:
    """Per rung, counts[rung] trials over its (B, lr) grid: uniform draws, or Optuna's TPE."""
    served = Answered(folder)
    rng = np.random.default_rng(seed)
    for rung in rungs:
        points = [(float(b), float(lr)) for b, lr, _ in grids[rung]]
        k = min(counts.get(rung, 0), len(points))
        if not tpe:
            for i in rng.choice(len(points), size=k, replace=False):
                served(rung, *points[i])
            continue
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
        batches = sorted({b for b, _ in points})
        lrs = sorted({lr for _, lr in points})
        for _ in range(k):
            trial = study.ask()
            b, lr = trial.suggest_categorical("batch", batches), trial.suggest_categorical("lr", lrs)
            loss = served(rung, b, lr)
            study.tell(trial, loss if math.isfinite(loss) else 1e9)
    return served


def held_out_excess(sampled: Dict[Rung, np.ndarray], full: np.ndarray, held: Rung, tolerance: float) -> Optional[float]:
    """The loss-optimal point the ladder of `sampled` recommends for `held`, read off its grid
    (`full`) against that grid's best; None where the ladder recommends none or off the grid."""
    from orchestrator.analysis import ladder

    try:
        fitted = ladder.analyse(trials_of({r: g for r, g in sampled.items() if len(g)}), held, tolerance)
    except ValueError:
        return None
    t = fitted.tradeoff
    if t is None or t.loss_optimal.lr is None:
        return None
    o = t.loss_optimal
    loss = read_off(full, o.tokens_per_update.value, o.lr.value)
    return None if loss is None else loss / float(full[:, 2].min()) - 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--tolerance", type=float, default=0.005)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not args.data.is_file():
        print(f"replay_search: {args.data}: no such file; give --data (../shared/data/README.md)", file=sys.stderr)
        return 2
    started = time.time()
    grids = read_grid(args.data, "smooth")
    folder = Path(tempfile.mkdtemp(prefix="replay_search_"))
    convert(args.data, folder, "smooth")
    lr_grid = sorted({float(lr) for g in grids.values() for lr in g[:, 1]})
    batches = sorted({float(b) for g in grids.values() for b in g[:, 0]})
    results: Dict[str, List[Dict[str, object]]] = {}
    for held in held_out_rungs(grids):
        rungs = sorted((r for r in grids if r != held), key=lambda r: r[0] * r[1])
        full = {r: grids[r] for r in rungs}
        excess = {"grid": held_out_excess(full, grids[held], held, args.tolerance)}
        row: Dict[str, object] = {
            "held": held,
            "grid": {"trials": sum(len(g) for g in full.values()), "excess": [excess["grid"]]},
        }
        for name in ("bracket", "ladder", "random", "tpe"):
            row[name] = {"trials": [], "excess": []}
        for seed in range(args.seeds):
            first = 2 + seed % 4  # first-round lrs two grid steps apart, in the grid's middle
            lrs = [lr_grid[first], lr_grid[first + 2]]
            runs = {
                "bracket": run_bracket(folder, rungs, batches, lrs),
                "ladder": run_ladder(folder, rungs, batches, lrs, args.tolerance),
            }
            counts = {r: len(v) for r, v in runs["ladder"].ran.items()}
            runs["random"] = run_sampled(folder, rungs, full, counts, seed, tpe=False)
            runs["tpe"] = run_sampled(folder, rungs, full, counts, seed, tpe=True)
            for name, served in runs.items():
                row[name]["trials"].append(sum(len(v) for v in served.ran.values()))
                row[name]["excess"].append(held_out_excess(served.grids(), grids[held], held, args.tolerance))
        results[f"{held[0]:.3g} x {held[1]:.3g}"] = row
        print(_line(held, row), flush=True)
    print(_summary(results))
    print(f"({time.time() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


def _median(values) -> Optional[float]:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:+.3f}%"


def _line(held: Rung, row: Dict[str, object]) -> str:
    parts = [f"held out N {held[0]:.3g}, D {held[1]:.3g}:"]
    for name in ("grid", "bracket", "ladder", "random", "tpe"):
        r = row[name]
        trials = r["trials"] if isinstance(r["trials"], int) else _median(r["trials"])
        misses = sum(e is None for e in r["excess"])
        parts.append(
            f"{name} {trials:.0f} trials {_pct(_median(r['excess']))}" + (f" ({misses} none)" if misses else "")
        )
    return " | ".join(parts)


def _summary(results: Dict[str, Dict[str, object]]) -> str:
    lines = ["searcher  trials (median over seeds, summed over the held-outs' ladders)  held-out excess: median, worst"]
    grid_trials = sum(r["grid"]["trials"] for r in results.values())
    for name in ("grid", "bracket", "ladder", "random", "tpe"):
        trials = sum(
            r[name]["trials"] if isinstance(r[name]["trials"], int) else _median(r[name]["trials"])
            for r in results.values()
        )
        excess = [e for r in results.values() for e in r[name]["excess"]]
        kept = [e for e in excess if e is not None]
        worst = max(kept) if kept else None
        lines.append(
            f"{name:8s}  {trials:7.0f} ({trials / grid_trials:.0%} of the grid's)  "
            f"{_pct(_median(excess))}, {_pct(worst)}"
            + (f"; {len(excess) - len(kept)} with no answer" if len(kept) < len(excess) else "")
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
