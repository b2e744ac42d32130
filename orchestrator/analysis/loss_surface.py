"""One sweep's final loss over batch size and learning rate, as a smooth surface fitted to its
whole grid, and what a recommendation reads off it: the loss-optimal batch B*, the best lr there,
the loss there, and what another batch size costs (pure: numpy). docs/critical-batch.md ("What
real runs show") says why and when not to trust it; benchmarks/real_runs.py checks it on
published runs.

Real sweeps have a broad, convex basin in (log B, log lr): at equal tokens the loss rises on both
sides of a loss-optimal batch B*, and the best lr moves with B. The form, chosen on the published
grids of ../shared/data and on known truths (docs/critical-batch.md gives the comparison):

    ln L = c0 + c1 x + c2 y + c3 x^2 + c4 y^2 + c5 x y + c6 x^3,   x = ln B - x0,  y = ln lr - y0

- quadratic in both with a cross term, so the best lr moves with B along the basin's floor:
  y*(x) = -(c2 + c5 x) / (2 c4), lr* ~ B^eta with eta = -c5 / (2 c4);
- a cubic term in ln B, so the penalty may rise faster on one side of B* than the other (the
  published runs: steeper towards large batches at small budgets, towards small ones at large
  budgets). Not in ln lr: the loss does rise faster above the best lr than below, but a y^3 term
  centred at a fixed lr, while the best lr moves with B, put known-truth rungs' B* 7 % high on
  average (x^3 alone: +0.6 %); the best lr itself is read elsewhere (the lr law of the best lr per
  batch size, sweep_analysis.lr_scaling and ladder_rungs.LrNear), which this asymmetry biases less;
- fitted by least squares in ln L (a penalty is a share of the loss) to the configurations whose
  loss is within WINDOW of the grid's best, at least MIN_POINTS of them (the lowest): a quadratic
  describes a basin's floor, not its walls, where divergence and the lr grid's edges dominate.
  Fewer than CUBIC_POINTS configurations there, or fewer than 4 batch sizes: the quadratic alone.

What it gives (natural logs, `Surface`): along the floor (the best lr at each B) the profile
g(x) = min over y, a cubic in x; B* is its minimum within the batch sizes tried, `resolved` only
when the loss rises towards both the smallest and the largest batch tried by more than the noise
could make it (RISE, RISE_Z); else `below` (the loss does not rise measurably towards the
smallest batch: B* is at or below it, as on small models, where the smallest batch is best),
`above`, or `not resolved` (no lr optimum: c4 <= 0). The penalty of a batch B is
g(ln B) / g(ln B*) - 1, a share of the loss, at the best lr for B.

Intervals: a 90% bootstrap of the configurations' losses. With seeds (two or more somewhere) each
configuration's mean is redrawn from the rung's pooled seed deviations, plus the fit's residuals
where they exceed what the seeds explain (lack of fit); with one seed per configuration, from the
fit's residuals alone (resampled, scaled by sqrt(n / (n - p))). Seeded: the same grid gives the
same intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from orchestrator.analysis import tradeoff
from orchestrator.analysis.ladder_laws import Value, interval_of
from orchestrator.analysis.trials import Trial, by_batch, lr_scans, swept_axes

WINDOW = 0.02
"""Configurations within this share of the best loss (in ln L) enter the fit."""
MIN_POINTS = 14
"""At least this many configurations enter the fit (the lowest), window or not."""
CUBIC_POINTS = 12
"""Fewer configurations than this in the fit, or fewer than 4 batch sizes: no cubic term."""
TERMS = 7
RISE, RISE_Z = 0.0005, 1.6448536269514722
"""B* is resolved when the loss along the floor rises towards each end of the batch sizes tried by
at least the larger of RISE (a share of the loss) and RISE_Z standard deviations of that rise over
the resamples: a rise the noise could not make."""
PROFILE_POINTS = 241
"""Points of the floor per factor 16 of batch size, where B* and crossings are read."""
HALF = math.log(2.0)
"""The penalty is summarised at B* / 2 and 2 B*."""
RESAMPLES, SEED = 400, 0


@dataclass(frozen=True, eq=False)
class Grid:
    """A sweep's configurations as the surface sees them: per (B, lr) the best configuration of the
    other swept axes, its mean final loss over seeds and the seeds' deviations from that mean."""

    batch: np.ndarray
    lr: np.ndarray
    loss: np.ndarray
    seeds: np.ndarray
    """How many seeds each configuration ran."""
    deviations: np.ndarray
    """Every seed's deviation from its configuration's mean, scaled by sqrt(K / (K - 1)); empty with
    one seed per configuration."""

    @classmethod
    def of(cls, trials: Sequence[Trial], metric: str) -> "Grid":
        """The finished configurations of `trials` (one N and D), the best over any other swept
        axis at each (B, lr)."""
        axes = swept_axes(trials)
        best: Dict[Tuple[int, float], np.ndarray] = {}
        for b, group in by_batch(trials).items():
            for scan in lr_scans(group, axes):
                for c in scan:
                    finals = [t.final(metric) if t.outcome == "finished" else None for t in c.trials]
                    if not c.lr or any(f is None or not math.isfinite(f) for f in finals):
                        continue
                    values = np.array(finals, np.float64)
                    key = (int(b), float(c.lr))
                    if key not in best or values.mean() < best[key].mean():
                        best[key] = values
        keys = sorted(best)
        pool = [(v - v.mean()) * math.sqrt(len(v) / (len(v) - 1)) for v in best.values() if len(v) > 1]
        return cls(
            batch=np.array([k[0] for k in keys], np.float64),
            lr=np.array([k[1] for k in keys], np.float64),
            loss=np.array([best[k].mean() for k in keys], np.float64),
            seeds=np.array([len(best[k]) for k in keys], np.int64),
            deviations=np.concatenate(pool) if pool else np.zeros(0),
        )

    @classmethod
    def from_arrays(cls, batch, lr, loss) -> "Grid":
        """One seed per configuration (a published grid of final losses)."""
        batch, lr, loss = (np.asarray(a, np.float64) for a in (batch, lr, loss))
        return cls(batch, lr, loss, np.ones(len(loss), np.int64), np.zeros(0))


