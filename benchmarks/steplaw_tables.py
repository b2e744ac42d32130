"""Published grids of final losses as the project's tables (trials.csv and curves.csv, the format
`report --out` writes and `report DIR` and `replay: {tables: DIR}` read), so a sweep can replay them.

    python benchmarks/steplaw_tables.py OUT [--data ../shared/data/steplaw_moe_lr_bs_loss.csv]
                                            [--loss smooth|raw]

A script, not a verb: it reads one published format (Li et al. 2025's, ../shared/data/README.md)
and what it writes is the project's own; a new format needs its own reader here, not a new option
of `orchestrator`. Each row becomes a finished run: `model.params` the active parameters,
`train.total_tokens` the budget D, `batch.tokens_per_update` bs x seq_len, `optim.lr` the peak
lr, `train.seed` 0 (one seed per configuration), `schedule.decay` cosine to the recorded final lr
1e-5 (`schedule.min_lr_ratio` = 1e-5 / lr); its final loss (`--loss`: the smoothed one the paper
fits, by default) is its one eval/loss point at D, and its train/loss at 0 and at the last
update (the tables hold no curve: early stopping and the steps-to-target criterion have nothing
to read in a replay of them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from real_runs import DATA, LOSS_COLUMNS, read_grid, trials_of  # noqa: E402

from tests.known_truth import write_tables  # noqa: E402

FINAL_LR = 1e-5
"""The published runs' final learning rate (cosine to it)."""


def convert(data: Path, out: Path, loss: str = "smooth") -> List[Path]:
    """The grid in `data` as trials.csv and curves.csv in `out` (created); their paths."""
    from orchestrator.analysis import tables

    trials = trials_of(read_grid(data, loss))
    for t in trials:
        t.params.update(
            {
                "train.seed": "0",
                "schedule.decay": "cosine",
                "schedule.min_lr_ratio": f"{FINAL_LR / float(t.params['optim.lr']):.6g}",
            }
        )
    rows, curves = tables.rows_of(trials)
    folder = write_tables(rows, curves, out)
    return [folder / tables.TRIALS, folder / tables.CURVES]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write trials.csv and curves.csv in")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--loss", choices=sorted(LOSS_COLUMNS), default="smooth")
    args = parser.parse_args(argv)
    if not args.data.is_file():
        print(f"steplaw_tables: {args.data}: no such file; give --data (../shared/data/README.md)", file=sys.stderr)
        return 2
    written = convert(args.data, args.out, args.loss)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
