"""The figures that compare batch sizes, each readable at a glance: batch sizes on one ordered
colour scale with a colour bar, token counts in one format (report_format.fmt_tokens), log axes with
plain labels.

- best_lr_curves: loss vs tokens of the best run per batch size (by final loss), smoothed, the
  raw points faint behind and the evaluations as dots, labelled with the lr the run was trained
  at and, apart, the best interpolated lr;
- critical_batch_vs_loss: B_crit (with its interval) and B_simple against the target loss;
- b_simple_over_training: the measured noise scale along training, per batch size (smoothed, raw
  faint behind);
- loss_vs_lr: final loss against the learning rate, one line per batch size, the final-loss
  optimum starred where nothing measured beside it is better, else marked as the model's optimum
  (how sensitive each batch size is to its learning rate);
- loss_panels: every run's loss as small panels, one per batch size, one line per lr through the
  lr scan of its best configuration: the seed mean of the smoothed curves, a band from their
  lowest to their highest.

Inputs are plain records (the analysis's `answer` records and `trials.Trial`s), so the figures are
tested on tables in memory.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib.pyplot as plt
import numpy as np

from orchestrator.analysis.answer import BestLr, BestRow, TargetFit
from orchestrator.analysis.trials import BATCH_KEY, LR_KEY, Trial, settings
from orchestrator.reporting.batch_colours import batch_scale
from orchestrator.reporting.plots import loss_ticks, lr_key, lr_scale, plain_log_ticks
from orchestrator.reporting.report_format import fmt_tokens, lr_text

BATCH_LABEL = "batch size (tokens per update)"
WINDOW = 1.15
"""The smoothing of the loss curves: each point the mean of the points within a factor 1.15 of its x."""
PANELS = 12
"""The most batch sizes loss_panels draws (evenly spread over those tried, smallest and largest kept)."""
GRID_POINTS = 200
"""The token positions (evenly spaced in log) a panel's seed means are taken at."""


def _colour_bar(fig, ax, mappable, batches: Sequence[float]) -> None:
    bar = fig.colorbar(mappable, ax=ax, label=BATCH_LABEL)
    bar.set_ticks(sorted(set(batches)))
    bar.set_ticklabels([fmt_tokens(b) for b in sorted(set(batches))])
    bar.minorticks_off()


def smooth(xs: Sequence[float], ys: Sequence[float], ratio: float = WINDOW) -> np.ndarray:
    """Each point's mean over the points within a factor `ratio` of its x on either side: a
    window of constant width on a log axis, so the early, steep part of a curve is not averaged
    with its late, flat part, and per-update noise is read through without shifting the curve."""
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    sums = np.concatenate([[0.0], np.cumsum(ys)])
    low, high = np.searchsorted(xs, xs / ratio, "left"), np.searchsorted(xs, xs * ratio, "right")
    return (sums[high] - sums[low]) / (high - low)


def best_trials(trials: Sequence[Trial], best_per_batch: Sequence[BestRow]) -> List[Trial]:
    """The run the analysis chose per batch size (best_per_batch's run_id: names may repeat), by
    batch size."""
    by_id = {t.run_id: t for t in trials}
    chosen = [by_id[r.run_id] for r in best_per_batch if r.run_id in by_id]
    return sorted(chosen, key=lambda t: t.batch)


def _token_axes(ax, ylabel: str) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax.xaxis, fmt_tokens, ax.get_xlim())
    ax.set_xlabel("tokens seen")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")


def best_lr_curves(chosen: Sequence[Trial], best_lr: Dict[int, BestLr], title: str = ""):
    """One curve per batch size: the chosen run's train/loss smoothed (raw faint behind), its
    eval/loss as dots. Its legend names the lr the drawn run was trained at, and beside it the
    best interpolated lr by final loss (`best_lr`), which no run may have been trained at."""
    fig, ax = plt.subplots(figsize=(8, 5))
    colour, mappable = batch_scale([t.batch for t in chosen])
    lows, firsts = [], []
    for t in chosen:
        points = [(x, y) for x, y in t.train if x > 0]  # log axis: not the point at 0
        if not points:
            continue
        xs, ys = map(np.asarray, zip(*points))
        ax.plot(xs, ys, "-", color=colour(t.batch), lw=0.6, alpha=0.25)
        label = f"B = {fmt_tokens(t.batch)}, run at lr {t.lr:.3g}" if t.lr else f"B = {fmt_tokens(t.batch)}"
        best = best_lr.get(t.batch)
        if best and best.lr:
            label += f" (best interpolated lr: {lr_text(best.lr, best.edge)})"
        smoothed = smooth(xs, ys)
        ax.plot(xs, smoothed, "-", color=colour(t.batch), lw=1.8, label=label)
        evals = [(x, y) for x, y in t.eval if x > 0]
        if evals:
            ax.plot(*zip(*evals), "o", color=colour(t.batch), ms=3.5, mec="white", mew=0.5)
        lows.append(min([smoothed.min(), *(y for _, y in evals)]))
        firsts.append(smoothed[0])
    ax.plot([], [], "k-", lw=1.8, label="train/loss, smoothed")
    ax.plot([], [], "ko", ms=3.5, label="eval/loss")
    if lows:  # the smoothed curves and the evaluations, not the raw noise or a diverged start
        ax.set_ylim(min(lows) * 0.97, max(firsts) * 1.03)
    _token_axes(ax, "loss")
    loss_ticks(ax.yaxis, ax.get_ylim())
    ax.set_title(title or "loss vs tokens of the best run per batch size (by final loss)", fontsize=10)
    ax.legend(fontsize=7)
    _colour_bar(fig, ax, mappable, [t.batch for t in chosen])
    fig.tight_layout()
    return fig


