"""The rungs of a ladder: trials grouped by model size N (`model.params`) and budget D
(`train.total_tokens`), and per rung what the per-sweep analysis gives (pure: numpy and scipy).

Per rung (each a from-scratch sweep over batch size and learning rate):
- per batch size, the best lr and the final loss there, as sweep_analysis.best_per_batch gives
  them: the mean final loss over seeds of the best configuration tried, and the best lr from the
  parabola through it and its neighbours (lr_optimum). The loss is the best grid point's, not the
  parabola's minimum: where the loss climbs steeply on one side of the optimum, as it does above
  the best lr, a parabola through three points of a factor-2 grid dips far below every point (on
  the known-truth ladder with such a response it put a rung's B_opt at 4x the truth);
- B_opt by the rule of optimal_batch.py, and lr_opt = the best lr at B_opt, read off a straight
  line in log-log through the best lrs of the batch sizes near it (LrNear);
- B_crit, its interval and status at steps_to_target.study's primary target (the lowest chosen loss
  that resolves), as a single sweep's report gives them;
- final_loss: the lowest final loss over the batch sizes (the reference B_opt is measured against).

Intervals: a 90% bootstrap over seeds, as steps_to_target's: each resample redraws every
configuration's seeds from its batch size's pooled deviations (scaled by sqrt(K / (K - 1))) and
redoes the choice of the best configuration, the lr parabola (lr_optimum.best_over, as
best_per_batch calls it) and the rule. B_crit's resamples, which the study keeps to itself, are drawn
log-normal from its interval (one-sided statuses have none). Seeded: the same tables give the same
intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from orchestrator.analysis import critical_batch as cb
from orchestrator.analysis import loss_surface, lr_optimum, optimal_batch, steps_to_target, sweep_analysis
from orchestrator.analysis.answer import BestRow, TargetFit
from orchestrator.analysis.trials import LR_KEY, PARAMS_KEY, Trial, by_batch, lr_scans, settings, swept_axes
from orchestrator.formulas import cost

TOKENS_KEY = "train.total_tokens"
OPTIMIZER_KEYS = ("optim.beta2_half_life_tokens", "optim.weight_decay_timescale_share")
"""The optimizer constants in token units a ladder may hold (docs/configuration.md)."""
RESAMPLES, SEED = 400, 0
SLOPE_WINDOW = 4.0
"""The lr's slope in B is read from the batch sizes within this factor of B_opt."""
BOUNDS = ("lowest", "highest", "only")
"""BestRow.lr_edge words that make the best lr a bound. One-sided and not-interpolated optima are
interior (their neighbours bracket them) and known to half a grid step: read, with that spread."""
Z90 = 1.6448536269514722
MIN_CURVE_POINTS = 4
"""A rung whose runs' train/loss curves all have fewer points is final losses only: no B_crit."""


@dataclass(frozen=True)
class Estimate:
    """A number with its 90% interval and status (resolved, above, below, edge, not resolved)."""

    value: Optional[float]
    interval: Optional[Tuple[float, float]]
    status: str

    def to_json(self) -> Dict[str, Any]:
        return {"value": self.value, "interval": list(self.interval) if self.interval else None, "status": self.status}


@dataclass(frozen=True, eq=False)
class Draws:
    """A rung's bootstrap resamples (seeds redrawn), natural logs; NaN where a resample has no value."""

    log_b_opt: np.ndarray
    log_lr_opt: np.ndarray
    log_b_crit: Optional[np.ndarray]
    lr_near: "LrNear"
    """The best lrs near B_opt that lr_opt is read from, and their resamples."""
    surface: Optional[loss_surface.Summary] = None
    """The loss surface's B*, lr*, L* and penalties and their resamples (None: no surface)."""