@dataclass(frozen=True, eq=False)
class Surface:
    """The fitted basin of one sweep and its bootstrap (module docstring)."""

    status: str
    """resolved | below | above | not resolved (B*'s, module docstring)."""
    theta: np.ndarray
    """[7] c0 .. c6 (c6 = 0 when the fit could not carry the cubic term)."""
    draws: np.ndarray
    """[R, 7] the coefficients refitted on each resample."""
    x0: float
    y0: float
    x_range: Tuple[float, float]
    """ln of the smallest and largest batch size tried."""
    residual_sd: float
    """Of the fit, in ln L."""
    rise: Tuple[float, float]
    """How far the floor must rise towards the smallest and the largest batch tried (ln L)."""
    seeded: bool
    """Resampled from seeds (else from the residuals alone)."""
    notes: Tuple[str, ...]

    # ---------------------------------------------------------------- along the floor

    def log_loss(self, log_batch, log_lr, theta=None):
        """ln L at (ln B, ln lr), per row of theta ([7] or [R, 7])."""
        c = np.asarray(self.theta if theta is None else theta, np.float64)
        c0, c1, c2, c3, c4, c5, c6 = (c[:, i, None] if c.ndim == 2 else c[i] for i in range(TERMS))
        x, y = np.asarray(log_batch, np.float64) - self.x0, np.asarray(log_lr, np.float64) - self.y0
        return c0 + c1 * x + c2 * y + c3 * x * x + c4 * y * y + c5 * x * y + c6 * x**3

    def floor(self, log_batch, theta=None):
        """(ln L, ln lr) along the basin's floor at ln B (the best lr there), per row of theta ([7]
        or [R, 7]); NaN where the lr has no optimum (c4 <= 0)."""
        c = np.asarray(self.theta if theta is None else theta, np.float64)
        c2, c4, c5 = (c[:, i, None] if c.ndim == 2 else c[i] for i in (2, 4, 5))
        x = np.asarray(log_batch, np.float64) - self.x0
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(c4 > 0, -(c2 + c5 * x) / (2 * c4), np.nan)
        return self.log_loss(log_batch, y + self.y0, theta), y + self.y0

    def _grid(self, low: float, high: float) -> np.ndarray:
        steps = max(2, int(round(PROFILE_POINTS * (high - low) / math.log(16.0))))
        return np.linspace(low, high, steps + 1)

    def optimum(self, theta=None):
        """(ln B*, ln lr*, ln L*) of theta's rows: NaN where the floor's lowest point within the
        batch sizes tried does not rise by the threshold towards both ends."""
        xs = self._grid(*self.x_range)
        log_loss, y = self.floor(xs, theta)
        log_loss = np.atleast_2d(log_loss)
        i = np.nanargmin(np.where(np.isfinite(log_loss), log_loss, np.inf), axis=-1)
        rows = np.arange(log_loss.shape[0])
        low = log_loss[rows, i]
        rises = (log_loss[:, 0] - low >= self.rise[0]) & (log_loss[:, -1] - low >= self.rise[1])
        ok = rises & np.isfinite(low)
        x_star = np.where(ok, xs[i], np.nan)
        y_star = np.where(ok, np.atleast_2d(y)[rows, i], np.nan)
        out = x_star, y_star, np.where(ok, low, np.nan)
        return tuple(float(v[0]) for v in out) if theta is None or np.ndim(theta) == 1 else out

    def penalty(self, log_batch, theta=None, log_star=None):
        """The share of the loss lost at ln B (the best lr there) against B*, per row of theta."""
        if log_star is None:
            log_star = self.optimum(theta)[0]
        at, _ = self.floor(log_batch, theta)
        best, _ = self.floor(log_star, theta)
        return np.expm1(at - best)

    # ---------------------------------------------------------------- summaries

    def summary(self) -> "Summary":
        """The point estimates and their resamples."""
        point = self.optimum()
        star = self.optimum(self.draws)
        x, draws_x = point[0], star[0][:, None]
        return Summary(
            log_b_star=x,
            log_loss_star=point[2],
            penalty_half=float(self.penalty(x - HALF, None, x)),
            penalty_double=float(self.penalty(x + HALF, None, x)),
            draws_b_star=star[0],
            draws_loss_star=star[2],
            draws_penalty_half=self.penalty(draws_x - HALF, self.draws, draws_x)[:, 0],
            draws_penalty_double=self.penalty(draws_x + HALF, self.draws, draws_x)[:, 0],
        )


