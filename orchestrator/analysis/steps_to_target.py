"""The critical batch size of a sweep: steps to target losses per batch size, the fit, its seed
bootstrap and the diagnostics that say when not to trust it (the rules are stated in
orchestrator/analysis/sweep_analysis.py's docstring; the arithmetic is orchestrator/analysis/critical_batch.py). Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple

import numpy as np

from orchestrator.analysis import critical_batch as cb
from orchestrator.analysis import diagnostics, lr_optimum
from orchestrator.analysis.answer import LackOfFit, Point, TargetFit, Trend
from orchestrator.analysis.trials import Config, Trial, by_batch, lr_scans

TARGET_FRACTIONS = (0.1, 0.3, 0.6)
"""Chosen targets: L_end + f (L_a - L_end), f the share of the way back up to the start level."""
END_SHARE = 0.1
MIN_BATCH_SIZES = 3
LACK_OF_FIT_P = 0.05
RESAMPLES, SEED = 1000, 0
WIDENING_NOTED = 1.1
"""An interval widened for lack of fit (critical_batch.widening) by at least this says so."""
PRIOR_DOF = 4
"""Degrees of freedom the pooled seed variance counts for in each point's own (steps_to_target._variances)."""


# ---------------------------------------------------------------- levels


def start_level(usable: Sequence[Trial], smoothing: float = 0.0) -> Optional[float]:
    """L_a: the lowest loss any run that did not fail had at the end of its warmup. Without any
    warmup, steps count from 0 and L_a is the median first loss (the first point of a fast
    falling curve is a block of one in its monotone fit, and the lowest of them would be luck)."""
    runs = [t for t in usable if t.outcome != "failed"]
    if not any(t.warmup_tokens for t in runs):
        return float(np.median([t.train[0][1] for t in runs])) if runs else None
    values = [cb.value_at(t.curve(smoothing), t.warmup_tokens) for t in runs]
    return min(values) if values else None


def end_level(t: Trial) -> Optional[float]:
    """A run's loss at the end of its trusted part: the median of its train/loss points over the
    last END_SHARE of it. Not the monotone fit's last value: the end of an isotonic fit is its
    noisiest point (one low point can be a block of its own), which set targets below a noise
    floor that no run reaches."""
    end = t.stable_end()
    tokens = t.train.tokens
    values = t.train.values[(end * (1 - END_SHARE) <= tokens) & (tokens <= end)]
    return float(np.median(values)) if len(values) else None


def choose_targets(usable: Sequence[Trial], start: Optional[float]) -> List[float]:
    """Loss levels below L_a that the best run of every batch size reaches in its trusted part."""
    ends = {}
    for b, group in by_batch(usable).items():
        at_end = [x for t in group if t.outcome != "failed" and t.tokens_seen >= t.stable_end() and (x := end_level(t))]
        if at_end:
            ends[b] = min(at_end)
    if not ends or start is None or start <= max(ends.values()):
        return []
    worst = max(ends.values())
    return sorted(worst + f * (start - worst) for f in TARGET_FRACTIONS)


# ---------------------------------------------------------------- one batch size


