"""Does an analysis constant, or the warmup, move the demo's answer? B_crit of `make demo`'s sweep
re-analysed with pre-smoothed curves, and of the same sweep run again with half the warmup.

    python benchmarks/demo_sensitivity.py [--json PATH] [--keep] [--tracking-uri URI]

1. Runs `orchestrator sweep conf/sweep/demo.yaml` in a temporary folder (its own SQLite store), or
   reads a finished demo from `--tracking-uri` (a store holding it, e.g. sqlite:///mlflow.db).
2. Re-analyses its trials with the curves pre-smoothed by a centred window of 0 (the report's
   own: a monotone fit alone), 1, 4 and 16 updates of the largest batch size, in tokens (the old
   analysis smoothed with a window of 2: on its demo B_crit went from 400 to 990 tokens as the
   window went from 0 to 8k tokens).
3. Runs the demo again with `schedule.warmup_tokens` halved and analyses it.

Verdict: every variant's primary B_crit lies inside the base's 90% interval. The analysis is the
report's (`orchestrator.analysis.sweep_analysis.analyse`, the sweep's primary target); the sweeps are the real
command line, whole.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402

DEMO = ROOT / "conf" / "sweep" / "demo.yaml"


def run_demo(folder: Path, overrides: List[str]) -> str:
    """`orchestrator sweep demo.yaml` in `folder` (its own store); the store's URI."""
    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder}/mlflow.db"
    cmd = [sys.executable, "-m", "orchestrator", "sweep", str(DEMO), f"tracking.uri={uri}", *overrides]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"demo sweep failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    print(f"  demo {' '.join(overrides) or '(as shipped)'}: {time.perf_counter() - started:.0f} s")
    return uri


def analyse(uri: str, smoothing: float = 0.0) -> Dict[str, Any]:
    from orchestrator.analysis import sweep_analysis
    from orchestrator.core import sweep_file
    from orchestrator.reporting import report_inputs

    sweep = sweep_file.load(DEMO, check=False)
    _, _, parent = report_inputs.resolve(str(DEMO), [f"tracking.uri={uri}"])
    trials = report_inputs.read_trials(uri, parent)
    result = sweep_analysis.analyse(
        trials, smoothing_tokens=smoothing, **report_inputs.settings(sweep, str(DEMO)).options
    )
    p = result.primary
    return {
        "target_loss": p.target_loss,
        "status": p.status,
        "b_crit": p.b_crit,
        "b_crit_fit": p.b_crit_fit,
        "interval": p.b_crit_interval,
        "b_simple": p.b_simple,
        "trend": result.trend.b_crit_slope,
    }


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--keep", action="store_true", help="keep the temporary folders")
    p.add_argument("--tracking-uri", default=None, help="a store holding a finished demo (skips its first run)")
    args = p.parse_args(argv)

    from orchestrator.core import config
    from orchestrator.studies import kinds

    load_before, started = os.getloadavg()[0], time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="demo-sensitivity-"))
    sweep = kinds.load(DEMO)
    base = config.load(sweep.base_config, sweep.base_overrides)
    largest = max(sweep.space["batch.tokens_per_update"]["grid"])
    uri = args.tracking_uri or run_demo(tmp / "demo", [])
    rows = {f"smoothing {n} x {largest:,} tokens": analyse(uri, n * largest) for n in (0, 1, 4, 16)}
    halved = base.schedule.warmup_tokens // 2
    # The base config's own batch (tiny.yaml's 4,096, which no trial uses) must take the shorter warmup too.
    smallest = min(sweep.space["batch.tokens_per_update"]["grid"])
    half = [f"schedule.warmup_tokens={halved}", f"batch.tokens_per_update={smallest}"]
    rows[f"warmup halved ({halved:,} tokens)"] = analyse(run_demo(tmp / "half-warmup", half))
    base_row = rows[f"smoothing 0 x {largest:,} tokens"]
    lo, hi = base_row["interval"] or (None, None)
    inside = {name: lo is not None and r["b_crit"] is not None and lo <= r["b_crit"] <= hi for name, r in rows.items()}
    table = [("variant", "target", "status", "B_crit", "90% interval", "B_simple", "inside base interval")]
    for name, r in rows.items():
        interval = "-" if not r["interval"] else f"{r['interval'][0]:,.0f} - {r['interval'][1]:,.0f}"
        b_crit = "-" if r["b_crit"] is None else f"{r['b_crit']:,.0f}"
        b_simple = "-" if r["b_simple"] is None else f"{r['b_simple']:,.0f}"
        table.append((name, f"{r['target_loss']:.4g}", r["status"], b_crit, interval, b_simple, str(inside[name])))
    common.print_table(table)
    result = {
        "benchmark": "demo_sensitivity",
        "variants": rows,
        "inside_base_interval": inside,
        "all_inside": all(inside.values()),
        "wall_s": time.perf_counter() - started,
        "machine": common.machine(load_before),
    }
    return common.finish(result, args.json, tmp, args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
