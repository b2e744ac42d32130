"""The files of a report and where they go: report.json (the answer's `to_json`), the figures
(plots.py, comparison_plots.py) and summary.md and summary.html (report_render.py), into a folder
that is new, empty or a report's own (docs/security.md). No MLflow: the report pipeline
(pipeline.py) logs what this module writes."""

from __future__ import annotations

import errno
import itertools
import json
import math
import os
import re
import secrets
import shutil
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from orchestrator.analysis import branch_analysis, sweep_analysis, tables
from orchestrator.analysis.answer import Answer
from orchestrator.analysis.trials import LR_KEY, RAMP_CHANGE_KEY, Trial, by_batch
from orchestrator.core import validation
from orchestrator.core.errors import ConfigError
from orchestrator.reporting import recommended, report_tradeoff
from orchestrator.reporting.report_format import json_safe, to_html, to_markdown
from orchestrator.reporting.report_render import CRITERIA, document

# ---------------------------------------------------------------- where

MARKER = "report.json"
"""Written first into a report's folder: a folder holding it is one a report wrote."""
OWNED = (MARKER, "summary.md", "summary.html", tables.TRIALS, tables.CURVES) + (
    "loss_vs_tokens.png",
    "loss_vs_steps.png",
    "branch_cbs.png",
    "eval_heatmap.png",
    "critical_batch.png",
    "lr_vs_batch.png",
    "loss_vs_tokens_best.png",
    "critical_batch_vs_loss.png",
    "b_simple_vs_tokens.png",
    "loss_vs_lr.png",
    "ladder_b_opt.png",
    "ladder_b_crit.png",
    "ladder_lr_opt.png",
    "ladder_b_star.png",
    report_tradeoff.FIGURE,
    recommended.FILE,
)
"""The files a report writes into its folder: the only ones it writes or replaces there (docs/security.md)."""


def default_out(name: str) -> Path:
    """reports/<name>, the name made one plain folder name (validation.plain_name: the project's
    rule for a name that becomes a folder)."""
    folder = re.sub(r"[^\w.-]+", "_", name)
    try:
        validation.plain_name("--out", folder)
    except ConfigError as exc:
        raise ConfigError("--out", f"no default folder for the name {name!r} ({exc.message}); give --out DIR") from None
    return Path("reports") / folder