@dataclass
class Batch:
    """One batch size's lr scans and the log steps of every seed to every target."""

    batch: int
    scans: List[List[Config]]
    log_steps: List[List[np.ndarray]]
    """[scan][config] -> [seeds, targets]; NaN where a seed did not reach the target."""
    reached_at: List[List[np.ndarray]]
    """[scan][config] -> [seeds, targets] tokens from the run's start to the target."""

    def means(self) -> List[np.ndarray]:
        """[scan] -> [configs, targets] mean log steps over seeds (NaN unless every seed reached)."""
        return [np.array([s.mean(axis=0) for s in scan]) for scan in self.log_steps]

    def pure_error(self, k: int) -> Tuple[float, int]:
        """At target k: (sum of squared seed deviations from their configuration's mean, degrees
        of freedom), pooled over the configurations whose seeds all reach it."""
        runs = [s[:, k] for scan in self.log_steps for s in scan if len(s) > 1 and np.isfinite(s[:, k]).all()]
        return float(sum(((r - r.mean()) ** 2).sum() for r in runs)), sum(len(r) - 1 for r in runs)

    def resample(self, rng: np.random.Generator, n: int) -> Optional[List[np.ndarray]]:
        """[scan] -> [n, configs, targets]: every configuration's seeds redrawn from the pooled
        deviations (scaled by sqrt(K / (K - 1))) of the configurations that reach the lowest
        target any reaches here, one deviation vector over all targets per draw; None without
        replicates."""
        runs = [s for scan in self.log_steps for s in scan]
        reached = [np.isfinite(s).all(axis=0) for s in runs]
        lowest = min((int(np.flatnonzero(r).min()) for r in reached if r.any()), default=None)  # targets ascend
        pool = [
            (s - s.mean(axis=0)) * math.sqrt(len(s) / (len(s) - 1))
            for s, r in zip(runs, reached)
            if len(s) > 1 and lowest is not None and r[lowest]
        ]
        if not pool:
            return None
        deviations = np.concatenate(pool)
        out = []
        for scan in self.log_steps:
            draws = [
                s.mean(axis=0) + deviations[rng.integers(0, len(deviations), (n, len(s)))].mean(axis=1) for s in scan
            ]
            out.append(np.stack(draws, axis=1))
        return out


def batch_table(
    b: int, trials: Sequence[Trial], axes: Sequence[str], start: float, targets: Sequence[float], smoothing: float
) -> Batch:
    scans = lr_scans(trials, axes)
    log_steps, reached_at = [], []
    for scan in scans:
        log_steps.append([])
        reached_at.append([])
        for config in scan:
            steps, tokens = [], []
            for t in config.trials:
                t0 = (t.reach(start, smoothing) if t.warmup_tokens else 0.0) if t.outcome != "failed" else None
                ends = [t.reach(target, smoothing) if t0 is not None else None for target in targets]
                steps.append([math.log((e - t0) / b) if e is not None and e > t0 else math.nan for e in ends])
                tokens.append([math.nan if e is None else e for e in ends])
            log_steps[-1].append(np.array(steps, np.float64).reshape(len(config.trials), len(targets)))
            reached_at[-1].append(np.array(tokens, np.float64).reshape(len(config.trials), len(targets)))
    return Batch(b, scans, log_steps, reached_at)


STEP_FORMS = (("lin", "lin"), ("log", "log"))
"""The lr parabolas of fewest steps: the speed 1 / S in the lr (progress per step is quadratic in
the lr in McCandlish et al.'s model), or log speed in log lr (exact for a log-normal response)."""


@dataclass
class Best:
    """The fewest steps over lr at one batch size, per target (leading axes: resamples)."""

    steps: np.ndarray
    """[..., targets]; inf where no configuration reaches the target."""
    interpolation: np.ndarray
    """[..., targets] the scale of the lr refinement's error in log steps: how far the parabola
    moved the answer from the best configuration tried (its error over grid offsets has about
    this size: docs/critical-batch.md), and at least what half a grid step costs where the
    optimum is flagged (lr_optimum.grid_error)."""
    scan: np.ndarray
    optimum: List[lr_optimum.Optimum]
    """Per scan, over [..., targets]."""


