"""Every label of a report names what its figure draws (issue 35): a curve names the lr its run was
trained at, and the best interpolated lr apart; a figure of final loss stars the final-loss optimum,
never the lr of fewest steps; the headline, the tables and the figures name one lr per batch size
per criterion; every loss axis has labelled ticks over the range it shows.

The figures are matplotlib Figures of a known-truth world's report (tests/known_truth.py) built in
memory, read back through their legends and the data of their lines, and checked against the
world's own trials: which run a line draws is found from its data, not from its label."""

from __future__ import annotations

import re
from collections import defaultdict

import matplotlib.pyplot as plt
import numpy as np
import pytest

from orchestrator.analysis import sweep_analysis
from orchestrator.reporting import report_files, report_render
from orchestrator.reporting.comparison_plots import smooth
from orchestrator.reporting.report_format import lr_text
from tests.known_truth import World, factor_grid

BATCHES = (256, 512, 1024, 2048)
LRS = factor_grid(0.002, 0.032)
WORLD = World(max_points=300, draw=5)
WARMUPS = (WORLD.warmup_tokens, 4 * WORLD.warmup_tokens)
"""A second swept axis, so that a batch size's lr scan is one configuration's, not every trial's."""
LABEL = re.compile(r"^B = ([\d,]+), run at lr (\S+) \(best interpolated lr: (.+)\)$")


@pytest.fixture(scope="module")
def trials():
    trials = []
    for warmup in WARMUPS:
        world = WORLD.with_(warmup_tokens=warmup)
        runs = world.grid(batches=BATCHES, lrs=LRS, seeds=2)
        for run in runs:
            run.name += f" warmup={warmup}"
        trials += world.trials(runs)
    return trials


@pytest.fixture(scope="module", params=["final_loss", "steps"])
def report(request, trials):
    answer = sweep_analysis.analyse(trials, lr_criterion=request.param)
    figs = dict(report_files.figures(trials, answer, "labels"))
    yield answer, figs
    for fig in figs.values():
        plt.close(fig)


def _batch(text: str) -> int:
    return int(text.replace(",", ""))


def _config_means(trials, batch):
    """(lr, warmup) -> mean final eval/loss over the seeds, of the configurations at `batch` whose
    every seed finished: what 'best by final loss' picks among, computed from the world's runs."""
    finals = defaultdict(list)
    for t in trials:
        if t.batch == batch:
            finals[t.lr, t.params["schedule.warmup_tokens"]].append(t.eval[-1][1] if t.outcome == "finished" else None)
    return {key: float(np.mean(v)) for key, v in finals.items() if None not in v}


def test_a_curve_names_the_lr_its_run_was_trained_at(report, trials):
    answer, figs = report
    (ax, _bar) = figs["loss_vs_tokens_best.png"].axes
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    labelled = {line.get_label(): line for line in ax.get_lines()}
    best_by_final_loss = answer.lrs_by("final_loss")
    curves = [text for text in texts if text.startswith("B = ")]
    assert len(curves) == len(BATCHES)
    for text in curves:
        batch, run_lr, best_lr = LABEL.match(text).groups()
        xs, ys = labelled[text].get_data()
        drawn = [  # the runs whose smoothed train/loss is the line: found from the data alone
            t
            for t in trials
            if t.batch == _batch(batch)
            and len(t.train) - 1 == len(xs)
            and np.allclose(smooth(*zip(*[p for p in t.train if p[0] > 0])), ys)
        ]
        assert len(drawn) == 1, text
        (run,) = drawn
        assert run_lr == f"{run.lr:.3g}", f"{text!r} draws the run trained at lr {run.lr}"
        wanted = best_by_final_loss[run.batch]
        assert best_lr == lr_text(wanted.lr, wanted.edge)
        means = _config_means(trials, run.batch)  # the drawn run is the best configuration's better seed
        key = (run.lr, run.params["schedule.warmup_tokens"])
        assert means[key] == min(means.values()), text
        mates = [t for t in trials if t.batch == run.batch and (t.lr, t.params["schedule.warmup_tokens"]) == key]
        assert run.eval[-1][1] == min(t.eval[-1][1] for t in mates)