@dataclass(frozen=True, eq=False)
class Summary:
    """What a recommendation reads off a surface whose B* is resolved: B* and L* (natural logs), the
    penalties at B* / 2 and 2 B* (shares of L*), and each one's resamples [R] (NaN where a resample
    has no B*)."""

    log_b_star: float
    log_loss_star: float
    penalty_half: float
    penalty_double: float
    draws_b_star: np.ndarray
    draws_loss_star: np.ndarray
    draws_penalty_half: np.ndarray
    draws_penalty_double: np.ndarray

    def curve(self) -> tradeoff.Curve:
        """The penalty curve through B* and its two penalties (tradeoff.py)."""
        return tradeoff.Curve.of(
            (math.exp(self.log_b_star), np.exp(self.draws_b_star)),
            (self.penalty_half, self.draws_penalty_half),
            (self.penalty_double, self.draws_penalty_double),
        )

    def loss(self) -> Value:
        """L* with its 90% interval."""
        return Value(math.exp(self.log_loss_star), interval_of(np.exp(self.draws_loss_star)))


# ---------------------------------------------------------------- the fit


def _terms(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(x), x, y, x * x, y * y, x * y, x**3], axis=-1)


def fit(grid: Grid, resamples: int = RESAMPLES, seed=SEED) -> Optional[Surface]:
    """The surface of `grid`; None when it has too few configurations for one (fewer than 9, or
    fewer than 3 batch sizes or 3 lrs in the fit)."""
    finite = np.isfinite(grid.loss) & (grid.loss > 0)
    if finite.sum() < 9:
        return None
    log_loss = np.log(grid.loss[finite])
    x_all, y_all = np.log(grid.batch[finite]), np.log(grid.lr[finite])
    order = np.argsort(log_loss, kind="stable")
    inside = log_loss <= log_loss.min() + WINDOW
    inside[order[:MIN_POINTS]] = True
    x_log, y_log, z = x_all[inside], y_all[inside], log_loss[inside]
    if len(np.unique(x_log)) < 3 or len(np.unique(y_log)) < 3:
        return None
    used = [True] * 6 + [len(z) >= CUBIC_POINTS and len(np.unique(x_log)) >= 4]  # can the window carry x^3?
    x0, y0 = float(x_log.mean()), float(y_log.mean())
    terms = _terms(x_log - x0, y_log - y0)[:, used]
    pinv = np.linalg.pinv(terms)
    theta = np.zeros(TERMS)
    theta[used] = pinv @ z
    residuals = z - terms @ theta[used]
    n, p = terms.shape
    residual_sd = float(np.sqrt(residuals @ residuals / max(n - p, 1)))
    rng = np.random.default_rng(seed)
    noise, seeded = _noise(grid, finite, inside, residuals, n, p, resamples, rng)
    draws = np.zeros((resamples, TERMS))
    draws[:, used] = (z + noise) @ pinv.T
    x_range = (float(x_all.min()), float(x_all.max()))
    surface = Surface("", theta, draws, x0, y0, x_range, residual_sd, (RISE, RISE), seeded, ())
    surface = replace(surface, rise=_rise(surface))
    status, notes = _status(surface)
    return replace(surface, status=status, notes=notes)


