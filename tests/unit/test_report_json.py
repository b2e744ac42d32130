"""report.json, summary.md and the printed answer are what they were before the analysis returned
typed records (issue 34): every key in the same order with the same value, and the same text, on
- a known-truth world read from its tables by the real command (`orchestrator report DIR`);
- a sweep with stopped and failed trials and a wsd outlier, analysed by default and by fewest
  steps to a named target, and its two smallest batch sizes alone (not resolved);
- worlds whose noise scale lies below and above the batch sizes swept (bounds), and far above
  (no trial finishes);
- two branch studies: one compared with a from-scratch sweep, one with a noisy eval set.

The files in tests/data/report_json/ were written by the same cases on commit 1f3fcfe, before the
change (report.json with the table folder's path as `<folder>`), then written again for the keys
and lines added since on purpose (where the settings came from, what to run, the trend in words;
issue 35's labels: the headline names its run's lr and the best interpolated lr by the table's
criterion; its branch reports: branch runs no longer `skipped`, the ramp's `ramp_overrides`, no
from-scratch tables in a branch study's summary, no table without rows; the `mixed` cases'
B_crit intervals once the analysis read its trials in one order, trials.in_one_order; issue 52:
the best configuration's settings as numbers, and the summary opening with the answer and its
decision figure; issue 57: the `imprecise` flag and its note where the interval does not hold
B_crit to within 20 %).
`python -m tests.unit.test_report_json DIR` writes what the code gives now, for a deliberate
change of the report.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from tests.conftest import ROOT
from tests.known_truth import BATCHES, World, factor_grid

GOLDEN = ROOT / "tests" / "data" / "report_json"
LRS = factor_grid(0.001, 0.032)
FOLDER = "<folder>"
"""What the table folder's path reads as in the stored files (it is a temporary folder)."""


# ---------------------------------------------------------------- the cases


def mixed_trials() -> list:
    """4 batch sizes x 3 lrs x 2 seeds at constant decay; one run at wsd, one stopped by the
    scheduler, one diverged; ids and wall times as a real sweep logs them."""
    world = World(max_points=200, draw=2)
    constant = world.with_(decay="constant")
    trials = constant.trials(constant.grid(batches=(256, 512, 1024, 2048), lrs=(0.004, 0.008, 0.016), seeds=2))
    (wsd,) = world.trials(world.simulate([(1024, 0.008, 0)]))
    (poor,) = world.trials(world.simulate([(1024, 0.001, 0)]))
    trials.append(dataclasses.replace(wsd, name=wsd.name + " wsd", _fits={}))
    early = [(t, v) for t, v in poor.eval if t <= 2**18]
    trials.append(
        dataclasses.replace(poor, status="KILLED", stopped_at=2**18, train=poor.train[:50], eval=early, _fits={})
    )
    trials += world.trials(world.simulate([(2048, 0.064, 0)]))  # diverges
    for i, t in enumerate(trials):
        t.run_id, t.trial_id, t.duration_s = f"run{i:02d}", f"trial_{i:05d}", 10.0 + i
    return trials


def bounded_trials(b_noise: float) -> list:
    """A world whose noise scale lies outside the batch sizes swept: B_crit is only a bound."""
    world = World(max_points=200, draw=3, b_noise=b_noise)
    return world.trials(world.grid(batches=(256, 512, 1024, 2048), lrs=(0.004, 0.008, 0.016), seeds=2))


def branch_trials(**changes) -> list:
    from tests.unit.test_branch_analysis import study_trials

    return study_trials(**changes)


def scratch_trials() -> list:
    world = World(draw=0)
    return world.trials(world.grid(lrs=LRS))


CASES = {
    "mixed": (mixed_trials, {}),
    "mixed-steps": (mixed_trials, {"lr_criterion": "steps", "primary_target": 3.6, "target_losses": [3.3, 3.9]}),
    "below": (lambda: bounded_trials(40.0), {}),
    "above": (lambda: bounded_trials(3000.0), {}),
    "none-finished": (lambda: bounded_trials(1e5), {}),
    "two-batch-sizes": (lambda: [t for t in mixed_trials() if t.batch in (256, 512)], {}),
    "branch-compared": (branch_trials, {"compare_with": ("scratch", scratch_trials)}),
    "branch-noisy": (lambda: branch_trials(eval_se=0.004, rates=(0.02, 0.03, 0.05)), {}),
}
"""name: (the trials, the analysis's options; compare_with's runs made when the case runs)."""