def test_the_final_loss_figure_stars_the_final_loss_optimum_of_what_it_draws(report, trials):
    answer, figs = report
    ax = figs["loss_vs_lr.png"].axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "model optimum: best interpolated lr by final loss" in texts  # no star above a measured point
    stars = {  # a star, or a diamond where a measured point beside it is lower (test_report_figures.py)
        tuple(line.get_color()): line
        for line in ax.get_lines()
        if line.get_marker() in ("*", "D") and len(line.get_xdata())
    }
    best_rows = {r.batch: r for r in answer.best_per_batch}
    steps_lr = answer.lrs_by("steps")
    differs = 0
    for container in ax.containers:
        batch = _batch(container.get_label().removeprefix("B = "))
        line = container.lines[0]
        lrs, means = map(np.asarray, line.get_data())
        warmup = best_rows[batch].settings["schedule.warmup_tokens"]
        config = _config_means(trials, batch)  # the drawn points are the best configuration's lr scan
        scan = sorted((lr, m) for (lr, w), m in config.items() if w == str(warmup))  # settings may be typed
        assert np.allclose(lrs, [lr for lr, _ in scan], rtol=1e-3) and np.allclose(means, [m for _, m in scan])
        (star_lr,) = stars[tuple(line.get_color())].get_xdata()
        assert star_lr == pytest.approx(answer.lrs_by("final_loss")[batch].lr, rel=1e-12)
        i = int(np.argmin(means))  # the parabola's vertex lies within a grid step of the best drawn point
        assert abs(np.log(star_lr / lrs[i])) <= np.log(2) + 1e-9, (batch, star_lr, lrs)
        differs += abs(np.log(steps_lr[batch].lr / star_lr)) > 0.01
    assert differs, "the world should give the two criteria different lrs, or the test proves nothing"


def _table_lrs(answer, criterion):
    """Batch size -> the best-lr cell of the per-batch table the report prints under `criterion`."""
    header, rows = report_render.per_batch_table(answer)
    assert header[1] == f"best lr ({report_render.CRITERIA[criterion]})"
    return {_batch(row[0]): row[1] for row in rows}


def test_headline_tables_and_figures_name_one_lr_per_batch_size_per_criterion(report):
    answer, figs = report
    criterion, words = answer.lr_criterion, report_render.CRITERIA[answer.lr_criterion]
    table = _table_lrs(answer, criterion)
    headline = re.search(r"Best interpolated lr at B = ([\d,]+) by (.+?): (\S+)\.", report_render.answer(answer))
    assert headline and headline[2] == words and headline[3] == table[_batch(headline[1])]
    assert f"trained at lr {answer.best.settings['optim.lr']}"[:20] in report_render.answer(answer)
    ax = figs["lr_vs_batch.png"].axes[0]
    (named,) = [line for line in ax.get_lines() if line.get_label() == f"best interpolated lr per batch size ({words})"]
    assert {int(b): f"{lr:.3g}" for b, lr in zip(*named.get_data())} == {
        b: cell.lstrip("<=> ") for b, cell in table.items()
    }
    final_loss_cells = {b: lr_text(r.lr, r.edge) for b, r in answer.lrs_by("final_loss").items()}
    curve_labels = [t.get_text() for t in figs["loss_vs_tokens_best.png"].axes[0].get_legend().get_texts()]
    named_in_curves = {_batch(m[1]): m[3] for m in map(LABEL.match, curve_labels) if m}
    assert named_in_curves == final_loss_cells
    if criterion == "final_loss":
        assert named_in_curves == table
    primary = answer.primary.target_loss
    doc = report_render.document(answer, "labels", [])
    cost = next(doc[i + 1] for i, b in enumerate(doc) if b == ("h3", f"Cost to reach loss {primary:.4g}"))
    column = cost[1].index("lr of fewest steps")
    steps_cells = {b: lr_text(r.lr, r.edge) for b, r in answer.lrs_by("steps").items()}
    assert {_batch(row[0]): row[column] for row in cost[2]} == steps_cells
    if criterion == "steps":
        assert steps_cells == table


def test_every_loss_axis_has_labelled_ticks_over_its_range(report):
    _, figs = report
    checked = 0
    for name, fig in figs.items():
        fig.canvas.draw()
        for ax in fig.axes:
            for axis, label, limits in (
                (ax.xaxis, ax.get_xlabel(), ax.get_xlim()),
                (ax.yaxis, ax.get_ylabel(), ax.get_ylim()),
            ):
                if "loss" not in label:
                    continue
                low, high = sorted(limits)
                ticks = [
                    (tick.get_loc(), tick.label1.get_text())
                    for tick in axis.get_major_ticks() + axis.get_minor_ticks()
                    if tick.label1.get_text() and low <= tick.get_loc() <= high
                ]
                values = sorted(v for v, _ in ticks)
                assert len(ticks) >= 4, (name, label, ticks)
                assert len({text for _, text in ticks}) == len(ticks), (name, label, ticks)
                for value, text in ticks:  # each label states its tick's value
                    digits = len(text.split(".")[1]) if "." in text else 0
                    assert abs(float(text.replace("−", "-")) - value) <= 0.5 * 10**-digits + 1e-12, (name, text, value)
                gaps = np.diff([low, *values, high])
                assert gaps.max() <= 0.4 * (high - low), (name, label, values, limits)
                checked += 1
    assert checked >= 5  # loss vs tokens, vs steps, of the best runs, vs lr, and the target-loss axis