def fewest_steps(batch: Batch, means: List[np.ndarray]) -> Best:
    """means: [scan] -> [..., configs, targets] mean log steps. The speed 1 / S (NaN when not
    reached) is maximised over the lr by lr_optimum.best_over, then over the scans."""
    optima, speeds = [], []
    for scan, m in zip(batch.scans, means):
        lrs = [c.lr or 1.0 for c in scan]
        opt = lr_optimum.best_over(lrs, np.moveaxis(np.exp(-m), -2, -1), maximize=True, forms=STEP_FORMS)
        optima.append(opt)
        speeds.append(np.nan_to_num(opt.value, nan=0.0))
    speeds = np.stack(speeds)  # [scans, ..., targets]
    scan = np.argmax(speeds, axis=0)

    def chosen(values):
        return np.take_along_axis(np.stack(values), scan[None], 0)[0]

    best = chosen(speeds)
    tried = np.nan_to_num(chosen([o.at_index for o in optima]), nan=0.0)
    floor = np.where(chosen([o.flagged for o in optima]), lr_optimum.grid_error(chosen([o.step for o in optima])), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        steps = np.where(best > 0, 1.0 / best, np.inf)
        gap = np.where((best > 0) & (tried > 0), np.log(best / np.where(tried > 0, tried, 1.0)), 0.0)
    return Best(steps, np.maximum(gap, floor), scan, optima)


# ---------------------------------------------------------------- the study


@dataclass(frozen=True)
class Study:
    """The critical batch size at every target loss (the Answer's part of it)."""

    start_level: Optional[float]
    """L_a, where steps are counted from (None without runs that did not fail)."""
    critical_batch: Tuple[TargetFit, ...]
    """One per target, lowest first."""
    primary: Optional[TargetFit]
    """The named target, else the lowest resolved, else the first; None without targets."""
    trend: Trend


def study(
    usable: Sequence[Trial],
    axes: Sequence[str],
    given: Optional[Sequence[float]],
    smoothing: float = 0.0,
    primary_target: Optional[float] = None,
) -> Study:
    """The fit at every target loss (given, else chosen), the primary and the trend.
    `primary_target`: a loss the user named (a bracket search's search.target_loss): added to the
    targets and the primary whatever its status."""
    start = start_level(usable, smoothing)
    targets = sorted(given) if given else choose_targets(usable, start)
    if primary_target is not None:  # it replaces a chosen target within half a percent of it
        targets = sorted({primary_target, *(t for t in targets if abs(t / primary_target - 1) > 0.005)})
    if not targets or start is None:
        return Study(start, (), None, diagnostics.trend([], [], None, []))
    reachable = [t for t in targets if t < start]
    batches = [batch_table(b, group, axes, start, reachable, smoothing) for b, group in by_batch(usable).items()]
    points = [fewest_steps(b, b.means()) for b in batches]
    rng = np.random.default_rng(SEED)
    resampled = [b.resample(rng, RESAMPLES) for b in batches]
    boots = [fewest_steps(b, r).steps if r is not None else None for b, r in zip(batches, resampled)]
    fits: List[TargetFit] = []
    boot_b_crit = []
    for target in targets:
        if target >= start:
            fits.append(_above_start(target, start))
            boot_b_crit.append(None)
            continue
        k = reachable.index(target)
        fit, boot = _target(usable, batches, points, boots, k, target)
        fits.append(fit)
        boot_b_crit.append(boot)
    resolved = [i for i, f in enumerate(fits) if f.status == "resolved"]
    i = targets.index(primary_target) if primary_target is not None else resolved[0] if resolved else 0
    flagged = [f.target_loss for f in fits if f.lack_of_fit.flagged]
    if flagged and not fits[i].lack_of_fit.flagged:
        note = (
            "lack of fit at loss " + ", ".join(f"{x:.4g}" for x in flagged) + ": the hyperbola describes these "
            "batch sizes poorly, so distrust this B_crit too"
        )
        fits[i] = replace(fits[i], notes=(*fits[i].notes, note))
    trend = diagnostics.trend(fits, resolved, boot_b_crit, targets)
    return Study(start, tuple(fits), fits[i], trend)


def _above_start(target: float, start: float) -> TargetFit:
    note = f"not resolved: the target is not below L_a = {start:.4g}, where steps are counted from (end of warmup)"
    return TargetFit(target, "not resolved", notes=(note,))


def _target(usable, batches: List[Batch], points: List[Best], boots, k: int, target: float):
    """The fit at target k and its bootstrap B_crit (None without one). Each resample also
    moves every point by its lr interpolation's error scale (independently per target); the
    bootstrap is widened where the points scatter about the fit more than their variances say
    (critical_batch.widening)."""
    jitter = np.random.default_rng([SEED, k])
    rows: List[Point] = []
    missing, spreads, boot_cols, dof = [], [], [], 0
    for b, best, boot in zip(batches, points, boots):
        if not math.isfinite(best.steps[k]):
            missing.append(b.batch)
            continue
        rows.append(_point(b, best, k))
        sq, n = b.pure_error(k)
        gap = float(best.interpolation[k])
        spreads.append(Spread(sq, n, rows[-1].seeds, gap))
        dof += n
        if boot is not None:
            boot = boot[:, k] * np.exp(gap * jitter.standard_normal(len(boot)))
        boot_cols.append(boot)
    sizes = [r.batch for r in rows]
    variances = _variances(spreads)
    weighted = variances is not None
    weights = [1 / v for v in variances] if weighted else None
    fit = None
    if len(set(sizes)) >= 2:
        one = cb.fit(sizes, [[r.steps for r in rows]], weights)
        fit = cb.Fit(one.s_min[0], one.b_crit[0], one.sse[0], one.at_grid_edge[0])
    notes = []
    if len(rows) < MIN_BATCH_SIZES:
        status = "not resolved"
        notes.append(f"not resolved: B_crit needs {MIN_BATCH_SIZES} batch sizes that reach this loss; {len(rows)} did")
    elif fit.b_crit < min(sizes):
        status = "below"
        notes.append(
            f"below: the fit puts B_crit under the smallest batch size that reaches this loss ({min(sizes):,}); "
            "sweep smaller batch sizes to resolve it"
        )
    elif fit.b_crit > max(sizes):
        status = "above"
        notes.append(
            f"above: steps still fall nearly as 1/B at the largest batch size ({max(sizes):,}); "
            "sweep larger batch sizes to resolve it"
        )
    else:
        status = "resolved"
    lack, chi2 = LackOfFit(), math.nan
    if weighted and fit is not None:
        lack, chi2 = _lack_of_fit(fit, rows, variances, dof)
        if lack.flagged:
            notes.append(
                f"lack of fit: the steps depart from S_min + E_min / B by more than the seeds' spread explains "
                f"(p = {lack.p:.2g}); B_crit is a summary, not a measurement"
            )
    boot_b_crit, interval, bound = None, None, None
    if status == "resolved":
        if weighted and all(c is not None for c in boot_cols):
            boot_b_crit = cb.fit(sizes, np.stack(boot_cols, axis=1), weights).b_crit
            boot_b_crit, interval, widened = _widened_interval(boot_b_crit, float(fit.b_crit), chi2, len(rows))
            notes += widened
        else:
            notes.append("no interval: one seed per configuration (search.seeds >= 2 gives one)")
    elif status in ("below", "above"):
        bound = min(sizes) if status == "below" else max(sizes)
    measured = [r.b_simple for r in rows if r.b_simple is not None]
    entry = TargetFit(
        target_loss=target,
        status=status,
        b_crit=float(fit.b_crit) if status == "resolved" else None,
        b_crit_bound=bound,
        b_crit_fit=None if fit is None else float(fit.b_crit),
        b_crit_interval=interval,
        s_min=None if fit is None else float(fit.s_min),
        e_min=None if fit is None else float(fit.e_min),
        b_simple=float(np.median(measured)) if measured else None,
        lack_of_fit=lack,
        points=tuple(rows),
        missing=tuple(missing),
    )
    # the diagnostics read the fit itself: what it rests on (its points) and what it says (E_min, S_min)
    return replace(
        entry, notes=(*notes, *diagnostics.notes(usable, entry)), flags=diagnostics.flags(entry)
    ), boot_b_crit


def _lack_of_fit(fit: cb.Fit, rows: Sequence[Point], variances: Sequence[float], dof: int) -> Tuple[LackOfFit, float]:
    """The F test of the fit's residuals against the seeds' spread, and their chi-square."""
    predicted = np.log(fit.s_min * (1 + fit.b_crit / np.asarray([r.batch for r in rows], np.float64)))
    residuals = np.log([r.steps for r in rows]) - predicted
    chi2 = float(np.sum(residuals**2 / np.asarray(variances)))
    p = cb.lack_of_fit(chi2, len(rows), dof)
    return LackOfFit(p, p is not None and p < LACK_OF_FIT_P, dof), chi2


def _widened_interval(boot: np.ndarray, b_crit: float, chi2: float, points: int):
    """(the bootstrap widened for lack of fit, its 90 % interval, the note saying so if it was)."""
    factor = cb.widening(chi2, points)
    boot = cb.widened(boot, b_crit, factor)
    note = (
        f"interval widened {factor:.2f}x: the batch sizes scatter about the fit more than their seeds explain "
        "(the curves' shape is not the hyperbola's, or the reading differs by batch size)"
    )
    return boot, cb.percentile_interval(boot), [note] if factor >= WIDENING_NOTED else []


@dataclass(frozen=True)
class Spread:
    """What one point's uncertainty is made of."""

    squares: float
    """Sum of squared seed deviations of log steps from their configuration's mean."""
    dof: int
    seeds: int
    """Seeds averaged into the point."""
    gap: float
    """The lr refinement's error scale (Best.interpolation)."""


def _variances(spreads: Sequence[Spread]) -> Optional[List[float]]:
    """The variance of each point's log steps, which the fit weighs it by and the lack-of-fit
    test reads; None without replicates.

    The seed variance of log steps per seed is each point's own, shrunk toward the one pooled
    over the batch sizes of this target as if the pooled value were PRIOR_DOF more degrees of
    freedom of it (the moderated variance of Smyth 2004): a point's own spread from one or two
    degrees of freedom can be a tenth of the truth by luck, and its weight would then be ten
    times too large; where the noise differs between batch sizes, enough seeds still show it.
    A point's variance is that over its seeds, plus the square of its lr refinement's error
    scale: a point whose parabola moved it far, or whose optimum is only the grid's (flagged),
    is less certain than its seeds say (docs/critical-batch.md gives the figures)."""
    dof = sum(p.dof for p in spreads)
    squares = sum(p.squares for p in spreads)
    if not spreads or dof == 0 or squares <= 0:
        return None
    pooled = squares / dof
    return [(p.squares + PRIOR_DOF * pooled) / (p.dof + PRIOR_DOF) / p.seeds + p.gap**2 for p in spreads]


def _point(b: Batch, best: Best, k: int) -> Point:
    s = int(best.scan[k])
    opt = best.optimum[s]
    config = b.scans[s][int(opt.index[k])]
    crossings = b.reached_at[s][int(opt.index[k])][:, k]
    b_simple = [x for t, tok in zip(config.trials, crossings) if (x := t.b_simple_at(tok)) is not None]
    clipped = [x for t, tok in zip(config.trials, crossings) if (x := t.clipped_before(tok)) is not None]
    walls = [t.duration_s * min(1.0, tok / t.tokens_seen) for t, tok in zip(config.trials, crossings) if t.duration_s]
    return Point(
        batch=b.batch,
        steps=float(best.steps[k]),
        tokens=float(best.steps[k] * b.batch),
        tokens_to_target=float(np.mean(crossings)),
        lr=float(opt.position[k]) if config.lr else None,
        lr_edge=opt.flag_word(k),
        seeds=len(config.trials),
        run_id=config.trials[0].run_id,
        run_name=config.trials[0].name,
        wall_s=float(np.mean(walls)) if walls else None,
        b_simple=float(np.mean(b_simple)) if b_simple else None,
        clipped=float(np.mean(clipped)) if clipped else None,
    )
