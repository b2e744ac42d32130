"""Figures a paper would use (issue 52): the loss curves as a grid of small panels, one per batch
size, one line per lr, the seed mean smoothed with a band across seeds; the B x lr heat map on the
seed means the table shows, its best cell boxed; tokens and steps to a target against B with the
perfect-scaling line and the fitted hyperbola; stars on loss_vs_lr only where nothing measured
beside them is better; and summary.html opening with the answer and the decision figure.

Each figure is a matplotlib Figure of a known-truth world's report built in memory (4 batch sizes x
5 lrs x 2 seeds, the highest lrs failing at the smaller batch sizes), read back through its artists
and checked against numbers computed here from the world's trials with numpy."""

from __future__ import annotations

import math
import re
from collections import defaultdict

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.patches import Rectangle

from orchestrator.analysis import sweep_analysis
from orchestrator.analysis.trials import LR_KEY
from orchestrator.reporting import report_files, report_tradeoff
from orchestrator.reporting.report_format import fmt_tokens
from tests.known_truth import World, factor_grid

BATCHES = (256, 512, 1024, 2048)
LRS = factor_grid(0.002, 0.032)
WORLD = World(max_points=300, draw=5)
WINDOW = 1.15
"""The smoothing the loss panels state: each point the mean of the points within x 1.15 in tokens."""


@pytest.fixture(scope="module")
def world():
    trials = WORLD.trials(WORLD.grid(batches=BATCHES, lrs=LRS, seeds=2))
    answer = sweep_analysis.analyse(trials)
    figs = dict(report_files.figures(trials, answer, "figures"))
    yield trials, answer, figs
    for fig in figs.values():
        plt.close(fig)


def _lr(t) -> float:
    return float(f"{t.lr:.3g}")


def _seed_mean(seeds, grid, scale):
    """The mean over the seeds present at each grid x of each seed's train/loss, smoothed by the
    window mean within x WINDOW (brute force) and interpolated in log x; NaN where none is."""
    rows = []
    for t in seeds:
        x, y = np.asarray(t.train.tokens, float), np.asarray(t.train.values, float)
        keep = (x > 0) & np.isfinite(y)
        x, y = x[keep] / scale, y[keep]
        smoothed = np.array([y[(x >= v / WINDOW) & (x <= v * WINDOW)].mean() for v in x])
        row = np.interp(np.log(grid), np.log(x), smoothed)
        rows.append(np.where((grid >= x[0]) & (grid <= x[-1]), row, np.nan))
    rows = np.array(rows)
    count = np.isfinite(rows).sum(axis=0)
    return np.where(count > 0, np.nansum(rows, axis=0) / np.maximum(count, 1), np.nan)


# ---------------------------------------------------------------- 1. loss curves


@pytest.mark.parametrize("name", ["loss_vs_tokens.png", "loss_vs_steps.png"])
def test_loss_curves_are_a_panel_per_batch_size_a_line_per_lr_the_smoothed_seed_mean_in_a_band(world, name):
    trials, _, figs = world
    fig = figs[name]
    assert "mean over seeds" in fig.get_suptitle() and "smoothed" in fig.get_suptitle()
    panels = [ax for ax in fig.axes if ax.get_lines()]
    assert len(panels) == len(BATCHES)
    for ax, batch in zip(panels, BATCHES):
        assert ax.get_title() == f"B = {fmt_tokens(batch)}"
        seeds = defaultdict(list)
        for t in trials:
            if t.batch == batch:
                seeds[_lr(t)].append(t)
        lines = {float(line.get_label().removeprefix("lr ")): line for line in ax.get_lines()}
        assert sorted(lines) == sorted(seeds), batch  # one line per lr, nothing else
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(bands) == sum(len(s) > 1 for s in seeds.values())
        for lr, line in lines.items():
            xs, ys = map(np.asarray, line.get_data())
            expected = _seed_mean(seeds[lr], xs, batch if name == "loss_vs_steps.png" else 1.0)
            assert np.isfinite(ys).sum() > 50
            assert np.allclose(ys, expected, equal_nan=True, rtol=1e-9), (batch, lr)


# ---------------------------------------------------------------- 2. the heat map


def test_the_heat_map_shows_the_seed_means_of_the_table_and_boxes_the_best_configuration(world):
    trials, answer, figs = world
    ax = figs["eval_heatmap.png"].axes[0]
    grid = np.ma.filled(ax.images[0].get_array().astype(float), np.nan)
    rows = [float(t.get_text()) for t in ax.get_yticklabels()]
    cols = [t.get_text() for t in ax.get_xticklabels()]
    assert cols == [fmt_tokens(b) for b in BATCHES]
    finals = defaultdict(list)  # (lr, B) -> each seed's final loss, None where it did not finish
    for t in trials:
        finals[_lr(t), t.batch].append(t.final(answer.loss_metric) if t.outcome == "finished" else None)
    for (lr, batch), values in finals.items():  # a configuration with a failed seed is blank
        mean = np.mean(values) if None not in values else np.nan
        assert np.allclose(grid[rows.index(lr), cols.index(fmt_tokens(batch))], mean, equal_nan=True), (lr, batch)
    for r in answer.best_per_batch:  # the table's final loss is its column's lowest cell, at its lr
        j = cols.index(fmt_tokens(r.batch))
        assert grid[rows.index(float(r.settings[LR_KEY])), j] == pytest.approx(r.final_loss, rel=1e-12)
        assert np.nanmin(grid[:, j]) == pytest.approx(r.final_loss, rel=1e-12)
    best = answer.best
    i, j = rows.index(float(best.settings[LR_KEY])), cols.index(fmt_tokens(best.batch))
    boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert [(b.get_xy(), b.get_width(), b.get_height()) for b in boxes] == [((j - 0.5, i - 0.5), 1, 1)]
    assert "best configuration" in boxes[0].get_label()
    rec = answer.recommendation
    (marker,) = [line for line in ax.get_lines() if line.get_label().startswith("recommended")]
    x = np.interp(math.log(rec.tokens_per_update), np.log(BATCHES), range(len(BATCHES)))
    y = np.interp(math.log(rec.lr), np.log(rows), range(len(rows)))
    assert np.allclose(np.ravel(marker.get_data()), [x, y])
    assert "mean over seeds" in ax.get_title()


