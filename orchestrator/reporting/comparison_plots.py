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
  optimum starred (how sensitive each batch size is to its learning rate).

Inputs are plain records (the analysis's `answer` records and `trials.Trial`s), so the figures are
tested on tables in memory.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Sequence

import matplotlib.pyplot as plt
import numpy as np

from orchestrator.analysis.answer import BestLr, BestRow, TargetFit
from orchestrator.analysis.trials import BATCH_KEY, LR_KEY, Trial, settings
from orchestrator.reporting.batch_colours import batch_scale
from orchestrator.reporting.plots import loss_ticks, plain_log_ticks
from orchestrator.reporting.report_format import fmt_tokens, lr_text

BATCH_LABEL = "batch size (tokens per update)"


def _colour_bar(fig, ax, mappable, batches: Sequence[float]) -> None:
    bar = fig.colorbar(mappable, ax=ax, label=BATCH_LABEL)
    bar.set_ticks(sorted(set(batches)))
    bar.set_ticklabels([fmt_tokens(b) for b in sorted(set(batches))])
    bar.minorticks_off()


def smooth(xs: Sequence[float], ys: Sequence[float], ratio: float = 1.15) -> np.ndarray:
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


def loss_vs_lr(trials: Sequence[Trial], metric: str, best_rows: Sequence[BestRow], axes: Sequence[str]):
    """Final loss (mean over seeds, bars: their spread) against the peak learning rate, one line
    per batch size through the lr scan of its best configuration (its values of the other swept
    axes), and a star at that scan's best interpolated lr by final loss: the optimum of what is
    drawn (the lr of fewest steps belongs on no final-loss figure)."""
    others = [k for k in axes if k not in (BATCH_KEY, LR_KEY)]
    rows = {r.batch: r for r in best_rows}
    finals: Dict[int, Dict[float, List[float]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        loss = t.final(metric) if t.outcome == "finished" else None
        row = rows.get(t.batch)
        same = row is not None and all(settings(t, others).get(k) == row.settings.get(k) for k in others)
        if same and t.lr and loss is not None:
            finals[t.batch][float(f"{t.lr:.3g}")].append(loss)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colour, mappable = batch_scale(list(finals) or [1])
    for b in sorted(finals):
        lrs = sorted(finals[b])
        means = [float(np.mean(finals[b][lr])) for lr in lrs]
        spread = [float(np.std(finals[b][lr])) for lr in lrs]
        ax.errorbar(
            lrs, means, yerr=spread, fmt="o-", color=colour(b), ms=4, lw=1.2, capsize=2, label=f"B = {fmt_tokens(b)}"
        )
        best = rows[b].lr
        if best:  # on the drawn line: the figure shows the means, the star where their optimum lies
            at = float(np.interp(np.log(best), np.log(lrs), means)) if len(lrs) > 1 else means[0]
            ax.plot([best], [at], "*", color=colour(b), ms=13, mec="black", mew=0.6)
    ax.plot([], [], "k*", ms=10, label="best interpolated lr by final loss")
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis, lambda v: f"{v:.3g}", ax.get_xlim())
    loss_ticks(ax.yaxis, ax.get_ylim())
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(f"final {metric}")
    where = " at its best other settings" if others else ""
    ax.set_title(f"sensitivity to the learning rate, per batch size{where}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    if finals:
        _colour_bar(fig, ax, mappable, list(finals))
    fig.tight_layout()
    return fig
