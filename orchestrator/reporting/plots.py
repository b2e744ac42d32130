"""Matplotlib figures shared by runs, sweeps and reports (headless: Agg backend)."""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.cm  # noqa: E402
import matplotlib.colors  # noqa: E402
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from orchestrator.reporting.report_format import fmt_tokens  # noqa: E402

Curve = List[Tuple[float, float]]


def loss_vs_tokens(
    curves: Dict[str, Curve],
    title: str = "",
    colors: Optional[Sequence] = None,
    xlabel: str = "tokens seen",
    ylabel: str = "loss",
):
    """One line per labelled curve of (x, loss) points."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, points) in enumerate(curves.items()):
        if not points:
            continue
        xs, ys = zip(*points)
        ax.plot(xs, ys, label=label, color=colors[i] if colors else None, lw=1.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(curves) <= 16:
        ax.legend(fontsize=7)
    # Fixed margins that hold the axis labels and a one-line title: every run draws this figure as
    # it ends, and tight_layout would measure the text first (a third of the figure's cost).
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.11, top=0.92)
    return fig


# ---------------------------------------------------------------- sweep report figures


def batch_colors(batch_sizes: Sequence[float]) -> Dict[float, Tuple]:
    """One colour per batch size, from a colormap over log B."""
    import numpy as np

    sizes = sorted(set(batch_sizes))
    logs = np.log2(sizes)
    span = (logs.max() - logs.min()) or 1.0
    cmap = plt.get_cmap("viridis")
    return {b: cmap(0.9 * (lb - logs.min()) / span) for b, lb in zip(sizes, logs)}


def lr_key(lr: Optional[float]) -> Optional[float]:
    """An lr to 3 significant digits: sampled lrs that print alike share a line, a point, a row."""
    return float(f"{lr:.3g}") if lr else None


def lr_scale(lrs: Sequence[float]):
    """(colour of an lr, the ScalarMappable its colour bar draws): plasma over log lr, short of its
    pale yellow end, which white paper would hide."""
    import numpy as np

    low, high = min(lrs), max(lrs)
    cmap = matplotlib.colors.ListedColormap(plt.get_cmap("plasma")(np.linspace(0.0, 0.85, 256)))
    norm = matplotlib.colors.LogNorm(low, high if high > low else low * 2)
    mappable = matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)
    return (lambda lr: mappable.to_rgba(lr)), mappable


def plain_log_ticks(axis, fmt, limits: Tuple[float, float]) -> None:
    """Plain numbers on a log axis; minor ticks labelled too over a span up to 3x, only 2x and 5x
    up to two decades, none beyond (their labels would collide)."""
    import math

    span = limits[1] / limits[0]

    def minor(v, _):
        lead = round(v / 10 ** math.floor(math.log10(v)))
        return fmt(v) if span <= 3 or (span < 100 and lead in (2, 5)) else ""

    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: fmt(v)))
    axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor))


def loss_ticks(axis, limits: Tuple[float, float]) -> None:
    """Labelled ticks over the whole range of a loss axis, log or linear: five to eight round
    values inside `limits`, each written with the fewest decimals that state it exactly. (A log axis's
    own ticks label only the decades and 2x, 5x: a loss between 2 and 3 would read against no
    label at all.) Minor ticks keep their lines, without labels."""
    low, high = sorted(limits)
    values = matplotlib.ticker.MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10], min_n_ticks=5).tick_values(low, high)
    values = [float(v) for v in values if low <= v <= high]
    step = (high - low) / 7 or 1.0
    digits = next((d for d in range(7) if all(abs(round(v, d) - v) < 1e-6 * step for v in values)), 6)
    axis.set_major_locator(matplotlib.ticker.FixedLocator(values))
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.{digits}f}"))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def loss_by_batch(trials: Sequence[Dict], x: str = "tokens", title: str = ""):
    """Train loss (solid) and eval loss (dashed) of every trial, coloured by batch size.

    Each trial is {"batch": B, "train": [(tokens, loss)], "eval": [(tokens, loss)]}; with
    x="steps" the x axis is optimizer steps = tokens / B.
    """
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = batch_colors([t["batch"] for t in trials])
    labelled = set()
    for batch in sorted({t["batch"] for t in trials}):
        scale = batch if x == "steps" else 1.0
        label = f"B = {fmt_tokens(batch)} tokens"
        labelled.add(batch)
        for key, style, width in (("train", "-", 1.2), ("eval", "--", 1.0)):
            # The trials of one batch size as one line broken by NaN: a figure of hundreds of trials
            # draws a handful of lines, not hundreds.
            xs: List[float] = []
            ys: List[float] = []
            for t in trials:
                points = [(p / scale, v) for p, v in t.get(key) or [] if p > 0] if t["batch"] == batch else []
                if points:  # log axis: not the point at 0
                    xs += [p for p, _ in points] + [math.nan]
                    ys += [v for _, v in points] + [math.nan]
            if xs:
                ax.plot(
                    xs, ys, style, color=colors[batch], lw=width, alpha=0.8, label=label if key == "train" else None
                )
    ax.plot([], [], "k-", lw=1.2, label="train/loss")
    ax.plot([], [], "k--", lw=1.0, label="eval/loss")
    # A diverged trial would squash every other curve: show losses up to the highest initial loss.
    firsts = [t["train"][0][1] for t in trials if t.get("train")]
    lows = [min(v for _, v in t[k]) for t in trials for k in ("train", "eval") if t.get(k)]
    if firsts and lows:
        ax.set_ylim(min(lows) * 0.97, max(firsts) * 1.05)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax.xaxis, (lambda v: f"{v:g}") if x == "steps" else fmt_tokens, ax.get_xlim())
    loss_ticks(ax.yaxis, ax.get_ylim())
    ax.set_xlabel("optimizer steps" if x == "steps" else "tokens seen")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2 if len(labelled) > 6 else 1)
    fig.tight_layout()
    return fig


HEATMAP_ANNOTATED = 30
"""Rows (or columns) a heatmap shows one by one, each cell with its value."""


def heatmap(
    values,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str = "",
    xlabel: str = "batch size (tokens per update)",
    ylabel: str = "peak learning rate",
    cbar: str = "final loss",
):
    """Annotated heatmap of a 2-d array; NaN cells stay blank. Row 0 is drawn at the bottom. Past
    HEATMAP_ANNOTATED rows or columns the figure stops growing (a sweep of 256 lrs made a PNG 130
    inches tall) and the cells go unannotated, with every k-th label."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    rows, cols = len(row_labels), len(col_labels)
    shown_rows, shown_cols = min(rows, HEATMAP_ANNOTATED), min(cols, HEATMAP_ANNOTATED)
    fig, ax = plt.subplots(figsize=(1.2 * shown_cols + 2.5, 0.5 * shown_rows + 2))
    cmap = plt.get_cmap("viridis_r").with_extremes(bad="white")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, aspect="auto", origin="lower")
    fig.colorbar(image, ax=ax, label=cbar)
    finite = values[np.isfinite(values)]
    middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    annotated = rows <= HEATMAP_ANNOTATED and cols <= HEATMAP_ANNOTATED
    for i in range(values.shape[0] if annotated else 0):
        for j in range(values.shape[1]):
            if np.isfinite(values[i, j]):
                ax.text(
                    j,
                    i,
                    f"{values[i, j]:.3f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if values[i, j] > middle else "black",
                )
    col_step, row_step = -(-cols // HEATMAP_ANNOTATED), -(-rows // HEATMAP_ANNOTATED)
    ax.set_xticks(range(0, cols, col_step), col_labels[::col_step], rotation=30)
    ax.set_yticks(range(0, rows, row_step), row_labels[::row_step])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def lr_batch_heatmap(
    cells: Sequence[Tuple[float, float, float]],
    what: str = "final loss",
    best: Optional[Tuple[float, float]] = None,
    recommended: Optional[Tuple[float, float]] = None,
):
    """Heatmap of (lr, B, loss) cells: lr rows (rounded to 3 significant digits, so that sampled
    lrs share rows), batch-size columns, the lowest loss where several cells share one (each cell a
    configuration's mean over its seeds: the lowest is the best over the other settings). `best`
    (lr, B) is boxed; `recommended` (B, lr), which need be no cell, is a cross at its place on the
    log-spaced rows and columns, where it lies within them."""
    import numpy as np

    lrs = sorted({lr_key(lr) for lr, _, _ in cells})
    batches = sorted({b for _, b, _ in cells})
    grid = np.full((len(lrs), len(batches)), np.nan)
    for lr, b, loss in cells:
        i, j = lrs.index(lr_key(lr)), batches.index(b)
        grid[i, j] = np.fmin(grid[i, j], loss)
    fig = heatmap(
        grid,
        [f"{lr:.3g}" for lr in lrs],
        [fmt_tokens(b) for b in batches],
        f"{what}, mean over seeds (best over other settings)",
        cbar=what,
    )
    ax = fig.axes[0]
    if best is not None and lr_key(best[0]) in lrs and best[1] in batches:
        i, j = lrs.index(lr_key(best[0])), batches.index(best[1])
        box = matplotlib.patches.Rectangle(
            (j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=2.2, label="best configuration (lowest mean)"
        )
        ax.add_patch(box)
    if recommended is not None and len(lrs) > 1 and len(batches) > 1:
        b, lr = recommended
        if batches[0] <= b <= batches[-1] and lrs[0] <= lr <= lrs[-1]:
            x = float(np.interp(math.log(b), np.log(batches), range(len(batches))))
            y = float(np.interp(math.log(lr), np.log(lrs), range(len(lrs))))
            label = f"recommended: B = {fmt_tokens(b)}, lr {lr:.3g}"
            ax.plot([x], [y], "X", color="red", mec="white", ms=11, label=label)
    if ax.patches or ax.get_lines():
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
        fig.tight_layout()
    return fig


def critical_batch(fits: Sequence[Dict], title: str = "tokens and optimizer steps to reach a target loss"):
    """Per target: the measured tokens E and steps S from L_a to it against the batch size B, the
    fitted hyperbola (E = E_min + S_min B, S = S_min + E_min / B), perfect scaling (the tokens stay
    E_min, the steps fall as E_min / B) and B_crit = E_min / S_min, where both are twice their least.

    Each fit is {"target_loss", "points": [(B, S, E)], "s_min", "e_min", "b_crit"} (the last
    three None when no fit). Each line's gid names what it draws: "measured|fit|perfect <target>".
    """
    import numpy as np

    fig, (tokens_ax, steps_ax) = plt.subplots(1, 2, figsize=(11, 4.8))
    cmap = plt.get_cmap("plasma")
    for k, fit in enumerate(fits):
        color = cmap(0.8 * k / max(1, len(fits) - 1))
        bs, ss, es = map(np.asarray, zip(*fit["points"]))
        key, s_min, e_min = f"{fit['target_loss']:.6g}", fit.get("s_min"), fit.get("e_min")
        label = f"loss {fit['target_loss']:.3f}" + (
            f": B_crit = {fmt_tokens(fit['b_crit'])}" if fit.get("b_crit") else ""
        )
        grid = np.geomspace(bs.min() / 2, bs.max() * 2, 100)
        for ax, measured, least in ((tokens_ax, es, e_min), (steps_ax, ss, s_min)):
            ax.plot(bs, measured, "o", color=color, gid=f"measured {key}", label=label)
            if not (s_min and e_min):
                continue
            tokens_panel = ax is tokens_ax
            fitted = e_min + s_min * grid if tokens_panel else s_min + e_min / grid
            perfect = np.full_like(grid, e_min) if tokens_panel else e_min / grid
            ax.plot(grid, fitted, "-", color=color, lw=1.2, gid=f"fit {key}")
            ax.plot(grid, perfect, "--", color=color, lw=0.9, alpha=0.8, gid=f"perfect {key}")
            ax.plot([e_min / s_min], [2 * least], "D", color=color, mfc="white", ms=7, mew=1.5)
    for ax in (tokens_ax, steps_ax):
        tokens_panel = ax is tokens_ax
        ax.plot(
            [], [], "k-", lw=1.2, label="fit: " + ("E = E_min + S_min B" if tokens_panel else "S = S_min + E_min / B")
        )
        ax.plot(
            [], [], "k--", lw=0.9, label="perfect scaling: " + ("tokens constant" if tokens_panel else "steps ~ 1/B")
        )
        ax.plot([], [], "D", color="k", mfc="white", ms=6, label="B_crit (fit): twice the least")
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_log_ticks(ax.xaxis, fmt_tokens, ax.get_xlim())
        plain_log_ticks(ax.yaxis, fmt_tokens if tokens_panel else (lambda v: f"{v:g}"), ax.get_ylim())
        ax.set_xlabel("batch size (tokens per update)")
        ax.set_ylabel(f"{'tokens' if tokens_panel else 'optimizer steps'} from L_a to the target")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def lr_vs_batch(
    tried: Sequence[Tuple[float, float]],
    best: Sequence[Tuple[float, float]],
    fit: Optional[Tuple[float, float]] = None,
    criterion: str = "final loss",
):
    """Tried (B, lr) pairs, the best interpolated lr per batch size by `criterion` (as the report's
    table names it) and the power law coef * B^alpha through them."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if tried:
        ax.plot(*zip(*tried), "x", color="0.6", label="tried")
    ax.plot(*zip(*best), "o", color="C3", ms=8, label=f"best interpolated lr per batch size ({criterion})")
    if fit is not None:
        coef, alpha = fit
        bs = np.geomspace(min(b for b, _ in best) / 1.5, max(b for b, _ in best) * 1.5, 50)
        ax.plot(bs, coef * bs**alpha, "-", color="C3", lw=1, label=f"fit: lr ~ B^{alpha:.2f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax.xaxis, fmt_tokens, ax.get_xlim())
    plain_log_ticks(ax.yaxis, lambda v: f"{v:.3g}", ax.get_ylim())
    ax.set_xlabel("batch size (tokens per update)")
    ax.set_ylabel("peak learning rate")
    ax.set_title("best learning rate vs batch size")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def branch_cbs(points: Sequence[Dict], fit: Optional[Dict], b_simple: Sequence[Tuple[float, float]] = ()):
    """A branch study: the critical batch size at each branch point (with its 90% interval; a
    triangle for a bound), its power law, B_simple over training and the from-scratch B_crit at
    each point's loss (branch.compare_with) on the same axes, log-log."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 5))
    for p in points:
        if p["cbs"] is None:
            continue
        marker = {"above": "^", "below": "v"}.get(p["status"], "o")
        ax.plot([p["tokens"]], [p["cbs"]], marker, color="C0", ms=7)
        low, high = p["cbs_interval"] or (None, None)
        if low or high:
            ax.plot([p["tokens"]] * 2, [low or p["cbs"], high or p["cbs"]], "-", color="C0", lw=1.5)
    ax.plot([], [], "o", color="C0", label="critical batch size (branches), 90% interval")
    if fit:
        ts = [p["tokens"] for p in points]
        grid = np.geomspace(min(ts) / 2, max(ts) * 2, 100)
        law = fit["coef"] * (grid / fit["t_ref"]) ** fit["exponent"]
        ax.plot(grid, law, "--", color="C0", lw=1, label=f"power law: tokens^{fit['exponent']:.2f}")
    if b_simple:
        t, b = zip(*[(t, b) for t, b in b_simple if t > 0 and b > 0])
        ax.plot(t, b, "-", color="C1", lw=1, label="B_simple of the base run")
    scratch = [(p["tokens"], p["b_crit_scratch"]) for p in points if (p.get("b_crit_scratch") or {}).get("b_crit")]
    for tokens, s in scratch:
        marker = {"above": "^", "below": "v"}.get(s["status"], "s")
        ax.plot([tokens], [s["b_crit"]], marker, color="C2", ms=7, mfc="none")
        if s["b_crit_interval"]:
            ax.plot([tokens] * 2, s["b_crit_interval"], "-", color="C2", lw=1)
    if scratch:
        ax.plot([], [], "s", color="C2", mfc="none", label="B_crit from scratch at the base's loss there")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens trained (branch point)")
    ax.set_ylabel("batch size (tokens per update)")
    ax.set_title("critical batch size along training", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def ladder_law(
    rungs: Sequence[Tuple[float, float, Optional[Tuple[float, float]]]],
    fitted: Sequence[Tuple[float, float]],
    line: Sequence[Tuple[float, float, Optional[Tuple[float, float]]]],
    backtest: Optional[Tuple[float, float, Optional[Tuple[float, float]], float]],
    target: Optional[float],
    title: str,
    ylabel: str,
    xlabel: str = "compute C = 6ND (FLOPs)",
):
    """A ladder's law on log axes: the rungs' measurements (x, value, interval) and the law's value
    at each (x, value: its N and D, which one line in C cannot show), the fit and its 90% band
    along `line` out to the target, the backtest (x, predicted, its interval, measured)
    and the target's x."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if line:
        xs = [p[0] for p in line]
        ax.plot(xs, [p[1] for p in line], color="C0", lw=1.5, label="law (line from the smallest rung to the target)")
        banded = [p for p in line if p[2]]
        if banded:
            ax.fill_between(
                [p[0] for p in banded], [p[2][0] for p in banded], [p[2][1] for p in banded], color="C0", alpha=0.2
            )
    for x, value, interval in rungs:
        err = [[value - interval[0]], [interval[1] - value]] if interval else None
        ax.errorbar([x], [value], yerr=err, fmt="o", color="k", ms=5, capsize=3)
    ax.plot([], [], "o", color="k", label="rungs (90% interval over seeds)")
    if fitted:
        ax.plot(*zip(*fitted), "o", mfc="none", color="C0", ms=7, label="the law at each rung's N and D")
    if backtest is not None:
        x, predicted, interval, measured = backtest
        err = [[predicted - interval[0]], [interval[1] - predicted]] if interval else None
        ax.errorbar([x], [predicted], yerr=err, fmt="D", mfc="none", color="C3", ms=8, capsize=4)
        ax.plot([x], [measured], "x", color="C3", ms=9, label="backtest: refit without this rung (◇), measured (x)")
    if target is not None:
        ax.axvline(target, color="C2", ls="--", lw=1, label="target")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def tradeoff(
    curve: Sequence[Tuple[float, float, Optional[Tuple[float, float]]]],
    steps: Sequence[Tuple[float, float]],
    optimal: Tuple[float, Optional[float]],
    point: Tuple[float, float, Optional[float]],
    tolerance: float,
    evidence: Sequence[Tuple[str, Sequence[Tuple[float, float]]]],
    title: str,
):
    """What another batch size costs: the predicted penalty against B* (batch, penalty, 90% band)
    in % of the loss, the optimizer steps of the budget on a second axis, the loss-optimal point
    (B*, its lr) and the tolerance point (B, its penalty, its lr), and the measured penalties of
    the rungs (or the sweep), each (label, [(batch rescaled to this B*, penalty)])."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    xs = [c[0] for c in curve]
    ax.plot(xs, [100 * c[1] for c in curve], color="C0", lw=1.8, label="predicted penalty (90% band)")
    banded = [c for c in curve if c[2]]
    if banded:
        ax.fill_between(
            [c[0] for c in banded],
            [100 * c[2][0] for c in banded],
            [100 * c[2][1] for c in banded],
            color="C0",
            alpha=0.2,
        )
    for i, (label, points) in enumerate(evidence):
        if points:
            ax.plot(*zip(*[(b, 100 * p) for b, p in points]), "o", ms=4, color=f"C{2 + i % 7}", alpha=0.8, label=label)
    ax.axhline(100 * tolerance, color="0.5", ls=":", lw=1)
    b_star, lr_star = optimal
    ax.axvline(b_star, color="C1", ls="--", lw=1)
    ax.plot(
        [b_star],
        [0.0],
        "*",
        color="C1",
        ms=13,
        label=f"B* {fmt_tokens(b_star)}" + (f", lr {lr_star:.3g}" if lr_star else ""),
    )
    batch, penalty, lr = point
    ax.plot(
        [batch],
        [100 * penalty],
        "D",
        color="C3",
        ms=8,
        label=f"within {tolerance:.2%}: {fmt_tokens(batch)}" + (f", lr {lr:.3g}" if lr else ""),
    )
    ax.set_xscale("log")
    ax.set_xlabel("tokens per update")
    ax.set_ylabel("loss penalty against B* (% of the loss)")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: fmt_tokens(v)))
    top = max(100 * max(c[1] for c in curve), 100 * 2 * tolerance)
    ax.set_ylim(-0.05 * top, 1.1 * top)
    twin = ax.twinx()
    twin.plot(*zip(*steps), color="0.4", lw=1, ls="-.", label="optimizer steps")
    twin.set_yscale("log")
    twin.set_ylabel("optimizer steps of the budget")
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    ax.legend(handles + more, labels + more_labels, fontsize=7, loc="upper center")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