# ---------------------------------------------------------------- 3. tokens and steps to a target


def test_tokens_and_steps_to_a_target_against_b_show_the_points_the_fit_and_perfect_scaling(world):
    _, answer, figs = world
    fig = figs["critical_batch.png"]
    by_y = {ax.get_ylabel(): ax for ax in fig.axes}
    tokens, steps = by_y["tokens from L_a to the target"], by_y["optimizer steps from L_a to the target"]
    for ax in (tokens, steps):
        assert ax.get_xlabel() == "batch size (tokens per update)"
    fits = [f for f in answer.critical_batch if f.points and f.s_min and f.e_min]
    assert len(fits) == 3
    for f in fits:
        lines = {(ax is tokens, line.get_gid()): line for ax in (tokens, steps) for line in ax.get_lines()}
        bs = [p.batch for p in f.points]
        for is_tokens, measured in ((True, [p.tokens for p in f.points]), (False, [p.steps for p in f.points])):
            xs, ys = lines[is_tokens, f"measured {f.target_loss:.6g}"].get_data()
            assert np.allclose(xs, bs) and np.allclose(ys, measured)
            xs, ys = map(np.asarray, lines[is_tokens, f"fit {f.target_loss:.6g}"].get_data())
            fitted = f.s_min * xs + f.e_min if is_tokens else f.s_min + f.e_min / xs
            assert xs.min() < min(bs) and xs.max() > max(bs) and np.allclose(ys, fitted)
            xs, ys = map(np.asarray, lines[is_tokens, f"perfect {f.target_loss:.6g}"].get_data())
            perfect = np.full_like(xs, f.e_min) if is_tokens else f.e_min / xs  # tokens constant, steps ~ 1/B
            assert len(xs) >= 2 and np.allclose(ys, perfect)
    legend = [t.get_text() for t in tokens.get_legend().get_texts()]
    assert any(text.startswith("perfect scaling") for text in legend)


# ---------------------------------------------------------------- 4. stars on loss vs lr


def test_a_star_on_loss_vs_lr_is_below_every_measured_point_beside_it_else_a_model_optimum(world):
    _, answer, figs = world
    ax = figs["loss_vs_lr.png"].axes[0]
    scans = {}
    for container in ax.containers:
        lrs, means = map(np.asarray, container.lines[0].get_data())
        scans[tuple(container.lines[0].get_color())] = (lrs, means)
    model = 0
    for line in ax.get_lines():
        if not len(line.get_xdata()) or line.get_marker() not in ("*", "D"):
            continue
        (lr,), (loss,) = line.get_data()
        lrs, means = scans[tuple(line.get_color())]
        below, above = lrs[lrs <= lr * (1 + 1e-9)], lrs[lrs >= lr * (1 - 1e-9)]
        if not len(below) or not len(above):  # past the lrs drawn: nothing measured on one side
            assert line.get_marker() == "D", lr
            continue
        beside = means[(lrs >= below.max()) & (lrs <= above.min())]
        if line.get_marker() == "*":
            assert loss <= beside.min() + 1e-12, (lr, loss, beside)
        else:
            assert loss > beside.min()
            model += 1
    assert model >= 1, "the world should interpolate an optimum above a measured point, or this proves nothing"
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(text.startswith("model optimum") for text in texts)


# ---------------------------------------------------------------- 5. the summary's order


def _images(page: str):
    return re.findall(r"src='([^']+)'", page)


def test_the_summary_opens_with_the_answer_and_the_decision_figure_and_the_panels_come_last(world, tmp_path):
    trials, answer, _ = world
    report_files.write_report(trials, answer, "figures", tmp_path)
    page, md = (tmp_path / "summary.html").read_text(), (tmp_path / "summary.md").read_text()
    images = _images(page)
    assert images[0] == "loss_vs_tokens_best.png"  # no loss surface's trade-off here: the best runs
    assert page.index("Best configuration: B =") < page.index("src='loss_vs_tokens_best.png'")
    assert page.index("src='loss_vs_tokens_best.png'") < page.index("Best configuration per batch size")
    clean = ["critical_batch.png", "loss_vs_lr.png", "eval_heatmap.png", "lr_vs_batch.png"]
    assert max(images.index(f) for f in clean) < images.index("loss_vs_tokens.png") < images.index("loss_vs_steps.png")
    assert sorted(images) == sorted(set(images))  # each once
    assert re.findall(r"\]\(([^)]+\.png)\)", md) == images


def test_the_trade_off_figure_is_the_decision_figure_where_the_loss_surface_has_one(tmp_path):
    from tests.basin_truth import BasinWorld

    world = BasinWorld()
    trials = world.trials([world.rungs()[4]])
    answer = sweep_analysis.analyse(trials, loss_tolerance=0.004)
    assert answer.recommendation.found is not None
    report_files.write_report(trials, answer, "one-rung", tmp_path)
    page = (tmp_path / "summary.html").read_text()
    images = _images(page)
    assert images[0] == report_tradeoff.FIGURE and images.count(report_tradeoff.FIGURE) == 1
    assert page.index("Best configuration: B =") < page.index(f"src='{report_tradeoff.FIGURE}'")
    assert images.index("loss_vs_tokens_best.png") < images.index("loss_vs_tokens.png")