def world_folder(folder: Path) -> Path:
    """A known-truth world's tables, as any trainer would write them."""
    world = World(draw=1)
    return world.write(world.grid(batches=BATCHES[1:5], lrs=LRS[1:], seeds=2), folder)


# ---------------------------------------------------------------- what the code gives now


def in_memory(name: str, out: Path) -> Tuple[Dict[str, Any], str, str]:
    """(report.json, summary.md, the printed lines) of a case analysed in memory and written to `out`."""
    from orchestrator.analysis import sweep_analysis
    from orchestrator.reporting import report_files, report_render

    make, options = CASES[name]
    options = dict(options)
    if "compare_with" in options:
        label, runs = options["compare_with"]
        options["compare_with"] = (label, runs())
    trials = make()
    answer = sweep_analysis.analyse(trials, **options)
    report_files.write_report(trials, answer, name, out)
    printed = "\n".join(report_render.summary_lines(answer)) + "\n"
    return json.loads((out / "report.json").read_text()), (out / "summary.md").read_text(), printed


def from_tables(tmp: Path, capsys) -> Tuple[Dict[str, Any], str, str]:
    """The same of `orchestrator report DIR` on the world's tables, the folder's path as FOLDER."""
    from orchestrator import cli

    folder = world_folder(tmp / "world")
    assert cli.main(["report", str(folder), "--out", str(tmp / "report")]) == 0
    printed = capsys.readouterr().out.replace(str(folder), FOLDER).replace(str(tmp / "report"), "<out>")
    written = json.loads((tmp / "report" / "report.json").read_text())
    written["source"]["uri"] = written["source"]["uri"].replace(str(folder), FOLDER)
    return written, (tmp / "report" / "summary.md").read_text().replace(str(folder), FOLDER), printed


# ---------------------------------------------------------------- the comparison


def same(now: Any, before: Any, where: str = "report.json") -> List[str]:
    """Where `now` differs from `before`: dict keys (and their order), list lengths, types and values;
    floats to 1e-9 relative or 1e-12 absolute (a machine's BLAS may move the last bits)."""
    if isinstance(before, dict):
        if not isinstance(now, dict) or list(now) != list(before):
            return [f"{where}: keys {list(now) if isinstance(now, dict) else type(now)} != {list(before)}"]
        return [d for k in before for d in same(now[k], before[k], f"{where}.{k}")]
    if isinstance(before, list):
        if not isinstance(now, list) or len(now) != len(before):
            return [f"{where}: {now!r} != {before!r}"]
        return [d for i, (a, b) in enumerate(zip(now, before)) for d in same(a, b, f"{where}[{i}]")]
    if isinstance(before, float) and isinstance(now, float):
        return [] if math.isclose(now, before, rel_tol=1e-9, abs_tol=1e-12) else [f"{where}: {now!r} != {before!r}"]
    return [] if type(now) is type(before) and now == before else [f"{where}: {now!r} != {before!r}"]


def check(name: str, now: Tuple[Dict[str, Any], str, str]) -> None:
    written, summary, printed = now
    before = json.loads((GOLDEN / f"{name}.json").read_text())
    differences = same(written, before)
    assert not differences, "\n".join(differences[:20])
    assert summary == (GOLDEN / f"{name}.md").read_text()
    assert printed == (GOLDEN / f"{name}.txt").read_text()


@pytest.mark.parametrize("name", list(CASES))
def test_report_json_summary_and_answer_are_as_before(name, tmp_path):
    check(name, in_memory(name, tmp_path))


def test_report_of_a_table_folder_is_as_before(tmp_path, capsys):
    check("world-tables", from_tables(tmp_path, capsys))


def main(out: Path) -> None:
    """Write every case's files to `out`, named as in GOLDEN."""

    class Capture:  # capsys's readouterr, for a run outside pytest
        def readouterr(self):
            text = sys.stdout.getvalue()
            sys.stdout.seek(0)
            sys.stdout.truncate()
            return type("Captured", (), {"out": text})

    import io
    import tempfile

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: in_memory(name, Path(tmp) / name) for name in CASES}
        real, sys.stdout = sys.stdout, io.StringIO()
        try:
            results["world-tables"] = from_tables(Path(tmp) / "tables", Capture())
        finally:
            sys.stdout = real
    for name, (written, summary, printed) in results.items():
        (out / f"{name}.json").write_text(json.dumps(written, indent=2) + "\n")
        (out / f"{name}.md").write_text(summary)
        (out / f"{name}.txt").write_text(printed)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