def _rise(surface: Surface) -> Tuple[float, float]:
    """The thresholds of `Surface.rise`: RISE, or RISE_Z standard deviations of each end's rise above
    the floor's lowest point over the resamples, the larger."""
    log_loss, _ = surface.floor(surface._grid(*surface.x_range), surface.draws)
    with np.errstate(invalid="ignore"):
        low = np.min(np.where(np.isfinite(log_loss), log_loss, np.inf), axis=-1)
    left, right = log_loss[:, 0] - low, log_loss[:, -1] - low
    return tuple(
        max(RISE, RISE_Z * float(np.std(r[np.isfinite(r)]))) if np.isfinite(r).sum() > 1 else RISE
        for r in (left, right)
    )


def _noise(grid: Grid, finite, inside, residuals, n: int, p: int, resamples: int, rng):
    """[R, n] perturbations of the fitted configurations' ln L, and whether seeds drew them."""
    scale = math.sqrt(n / max(n - p, 1))
    if len(grid.deviations) == 0:  # one seed: the residuals are all there is
        return residuals[rng.integers(0, n, (resamples, n))] * scale, False
    seeds = grid.seeds[finite][inside]
    loss = grid.loss[finite][inside]
    picks = rng.integers(0, len(grid.deviations), (resamples, n, int(seeds.max())))
    mask = np.arange(seeds.max()) < seeds[:, None]
    seed_noise = (grid.deviations[picks] * mask).sum(-1) / seeds / loss  # a share of the loss ~ ln L
    seed_var = float(np.mean(np.var(grid.deviations) / seeds) / np.mean(loss) ** 2)
    excess = max(0.0, float(residuals @ residuals) / max(n - p, 1) - seed_var)
    if excess > 0:  # lack of fit beyond what the seeds explain: the residuals' share of it
        shrink = math.sqrt(excess / (excess + seed_var))
        seed_noise = seed_noise + shrink * scale * residuals[rng.integers(0, n, (resamples, n))]
    return seed_noise, True


def _status(surface: Surface) -> Tuple[str, Tuple[str, ...]]:
    xs = surface._grid(*surface.x_range)
    log_loss, _ = surface.floor(xs)
    if not np.isfinite(log_loss).all():
        return "not resolved", ("the loss has no lr optimum in the fit at every batch size tried",)
    i = int(np.argmin(log_loss))
    left, right = log_loss[0] - log_loss[i], log_loss[-1] - log_loss[i]
    low, high = (int(round(math.exp(v))) for v in surface.x_range)
    if left < surface.rise[0]:
        return "below", (
            f"the loss does not rise measurably towards the smallest batch tried ({low:,}): B* is at or below it",
        )
    if right < surface.rise[1]:
        return "above", (
            f"the loss does not rise measurably towards the largest batch tried ({high:,}): B* is at or above it",
        )
    return "resolved", ()
