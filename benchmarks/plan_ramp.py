"""`orchestrator plan` on a long batch.ramp: seconds for ramps of N segments, in this process.

    python benchmarks/plan_ramp.py [--segments 100 1000 10000] [--repeats 3] [--json out.json]

Each ramp alternates 4,096 and 8,192 tokens per update every 8,192 tokens on the tiny config
(conf/train/tiny.yaml), its budget N x 8,192 tokens; the time is the whole verb in process
(`cli.main(["plan", ...])`: loading and validating the config, the plan, the printed table),
the ramp given in a YAML file as a user would; the best of --repeats runs (a shared machine's
load only ever adds time). `yaml s` is the part of it PyYAML takes to read the file (its C
parser, Python constructors). Goal: under a second at 10,000 segments.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import print_table  # noqa: E402
from orchestrator.cli import main as cli_main  # noqa: E402
from orchestrator.core import yaml_files  # noqa: E402

STRETCH = 8192
"""Tokens between two changes: whole updates of either batch size."""


def ramp_config(folder: Path, segments: int) -> Path:
    """A train config extending tiny.yaml with a ramp of `segments` steps."""
    tiny = Path(__file__).resolve().parent.parent / "conf" / "train" / "tiny.yaml"
    steps = "\n".join(
        f"    - {{from_tokens: {i * STRETCH}, tokens_per_update: {4096 if i % 2 == 0 else 8192}}}"
        for i in range(segments)
    )
    path = folder / f"ramp-{segments}.yaml"
    path.write_text(f"extends: {tiny}\nbatch:\n  ramp:\n{steps}\ntrain:\n  total_tokens: {segments * STRETCH}\n")
    return path


def time_yaml(path: Path) -> float:
    started = time.perf_counter()
    yaml_files.extends_chain(path)
    return time.perf_counter() - started


def time_plan(path: Path) -> float:
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = cli_main(["plan", str(path)])
    seconds = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"plan {path} exited {code}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", type=int, nargs="+", default=[100, 1000, 10000], help="ramp lengths")
    ap.add_argument("--repeats", type=int, default=3, help="runs per length; the fastest is the figure")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        time_plan(ramp_config(Path(folder), 2))  # imports and caches: not part of any figure
        results = []
        for n in args.segments:
            path = ramp_config(Path(folder), n)
            plan_s = min(time_plan(path) for _ in range(args.repeats))
            results.append(
                {"segments": n, "plan_s": plan_s, "yaml_s": min(time_yaml(path) for _ in range(args.repeats))}
            )
    rows = [[f"{r['segments']:,}", f"{r['plan_s']:.3f}", f"{r['yaml_s']:.3f}"] for r in results]
    print_table([["segments", "plan s", "yaml s"], *rows])
    print(f"load average (1 min) before: {load:.2f}")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"load_avg_1m_before": load, "results": results}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