@dataclass(frozen=True, eq=False)
class Rung:
    params: Optional[float]
    tokens: float
    b_opt: Estimate
    b_crit: Estimate
    lr_opt: Estimate
    final_loss: Estimate
    batch_sizes: Tuple[int, ...]
    seeds: int
    trials: int
    warmup_share: Optional[float]
    """The warmup of the best run at the batch size nearest B_opt, as a share of the budget."""
    optimizer: Dict[str, Tuple[float, ...]]
    """The values of OPTIMIZER_KEYS its trials gave (empty: per-step constants)."""
    notes: Tuple[str, ...]
    draws: Draws
    best_run: Optional[str] = None
    """The name of the best run at the batch size nearest B_opt (whose warmup_share this is): the
    config a recommendation for the target starts from."""
    b_star: Estimate = Estimate(None, None, "not resolved")
    """The loss-optimal batch: the minimum of the rung's loss surface (loss_surface.py)."""
    lr_star: Estimate = Estimate(None, None, "not resolved")
    """The best lr at B*, on the surface."""
    loss_star: Estimate = Estimate(None, None, "not resolved")
    """The surface's loss at B* and lr*."""
    penalty_half: Estimate = Estimate(None, None, "not resolved")
    """The share of the loss lost at B* / 2 (at its best lr), on the surface."""
    penalty_double: Estimate = Estimate(None, None, "not resolved")
    """... and at 2 B*."""
    measured: Tuple[Tuple[int, float], ...] = ()
    """(batch size, its best final loss): the rung's own evidence of the penalty."""

    @property
    def compute(self) -> Optional[float]:
        """Its training compute (cost.training_compute)."""
        return cost.training_compute(self.params, self.tokens) if self.params else None

    def to_json(self) -> Dict[str, Any]:
        return {
            "params": self.params,
            "tokens": self.tokens,
            "compute": self.compute,
            "b_opt": self.b_opt.to_json(),
            "b_crit": self.b_crit.to_json(),
            "lr_opt": self.lr_opt.to_json(),
            "final_loss": self.final_loss.to_json(),
            "b_star": self.b_star.to_json(),
            "lr_star": self.lr_star.to_json(),
            "loss_star": self.loss_star.to_json(),
            "penalty_half": self.penalty_half.to_json(),
            "penalty_double": self.penalty_double.to_json(),
            "batch_sizes": list(self.batch_sizes),
            "seeds": self.seeds,
            "trials": self.trials,
            "warmup_share": self.warmup_share,
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------- grouping


def usable(trials: Sequence[Trial]) -> List[Trial]:
    """Runs with a batch size, a train/loss curve and a budget."""
    return [t for t in trials if t.batch and t.train and t.number(TOKENS_KEY)]


def key(t: Trial) -> Tuple[Optional[float], float]:
    return t.number(PARAMS_KEY), t.number(TOKENS_KEY)


def is_ladder(trials: Sequence[Trial]) -> bool:
    """A table is a ladder when model.params or train.total_tokens differs between its runs."""
    keys = {key(t) for t in usable(trials)}
    return len({k[0] for k in keys}) > 1 or len({k[1] for k in keys}) > 1


def group(trials: Sequence[Trial]) -> Dict[Tuple[Optional[float], float], List[Trial]]:
    """Runs by (N, D), smallest compute first (N unknown sorts first)."""
    groups: Dict[Tuple[Optional[float], float], List[Trial]] = {}
    for t in usable(trials):
        groups.setdefault(key(t), []).append(t)
    return dict(sorted(groups.items(), key=lambda kv: ((kv[0][0] or 0.0) * kv[0][1], kv[0][1])))


def loss_metric(trials: Sequence[Trial]) -> str:
    """eval/loss when every finished run has one, else train/loss (sweep_analysis.analyse's rule)."""
    finished = [t for t in usable(trials) if t.outcome == "finished"]
    return "eval/loss" if finished and all(t.eval for t in finished) else "train/loss"


# ---------------------------------------------------------------- one rung


def rung(
    trials: Sequence[Trial],
    metric: str,
    tolerance: float = optimal_batch.DEFAULT_TOLERANCE,
    resamples: int = RESAMPLES,
    seed: Any = SEED,
) -> Rung:
    """One rung's numbers from its runs (all of one N and D)."""
    params, tokens = key(trials[0])
    axes = swept_axes(trials)
    rows = sweep_analysis.best_per_batch(trials, axes, metric)
    if not rows:
        raise ValueError(f"rung N={params}, D={tokens}: no batch size has a finished configuration")
    rng = np.random.default_rng(seed)
    groups = by_batch(trials)
    boot = [_resampled(_chosen_scan(groups[r.batch], axes, r), metric, rng, resamples) for r in rows]
    batches = np.array([r.batch for r in rows], np.float64)
    loss = np.array([r.final_loss for r in rows], np.float64)
    log_lr = np.log([r.lr for r in rows])
    loss_draws = np.stack([b[0] for b in boot], axis=-1)
    log_lr_draws = np.stack([b[1] for b in boot], axis=-1)
    seeded = any(b[2] for b in boot)

    surface = loss_surface.fit(loss_surface.Grid.of(trials, metric), resamples, [*np.atleast_1d(seed), 1])
    star = surface.summary() if surface else None
    if surface is not None and surface.status == "resolved":  # the largest batch within the tolerance, on it
        b_point, b_draws, above = star.curve().tolerance_point(tolerance)
        b_interval = _interval(b_draws) if not above else None  # the surface's: residuals stand in for seeds
    else:
        b_point, above = optimal_batch.b_opt_of(batches, loss, tolerance)
        b_draws, _ = optimal_batch.b_opt_of(batches, loss_draws, tolerance)
        b_interval = _interval(b_draws) if seeded and not above else None
    # The best lrs near B* where the surface has one (so the lr law does not move with the
    # tolerance), else near B_opt.
    centre = math.exp(star.log_b_star) if surface is not None and surface.status == "resolved" else float(b_point)
    near = LrNear.of(batches, log_lr, log_lr_draws, [r.lr_edge for r in rows], centre)
    lr_point, lr_draws, lr_edge = near.at(b_point, b_draws)
    primary = primary_b_crit(trials, axes)
    b_crit, log_b_crit = _b_crit(primary, rng, resamples)
    best = rows[int(np.argmin(np.abs(np.log(batches / b_point))))]
    runs = {t.name: t for t in trials}
    warmup = runs[best.run_name].warmup_tokens if best.run_name in runs else None
    return Rung(
        params=params,
        tokens=tokens,
        b_opt=Estimate(float(b_point), b_interval, _status(above)),
        b_crit=b_crit,
        lr_opt=Estimate(
            float(math.exp(lr_point)),
            _interval(np.exp(lr_draws)) if seeded else None,
            "edge" if lr_edge else "resolved",
        ),
        final_loss=Estimate(
            float(np.nanmin(loss)), _interval(np.nanmin(loss_draws, axis=-1)) if seeded else None, "resolved"
        ),
        batch_sizes=tuple(int(b) for b in batches),
        seeds=max(len(c.trials) for g in groups.values() for s in lr_scans(g, axes) for c in s),
        trials=len(trials),
        warmup_share=warmup / tokens if warmup is not None else None,
        optimizer={k: tuple(sorted({v for t in trials if (v := t.number(k)) is not None})) for k in OPTIMIZER_KEYS},
        notes=_notes(batches, float(b_point), bool(above), lr_edge, primary, tolerance, surface),
        draws=Draws(
            np.log(b_draws), lr_draws, log_b_crit, near, star if surface and surface.status == "resolved" else None
        ),
        best_run=best.run_name,
        **_surface_estimates(surface, star, near),
        measured=tuple((int(b), float(x)) for b, x in zip(batches, loss)),
    )


def _surface_estimates(surface: Optional[loss_surface.Surface], star: Optional[loss_surface.Summary], near: "LrNear"):
    """The rung's B*, lr*, L* and penalties as Estimates: values only where B* is resolved, the bound
    (the smallest or largest batch tried) where it is `below` or `above`. lr* is the best lr's line
    near B_opt (LrNear, as lr_opt) read at B*, not the surface's: a response steeper above the best
    lr than below biases a quadratic in ln lr low (loss_surface.py)."""
    if surface is None:
        return {}
    if surface.status != "resolved":
        low, high = surface.x_range
        bound = {"below": math.exp(low), "above": math.exp(high)}.get(surface.status)
        return {"b_star": Estimate(bound, None, surface.status)}

    def estimate(log_point, log_draws):
        return Estimate(math.exp(log_point), _interval(np.exp(log_draws)), "resolved")

    log_lr, log_lr_draws, _ = near.at(math.exp(star.log_b_star), np.exp(star.draws_b_star))
    return {
        "b_star": estimate(star.log_b_star, star.draws_b_star),
        "lr_star": estimate(log_lr, log_lr_draws),
        "loss_star": estimate(star.log_loss_star, star.draws_loss_star),
        "penalty_half": Estimate(star.penalty_half, _interval(star.draws_penalty_half), "resolved"),
        "penalty_double": Estimate(star.penalty_double, _interval(star.draws_penalty_double), "resolved"),
    }


def _status(above: Any) -> str:
    return "above" if bool(above) else "resolved"


def _notes(batches, b_point: float, above: bool, lr_edge: bool, primary, tolerance: float, surface) -> Tuple[str, ...]:
    """What a reader of the rung should know before trusting it."""
    notes = list(surface.notes) if surface is not None else ["too few configurations for a loss surface"]
    if surface is not None and surface.status == "resolved":
        if above:
            notes.append(
                f"the loss surface stays within {tolerance:.1%} of B*'s loss up to 4 B*: B_opt is at least that"
            )
    elif above:
        notes.append(
            f"every batch size up to the largest tried ({int(batches[-1]):,}) is within {tolerance:.1%} of the "
            "best: B_opt is at least that; sweep larger batch sizes"
        )
    elif batches[0] > b_point / 8:
        notes.append(
            f"the smallest batch size tried ({int(batches[0]):,}) is within a factor 8 of B_opt: the reference "
            "loss may be high there, and B_opt with it; sweep smaller batch sizes"
        )
    if lr_edge:
        notes.append("the best lr next to B_opt is at an edge of the lrs tried: lr_opt is a bound")
    if primary and primary.status != "resolved":
        notes += primary.notes[:1]
    return tuple(notes)


def primary_b_crit(trials: Sequence[Trial], axes: Sequence[str]) -> Optional[TargetFit]:
    """steps_to_target.study's primary target: the lowest of the chosen targets that resolves. The
    lowest alone is tried first (each target's bootstrap fit costs about 0.15 s, and a ladder has
    many rungs); only when it does not resolve is the whole study run. None when no run logged a
    loss curve (a published grid of final losses: two points a run), which has no steps to count."""
    if all(len(t.train) < MIN_CURVE_POINTS for t in trials):
        return None
    targets = steps_to_target.choose_targets(trials, steps_to_target.start_level(trials))
    if targets:
        primary = steps_to_target.study(trials, axes, targets[:1]).primary
        if primary and primary.status == "resolved":
            return primary
    return steps_to_target.study(trials, axes, None).primary


def _chosen_scan(group: Sequence[Trial], axes: Sequence[str], row: BestRow):
    """The lr scan of the configuration best_per_batch chose at this batch size, its still-running
    configurations left out (as best_per_batch leaves them)."""
    chosen = {k: v for k, v in row.settings.items() if k != LR_KEY}
    for scan in lr_scans(group, axes):
        if settings(scan[0].trials[0], list(chosen)) == chosen:
            return [c for c in scan if all(t.outcome != "incomplete" for t in c.trials)]
    raise ValueError(f"no lr scan at batch size {row.batch} has the settings {chosen}")


def _resampled(scan, metric: str, rng: np.random.Generator, resamples: int):
    """(final loss of the best configuration [R], log of the best lr [R], seeded) of one batch size
    over seed resamples: best_per_batch's choice (lr_optimum.best_over in its LOSS_FORMS), redone on
    redrawn seed means."""
    finals = [np.array([t.final(metric) if t.outcome == "finished" else np.nan for t in c.trials], float) for c in scan]
    means = np.array([f.mean() for f in finals])  # NaN unless every seed finished: worse than any
    pool = [(f - f.mean()) * math.sqrt(len(f) / (len(f) - 1)) for f in finals if len(f) > 1 and np.isfinite(f).all()]
    lrs = [c.lr or 1.0 for c in scan]
    if not pool:
        optimum = lr_optimum.best_over(
            lrs, np.broadcast_to(means, (resamples, len(means))), False, sweep_analysis.LOSS_FORMS
        )
        return optimum.at_index, _spread_unrefined(optimum, rng), False
    deviations = np.concatenate(pool)
    draws = np.stack(
        [
            m + deviations[rng.integers(0, len(deviations), (resamples, len(f)))].mean(axis=1)
            for m, f in zip(means, finals)
        ],
        axis=-1,
    )
    optimum = lr_optimum.best_over(lrs, draws, maximize=False, forms=sweep_analysis.LOSS_FORMS)
    return optimum.at_index, _spread_unrefined(optimum, rng), True


def _spread_unrefined(optimum: lr_optimum.Optimum, rng: np.random.Generator) -> np.ndarray:
    """log of each draw's best lr; an interior best that no two-sided parabola refined (one-sided,
    not interpolated) is known only to half a grid step, so its draws spread uniformly over that."""
    log_lr = np.log(optimum.position)
    unrefined = (optimum.edge == 0) & (optimum.kind != lr_optimum.INTERPOLATED)
    half = np.log(optimum.step) / 2
    return log_lr + np.where(unrefined, rng.uniform(-1.0, 1.0, log_lr.shape) * half, 0.0)


def _interp_log(x: Any, xp: np.ndarray, fp: np.ndarray) -> Any:
    """Linear interpolation of fp [..., J] at x [...] (NaN stays NaN), flat beyond the ends."""
    x = np.asarray(x, np.float64)
    if len(xp) == 1:
        return np.broadcast_to(fp[..., 0], x.shape).copy()
    i = np.clip(np.searchsorted(xp, np.nan_to_num(x, nan=xp[0]), side="right"), 1, len(xp) - 1)
    w = np.clip((x - xp[i - 1]) / (xp[i] - xp[i - 1]), 0.0, 1.0)
    lo = np.take_along_axis(fp, (i - 1)[..., None], -1)[..., 0] if fp.ndim > 1 else fp[i - 1]
    hi = np.take_along_axis(fp, i[..., None], -1)[..., 0] if fp.ndim > 1 else fp[i]
    return np.where(np.isfinite(x), lo + w * (hi - lo), np.nan)


def _neighbours(batch: float, batches: np.ndarray) -> List[int]:
    i = int(np.searchsorted(batches, batch))
    return sorted({min(max(i - 1, 0), len(batches) - 1), min(i, len(batches) - 1)})


def _b_crit(primary: Optional[TargetFit], rng: np.random.Generator, resamples: int):
    if not primary:
        return Estimate(None, None, "not resolved"), None
    status = primary.status
    if status != "resolved":
        return Estimate(primary.b_crit_bound, None, status), None
    interval = primary.b_crit_interval
    draws = None
    if interval:
        sigma = (math.log(interval[1]) - math.log(interval[0])) / (2 * Z90)
        draws = math.log(primary.b_crit) + sigma * rng.standard_normal(resamples)
    return Estimate(float(primary.b_crit), tuple(interval) if interval else None, status), draws


@dataclass(frozen=True, eq=False)
class LrNear:
    """The best lr near B_opt: a straight line in log-log through the batch sizes within
    SLOPE_WINDOW of B_opt whose best lr is interior, read at B_opt. Four batch sizes average the
    seed noise of each lr parabola (5% a batch size on the known-truth ladders, 3% after the line);
    the line's slope is the lr's dependence on B there. Fewer than two such batch sizes: the
    interpolation between the two around B_opt, flagged when either is at an edge of the lrs."""

    batches: np.ndarray
    log_lr: np.ndarray
    log_lr_draws: np.ndarray
    edges: Sequence[Optional[str]]
    near: List[int]
    sxx: float
    sxy_point: float
    sxy_draws: np.ndarray

    @classmethod
    def of(cls, batches, log_lr, log_lr_draws, edges, b_point: float) -> "LrNear":
        near = [
            j
            for j, b in enumerate(batches)
            if abs(math.log(b / b_point)) <= math.log(SLOPE_WINDOW) and edges[j] not in BOUNDS
        ]
        if len(near) < 2:
            return cls(batches, log_lr, log_lr_draws, edges, near, 0.0, 0.0, np.zeros(log_lr_draws.shape[:-1]))
        x = np.log(batches[near]) - np.log(batches[near]).mean()
        y = log_lr_draws[..., near]
        sxy_draws = (y - y.mean(-1, keepdims=True)) @ x
        return cls(
            batches,
            log_lr,
            log_lr_draws,
            edges,
            near,
            float(x @ x),
            float(x @ (log_lr[near] - log_lr[near].mean())),
            sxy_draws,
        )

    @property
    def slope(self) -> float:
        """d log lr / d log B through the batch sizes near B_opt (0 with fewer than two)."""
        return self.sxy_point / self.sxx if self.sxx else 0.0

    @property
    def near_batches(self) -> np.ndarray:
        return self.batches[self.near]

    @property
    def near_log_lr(self) -> np.ndarray:
        return self.log_lr[self.near]

    @property
    def near_log_lr_draws(self) -> np.ndarray:
        return self.log_lr_draws[..., self.near]

    def at(self, b_point: Any, b_draws: np.ndarray) -> Tuple[float, np.ndarray, bool]:
        """(log lr at B_opt, its resamples at each resample's B_opt, at an edge)."""
        if self.sxx == 0:
            log_b = np.log(self.batches)
            edge = any(self.edges[j] in BOUNDS for j in _neighbours(float(b_point), self.batches))
            return (
                float(_interp_log(np.log(b_point), log_b, self.log_lr)),
                _interp_log(np.log(b_draws), log_b, self.log_lr_draws),
                edge,
            )
        x = np.log(self.batches[self.near])
        centre = x.mean()
        point = self.log_lr[self.near].mean() + self.slope * (math.log(b_point) - centre)
        draws = self.log_lr_draws[..., self.near].mean(-1) + self.sxy_draws / self.sxx * (np.log(b_draws) - centre)
        return float(point), draws, False


def _interval(draws: np.ndarray) -> Optional[Tuple[float, float]]:
    finite = np.asarray(draws)[np.isfinite(draws)]
    return tuple(cb.percentile_interval(finite)) if len(finite) else None


def rungs(
    trials: Sequence[Trial],
    tolerance: float = optimal_batch.DEFAULT_TOLERANCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> List[Rung]:
    """Every rung of a ladder, smallest compute first; each rung's bootstrap seeded by its place."""
    metric = loss_metric(trials)
    out = []
    for i, runs in enumerate(group(trials).values()):
        if any(t.outcome == "finished" for t in runs):  # a rung with nothing finished has nothing to say
            out.append(rung(runs, metric, tolerance, resamples, [seed, i]))
    return out