def critical_batch_vs_loss(fits: Sequence[TargetFit]):
    """B_crit per target loss (a dot with its 90% interval; a triangle where only a bound is
    known) and B_simple at the same losses. The x axis runs from high loss to low, as training."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    shown = [f for f in fits if f.b_crit]
    for f in shown:
        marker = {"above": "^", "below": "v"}.get(f.status, "o")
        ax.plot([f.target_loss], [f.b_crit], marker, color="C0", ms=7)
        low, high = f.b_crit_interval or (None, None)
        if low or high:
            ax.plot([f.target_loss] * 2, [low or f.b_crit, high or f.b_crit], "-", color="C0", lw=1.5)
    ax.plot([], [], "o", color="C0", label="B_crit (steps-to-target fit), 90% interval")
    measured = sorted((f.target_loss, f.b_simple) for f in fits if f.b_simple)
    if measured:
        ax.plot(*zip(*measured), "s--", color="C1", ms=5, lw=1, label="B_simple where the runs reach it")
    ax.set_yscale("log")
    values = [f.b_crit for f in shown] + [b for _, b in measured]
    if values:
        plain_log_ticks(ax.yaxis, fmt_tokens, (min(values), max(values) * 1.0001))
    ax.invert_xaxis()
    ax.set_xlabel("target loss (training runs left to right)")
    ax.set_ylabel(BATCH_LABEL)
    ax.set_title("critical batch size and noise scale vs target loss", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def b_simple_over_training(chosen: Sequence[Trial]):
    """The measured noise scale B_simple against tokens, per batch size (its chosen run)."""
    with_gns = [t for t in chosen if any(b > 0 for _, b in t.b_simple)]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colour, mappable = batch_scale([t.batch for t in with_gns] or [1])
    for t in with_gns:
        xs, bs = map(np.asarray, zip(*[(x, b) for x, b in t.b_simple if x > 0 and b > 0]))
        ax.plot(xs, bs, "-", color=colour(t.batch), lw=0.6, alpha=0.25)
        ax.plot(xs, smooth(xs, bs, 1.3), "-", color=colour(t.batch), lw=1.8, label=f"B = {fmt_tokens(t.batch)}")
    _token_axes(ax, "B_simple (tokens)")
    plain_log_ticks(ax.yaxis, fmt_tokens, ax.get_ylim())
    ax.set_title("gradient noise scale B_simple over training (smoothed; raw faint)", fontsize=10)
    ax.legend(fontsize=7)
    if with_gns:
        _colour_bar(fig, ax, mappable, [t.batch for t in with_gns])
    fig.tight_layout()
    return fig


def best_scans(
    trials: Sequence[Trial], best_rows: Sequence[BestRow], axes: Sequence[str]
) -> Dict[int, Dict[Optional[float], List[Trial]]]:
    """Per batch size its runs by lr (lr_key), seeds together: the lr scan of its best configuration
    (its values of the other swept axes; a batch size without one: its first run's), so one line per
    lr is one configuration's, never a mix of warmups."""
    others = [k for k in axes if k not in (BATCH_KEY, LR_KEY)]
    wanted = {r.batch: {k: r.settings.get(k) for k in others} for r in best_rows}
    scans: Dict[int, Dict[Optional[float], List[Trial]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        if settings(t, others) == wanted.setdefault(t.batch, settings(t, others)):
            scans[t.batch][lr_key(t.lr)].append(t)
    return scans


def seed_mean(curves: Sequence[Tuple[np.ndarray, np.ndarray]], grid: np.ndarray):
    """(mean, lowest, highest, how many) at each x of `grid` over the curves present there, each
    (x, y) smoothed (`smooth`, WINDOW) and interpolated in log x; NaN where none is. A seed that
    failed or stopped early leaves the mean where its curve ends."""
    rows = np.full((len(curves), len(grid)), np.nan)
    for i, (x, y) in enumerate(curves):
        inside = (grid >= x[0]) & (grid <= x[-1])
        rows[i, inside] = np.interp(np.log(grid[inside]), np.log(x), smooth(x, y))
    count = np.isfinite(rows).sum(axis=0)
    mean = np.where(count > 0, np.nansum(rows, axis=0) / np.maximum(count, 1), np.nan)
    return mean, np.fmin.reduce(rows, axis=0), np.fmax.reduce(rows, axis=0), count


def _curve(t: Trial, scale: float) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """A run's train/loss as arrays of positive x (tokens / scale) and finite losses; None if empty."""
    x, y = t.train.tokens.astype(float) / scale, t.train.values
    keep = (x > 0) & np.isfinite(y)
    return (x[keep], y[keep]) if keep.any() else None


def _spread(items: Sequence, most: int) -> List:
    """At most `most` of `items`, evenly spread, the first and the last kept."""
    if len(items) <= most:
        return list(items)
    return [items[i] for i in sorted(set(np.linspace(0, len(items) - 1, most).round().astype(int)))]


def loss_panels(scans: Dict[int, Dict[Optional[float], List[Trial]]], x: str = "tokens", title: str = ""):
    """Train loss against tokens (x="steps": optimizer steps = tokens / B), a small panel per batch
    size (best_scans: its best configuration's lr scan), one line per lr: the mean over its seeds of
    their smoothed curves (seed_mean), a band from their lowest to their highest. Panels share the
    loss axis, and the token axis; the lrs are on one colour scale with a colour bar."""
    batches = _spread(sorted(scans), PANELS)
    cols = min(4, math.ceil(math.sqrt(len(batches))))
    rows = math.ceil(len(batches) / cols)
    width, height = 3.3 * cols + 2.0, 2.6 * rows + 1.1
    fig, grid_axes = plt.subplots(rows, cols, figsize=(width, height), sharex=x == "tokens", sharey=True, squeeze=False)
    # Fixed margins in inches (ticks, labels, the two-line title, the colour bar): a layout engine
    # would measure every tick label of every panel first, most of the figure's cost.
    left, right, bottom, top = 0.75 / width, 1 - 1.65 / width, 0.6 / height, 1 - 0.8 / height
    fig.subplots_adjust(
        left=left, right=right, bottom=bottom, top=top, wspace=0.08, hspace=0.3 if x == "tokens" else 0.45
    )
    panels = list(grid_axes.flat[: len(batches)])
    for ax in grid_axes.flat[len(batches) :]:
        ax.remove()
    lrs = sorted({lr for b in batches for lr in scans[b] if lr})
    colour, mappable = lr_scale(lrs or [1.0])
    lows, starts = [], []
    for i, (ax, b) in enumerate(zip(panels, batches)):
        by_lr = {
            lr: [c for c in (_curve(t, b if x == "steps" else 1.0) for t in runs) if c] for lr, runs in scans[b].items()
        }
        by_lr = {lr: curves for lr, curves in by_lr.items() if curves}
        if by_lr:
            low = min(c[0][0] for curves in by_lr.values() for c in curves)
            high = max(c[0][-1] for curves in by_lr.values() for c in curves)
            grid = np.geomspace(low, max(high, low * 1.01), GRID_POINTS)
        for lr in sorted(by_lr, key=lambda v: (v is None, v or 0.0)):
            mean, lowest, highest, count = seed_mean(by_lr[lr], grid)
            shade = colour(lr) if lr else "0.3"
            ax.plot(grid, mean, "-", color=shade, lw=1.4, label=f"lr {lr:.3g}" if lr else "lr not logged")
            if len(by_lr[lr]) > 1:
                ax.fill_between(grid, lowest, highest, where=count > 1, color=shade, alpha=0.2, lw=0)
            finite = mean[np.isfinite(mean)]
            lows.append(finite.min())
            starts.append(finite[0])
        ax.set_title(f"B = {fmt_tokens(b)}", fontsize=9)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        if i % cols == 0:
            ax.set_ylabel("train/loss")
        if i + cols >= len(batches):  # no panel below: its x axis is labelled
            ax.tick_params(labelbottom=True)
            ax.set_xlabel("optimizer steps" if x == "steps" else "tokens seen")
    if lows:  # the means, not a diverged start: every panel on the same loss range
        panels[0].set_ylim(min(lows) * 0.98, max(starts) * 1.03)
        loss_ticks(panels[0].yaxis, panels[0].get_ylim())
    for ax in panels:
        plain_log_ticks(ax.xaxis, (lambda v: f"{v:g}") if x == "steps" else fmt_tokens, ax.get_xlim())
    if lrs:
        bar = fig.colorbar(mappable, cax=fig.add_axes((1 - 1.4 / width, bottom, 0.15 / width, top - bottom)))
        bar.set_label("peak learning rate")
        if len(lrs) <= 12:
            bar.set_ticks(lrs, labels=[f"{lr:.3g}" for lr in lrs])
            bar.minorticks_off()
    where = f"steps x/{WINDOW:g} to x{WINDOW:g}" if x == "steps" else f"tokens x/{WINDOW:g} to x{WINDOW:g}"
    fig.suptitle(
        f"{title}\ntrain/loss, mean over seeds (band: lowest to highest seed), smoothed (mean over {where})",
        fontsize=10,
    )
    return fig


def beside(lr: float, lrs: Sequence[float], means: Sequence[float]) -> Tuple[float, bool]:
    """(the drawn line's loss at `lr`, whether that is no higher than the measured points beside it:
    the tried lrs next at or below and next at or above `lr`, both there). An optimum interpolated
    between two measured points lies above the better of them on the line through them, and one
    past the last lr drawn has no measured side: neither is starred."""
    log_lrs, means = np.log(lrs), np.asarray(means, dtype=float)
    at = float(np.interp(math.log(lr), log_lrs, means))
    below = np.flatnonzero(log_lrs <= math.log(lr) + 1e-9)
    above = np.flatnonzero(log_lrs >= math.log(lr) - 1e-9)
    if not len(below) or not len(above):
        return at, False
    return at, bool(at <= min(means[below[-1]], means[above[0]]) + 1e-12)


def loss_vs_lr(trials: Sequence[Trial], metric: str, best_rows: Sequence[BestRow], axes: Sequence[str]):
    """Final loss (mean over seeds, bars: their spread) against the peak learning rate, one line
    per batch size through the lr scan of its best configuration (best_scans), and its best
    interpolated lr by final loss (the lr of fewest steps belongs on no final-loss figure) on the
    line: a star where nothing measured beside it is better (`beside`), else an open diamond, the
    model's optimum (the parabola's vertex, whose loss no run measured)."""
    others = [k for k in axes if k not in (BATCH_KEY, LR_KEY)]
    rows = {r.batch: r for r in best_rows}
    finals: Dict[int, Dict[float, List[float]]] = defaultdict(lambda: defaultdict(list))
    for b, scan in best_scans(trials, best_rows, axes).items():
        for lr, runs in scan.items():
            losses = [t.final(metric) for t in runs if t.outcome == "finished"]
            losses = [v for v in losses if v is not None]
            if b in rows and lr and losses:
                finals[b][lr] = losses
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colour, mappable = batch_scale(list(finals) or [1])
    kinds = set()
    for b in sorted(finals):
        lrs = sorted(finals[b])
        means = [float(np.mean(finals[b][lr])) for lr in lrs]
        spread = [float(np.std(finals[b][lr])) for lr in lrs]
        ax.errorbar(
            lrs, means, yerr=spread, fmt="o-", color=colour(b), ms=4, lw=1.2, capsize=2, label=f"B = {fmt_tokens(b)}"
        )
        best = rows[b].lr
        if best:
            at, starred = beside(best, lrs, means)
            kinds.add(starred)
            if starred:
                ax.plot([best], [at], "*", color=colour(b), ms=13, mec="black", mew=0.6)
            else:
                ax.plot([best], [at], "D", color=colour(b), ms=7, mfc="white", mew=1.5)
    if True in kinds:
        ax.plot([], [], "k*", ms=10, label="best lr by final loss (no measured point beside it is lower)")
    if False in kinds:
        ax.plot([], [], "D", color="k", mfc="white", ms=6, label="model optimum: best interpolated lr by final loss")
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis, lambda v: f"{v:.3g}", ax.get_xlim())
    loss_ticks(ax.yaxis, ax.get_ylim())
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(f"final {metric}")
    where = " at its best other settings" if others else ""
    ax.set_title(f"sensitivity to the learning rate, per batch size{where}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    if finals:
        ax.legend(fontsize=7)
        _colour_bar(fig, ax, mappable, list(finals))
    fig.tight_layout()
    return fig