def check_out_folder(out: Path, tables_folder: Optional[Path] = None) -> None:
    """Before anything is written: `out` is new, empty, or a folder a report wrote (its report.json
    is one a report wrote) with nothing in it but the files a report writes; never the folder the
    tables are read from. So a report replaces only its own files, and a re-run into the same
    folder works."""
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{out} is a file; give a new folder, an empty one or one a report wrote")
    if out.is_symlink() and not out.exists():
        raise ConfigError("--out", f"{out} is a link to nothing; give a new folder, an empty one or one a report wrote")
    above = next((p for p in out.absolute().parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError("--out", f"{above} is a file, so no folder can be made under it; give another --out")
    if tables_folder is not None and out.resolve() == tables_folder.resolve():
        raise ConfigError(
            "--out", f"{out} is the folder the tables are read from, which report never rewrites; give another"
        )
    entries = sorted(out.iterdir()) if out.is_dir() else []
    if entries and (out / MARKER).is_file() and not written_by_a_report(out / MARKER):
        raise ConfigError(
            "--out", f"{out / MARKER} is not one a report wrote; give a new folder, an empty one or one a report wrote"
        )
    ours = written_by_a_report(out / MARKER)
    foreign = [e for e in entries if not ours or e.name not in OWNED or e.is_symlink() or not e.is_file()]
    if foreign:
        raise ConfigError(
            "--out",
            f"{foreign[0]} is not a file a report wrote there ({MARKER} marks its folder); give a new folder, an "
            "empty one or one a report wrote",
        )


def written_by_a_report(path: Path) -> bool:
    """`path` is a report.json a report wrote: a JSON object holding the report's name and its
    critical_batch list. A user's own report.json is not taken for one, so a folder holding it is
    never replaced."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("name"), str) and isinstance(data.get("critical_batch"), list)


@contextmanager
def staged(out: Path, tables_folder: Optional[Path] = None) -> Iterator[Path]:
    """A new folder beside `out` to write the report into, moved into place whole when the block
    ends, replacing the report folder there (check_out_folder accepts it, again at the move); when
    the block fails, removed with the folders made for it, and `out` is as it was. So a full disk
    leaves no half-written report, and two reports into one folder at once leave one of them whole,
    never a mix or an earlier report's stale files (each move is one rename of a whole folder)."""
    check_out_folder(out, tables_folder)
    if out.is_symlink():  # replace the folder it names, not the link
        out = out.resolve()
    made = [p for p in reversed(out.absolute().parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = _sibling(out, "staged")
    try:
        yield stage
        _move_into_place(stage, out, tables_folder)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        for folder in reversed(made):
            with suppress(OSError):  # only if nothing else was put there meanwhile
                folder.rmdir()
        raise


def _sibling(out: Path, kind: str) -> Path:
    """A new hidden folder beside `out`, of a name no other process picks."""
    folder = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.{kind}"
    folder.mkdir()
    return folder


def _move_into_place(stage: Path, out: Path, tables_folder: Optional[Path]) -> None:
    """`stage` renamed to `out`: onto nothing or an empty folder at once; over a report's folder by
    moving that aside first and removing it. Another report may move its own into place between
    the two renames: then it is moved aside in turn, so the last to finish wins, whole."""
    while True:
        try:
            os.rename(stage, out)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        check_out_folder(out, tables_folder)  # what is there now is still a report's to replace
        aside = _sibling(out, "replaced")
        try:
            os.rename(out, aside)
        except FileNotFoundError:  # another report moved it aside first
            aside.rmdir()
            continue
        shutil.rmtree(aside)


# ---------------------------------------------------------------- writing


def figures(trials: Sequence[Trial], answer: Answer, name: str) -> Iterator[Tuple[str, Any]]:
    """(file, matplotlib figure) of the report in the order a reader wants them (summary.md and
    summary.html show them so): the decision figure first (the trade-off where the sweep's loss
    surface has one, else the best run per batch size), then the comparisons of batch sizes, and
    every run's curves last. Each is drawn when asked for: write_report saves and closes one before
    the next is drawn, so a report of hundreds of trials holds one figure's artists at a time."""
    from orchestrator.reporting import comparison_plots as cp

    usable = [t for t in trials if t.batch and t.train]
    if answer.branch:  # a branch study: one base run, so no from-scratch comparison to draw
        curves = [{"batch": t.batch, "train": drawn(t.train), "eval": drawn(t.eval)} for t in usable]
        yield from branch_figures(trials, answer, name, curves)
        return
    found = answer.recommendation.found if answer.recommendation else None
    if found is not None:  # its own loss surface's trade-off, with the measured best loss per batch size
        loss = found.loss_optimal.predicted_loss.value
        measured = [(r.batch, r.final_loss / loss - 1) for r in answer.best_per_batch]
        title = f"{name}: the batch-size trade-off at its budget"
        yield report_tradeoff.FIGURE, report_tradeoff.figure(found, [("best loss per batch size", measured)], title)
    yield from comparison_figures(usable, answer)
    scans = cp.best_scans(usable, answer.best_per_batch, answer.axes)
    yield "loss_vs_tokens.png", cp.loss_panels(scans, "tokens", f"{name}: loss vs tokens per batch size and lr")
    yield "loss_vs_steps.png", cp.loss_panels(scans, "steps", f"{name}: loss vs optimizer steps per batch size and lr")


def seed_means(usable: Sequence[Trial], metric: str, axes: Sequence[str]) -> List[Tuple[float, int, float]]:
    """(lr, B, final loss) of every configuration with an lr: its mean over its seeds as
    sweep_analysis.best_per_batch scores it (scored_scans), so the heat map's cells are the numbers
    of the table of the best configuration per batch size."""
    return [
        (config.lr, batch, loss)
        for batch, group in by_batch(usable).items()
        for scan, _, losses in sweep_analysis.scored_scans(group, axes, metric)
        for config, loss in zip(scan, losses)
        if config.lr
    ]


DRAWN_POINTS = 400
"""The most points of one curve a figure of every trial draws: more than a 960-pixel-wide figure
shows, and the figure's cost stays flat however long the runs logged."""


def drawn(curve: Sequence[Tuple[int, float]], most: int = DRAWN_POINTS) -> Sequence[Tuple[int, float]]:
    """The curve thinned to at most `most` points evenly spaced in log position (the figures' x axes
    are logarithmic), its first and last point kept."""
    if len(curve) <= most:
        return curve
    keep = np.unique(np.geomspace(1, len(curve), most).astype(int) - 1)
    return [curve[i] for i in keep] + ([curve[-1]] if keep[-1] != len(curve) - 1 else [])


def branch_figures(
    trials: Sequence[Trial], answer: Answer, name: str, curves: List[Dict[str, Any]]
) -> Iterator[Tuple[str, Any]]:
    """A branch study's: the base run's loss with its branches', and the critical batch size along
    training. (No loss vs steps: a branch's steps count from the base's start at another batch.)"""
    from orchestrator.reporting import plots

    base = branch_analysis.base_of(trials)
    b_simple = base.b_simple if base else []
    branches = [  # each coloured by its own batch, the one it switched to at its branch point
        {"batch": t.number(RAMP_CHANGE_KEY, int), "train": drawn(t.train), "eval": drawn(t.eval)}
        for t in trials
        if branch_analysis.is_branch(t) and t.train and t.number(RAMP_CHANGE_KEY, int)
    ]
    title = f"{name}: loss vs tokens of the base run and its branches"
    yield "loss_vs_tokens.png", plots.loss_by_batch(curves + branches, "tokens", title)
    yield "branch_cbs.png", plots.branch_cbs(list(answer.branch.points), answer.branch.fit, b_simple)


def comparison_figures(usable: Sequence[Trial], answer: Answer) -> Iterator[Tuple[str, Any]]:
    """The figures that compare batch sizes at their chosen learning rates (plots.py,
    comparison_plots.py), the one a decision rests on first."""
    from orchestrator.reporting import comparison_plots as cp
    from orchestrator.reporting import plots

    metric = answer.loss_metric
    chosen = cp.best_trials(usable, answer.best_per_batch)  # by final loss: so is the lr their labels name
    if chosen:
        yield "loss_vs_tokens_best.png", cp.best_lr_curves(chosen, answer.lrs_by("final_loss"))
    fits = [  # the hyperbola is drawn whatever the status: the fit's B_crit
        {
            "target_loss": f.target_loss,
            "points": [(p.batch, p.steps, p.tokens) for p in f.points],
            "s_min": f.s_min,
            "e_min": f.e_min,
            "b_crit": f.b_crit_fit,
        }
        for f in answer.critical_batch
        if f.points
    ]
    if fits:
        yield "critical_batch.png", plots.critical_batch(fits)
    if any(t.lr for t in usable):
        yield "loss_vs_lr.png", cp.loss_vs_lr(usable, metric, answer.best_per_batch, answer.axes)
    cells = seed_means(usable, metric, answer.axes)
    if any(math.isfinite(loss) for _, _, loss in cells):
        best, rec = answer.best, answer.recommendation
        boxed = (float(best.settings[LR_KEY]), best.batch) if best and best.settings.get(LR_KEY) else None
        marked = (rec.tokens_per_update, rec.lr) if rec else None
        yield "eval_heatmap.png", plots.lr_batch_heatmap(cells, f"final {metric}", boxed, marked)
    best_lr, scaling = answer.best_lr, answer.lr_scaling
    if any(r.lr for r in best_lr):
        fit = (scaling.coef, scaling.alpha) if scaling.alpha is not None else None
        tried, named = [(t.batch, t.lr) for t in usable if t.lr], [(r.batch, r.lr) for r in best_lr if r.lr]
        yield "lr_vs_batch.png", plots.lr_vs_batch(tried, named, fit, CRITERIA[answer.lr_criterion])
    if any(f.b_crit or f.b_simple for f in answer.critical_batch):
        yield "critical_batch_vs_loss.png", cp.critical_batch_vs_loss(answer.critical_batch)
    if any(t.b_simple for t in chosen):
        yield "b_simple_vs_tokens.png", cp.b_simple_over_training(chosen)


@dataclass(frozen=True)
class Part:
    """What a report adds beside the single-sweep answer (a ladder's: report_ladder.part)."""

    json: Dict[str, Any]
    """Top-level keys of report.json."""
    figures: Dict[str, Any]
    """{file in OWNED: matplotlib figure}."""
    blocks: List[tuple]
    """The summary's section, as report_render.document's blocks."""


def write_report(
    trials: Sequence[Trial], answer: Answer, name: str, out: Path, parts: Sequence[Part] = ()
) -> List[Path]:
    """report.json (it marks the folder as a report's), the figures and the summaries in `out`, a
    new folder (staged); each of `parts` after the answer."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    extra = {k: v for p in parts for k, v in p.json.items()}
    (out / MARKER).write_text(json.dumps(json_safe({"name": name, **answer.to_json(), **extra}), indent=2))
    written = [out / MARKER]
    part_figures = {f: fig for p in parts for f, fig in p.figures.items()}
    own = []
    for file, fig in itertools.chain(figures(trials, answer, name), part_figures.items()):
        assert file in OWNED, f"{file} is not in report_files.OWNED: a re-run would refuse the folder"
        fig.savefig(out / file, dpi=120)
        plt.close(fig)
        written.append(out / file)
        if file not in part_figures:  # a part lists its own figures
            own.append(file)
    doc = document(answer, name, [p.name for p in written[1:] if p.name in own], [b for p in parts for b in p.blocks])
    if not parts:  # a ladder recommends for its target (report_ladder), not for the mix of its rungs
        written += write_recommended(trials, answer, out)
    for file, text in (("summary.md", to_markdown(doc)), ("summary.html", to_html(doc, f"Report: {name}"))):
        (out / file).write_text(text)
        written.append(out / file)
    return written


def write_recommended(trials: Sequence[Trial], answer: Answer, out: Path) -> List[Path]:
    """recommended.yaml (recommended.for_answer): no file when there is nothing to recommend."""
    rec = recommended.for_answer(trials, answer)
    return [rec.write(out / recommended.FILE)] if rec else []
