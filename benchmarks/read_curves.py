"""Reading a sweep's curves back from MLflow: one history at a time against 8 at a time
(tracking.store.Store.histories, which `report` and the end of `sweep` use: 8 at a time from a
tracking server, one at a time from SQLite), in the same process.

    python benchmarks/read_curves.py [--store sqlite:///mlflow.db --sweep demo] [--repeats 3]

Without --store: a known-truth sweep (tests/known_truth.py, 40 runs of train/loss, eval/loss and
gns/b_simple, 300 points each) is logged into a fresh SQLite store first. The two reads are
timed in ABBA order (sequential, concurrent, concurrent, sequential, ...) and must return the
same curves. ratio = sequential seconds / concurrent seconds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.reporting import sweep_tables  # noqa: E402
from orchestrator.tracking import metric_logger  # noqa: E402
from orchestrator.tracking.run_tags import PARENT_TAG, ROLE_TAG, SWEEP_ROLE  # noqa: E402
from orchestrator.tracking.store import Store  # noqa: E402


def _known_truth_store(folder: Path) -> tuple:
    from tests.known_truth import World, factor_grid

    uri = f"sqlite:///{folder}/mlflow.db"
    store = Store(uri, "bench")
    parent = store.create_run("bench", tags={ROLE_TAG: SWEEP_ROLE})
    world = World(max_points=300, draw=5)
    for run in world.grid(batches=(256, 512, 1024, 2048), lrs=factor_grid(0.002, 0.032), seeds=2):
        run_id = store.create_run(run.name, tags={PARENT_TAG: parent})
        logger = metric_logger.MetricLogger(uri, run_id, flush_every_s=60)
        for metric, points in (("train/loss", run.train), ("eval/loss", run.eval), ("gns/b_simple", run.b_simple)):
            for step, value in points:
                logger.log({metric: value}, step=step)
        logger.close()
    return uri, parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default=None, help="an MLflow tracking URI holding the sweep")
    ap.add_argument("--sweep", default=None, help="the sweep's name in that store")
    ap.add_argument("--repeats", type=int, default=3, help="ABBA groups of four reads")
    args = ap.parse_args()
    if args.store:
        uri = args.store
        parent = Store(uri).find_sweep_run_anywhere(args.sweep)
    else:
        uri, parent = _known_truth_store(Path(tempfile.mkdtemp(prefix="read-curves-")))
    store = Store(uri)
    runs = store.child_runs(parent)
    keys = list(sweep_tables.METRICS)

    def sequential():
        return store.histories(runs, keys, workers=1)

    def concurrent():
        return store.histories(runs, keys, workers=8)

    assert sequential() == concurrent(), "the two reads differ"
    times = {"sequential": [], "concurrent": []}
    for _ in range(args.repeats):
        for name in ("sequential", "concurrent", "concurrent", "sequential"):
            started = time.perf_counter()
            (sequential if name == "sequential" else concurrent)()
            times[name].append(time.perf_counter() - started)
    points = sum(len(c) for curves in concurrent().values() for c in curves.values())
    seq, conc = (sorted(times[k])[len(times[k]) // 2] for k in ("sequential", "concurrent"))
    print(f"{len(runs)} runs, {len(keys)} metrics asked, {points:,} points in {uri}")
    print(f"median of {2 * args.repeats}: one at a time {seq:.2f} s, concurrent {conc:.2f} s, ratio {seq / conc:.2f}")


if __name__ == "__main__":
    main()
