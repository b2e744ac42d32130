"""Power laws across the rungs of a ladder, their bootstrap intervals and their backtest (pure).

A law is y = k N^a D^b (or y = k D^b, or y = k C^e where N and D cannot be told apart), fitted by
least squares in logs (seed noise is multiplicative), each rung weighted by the inverse variance of
its own log value over its seed resamples (floored at a 2% spread, so that one rung whose
resamples barely move cannot outweigh the rest).

- **Design.** N and D are told apart only when the rungs' D/N ratios differ: when they all lie
  within a factor SHARED_RATIO of each other, ln D = ln N + const and every split of one exponent
  between N and D fits equally well, so the law is fitted in C = 6 N D alone and says so. A
  variable that is the same in every rung is left out, and the law says it cannot see it.
- **Intervals.** A bootstrap of RESAMPLES that in each resample redraws every rung's value from
  its own seed resamples (ladder_rungs: seeds redrawn within the rung) *and* the rungs themselves,
  with replacement, from the ladder; a resample whose rungs no longer tell the variables apart
  (singular normal equations) is left out. 90% percentile intervals of each
  coefficient and of the prediction at any (N, D). Seeded: the same tables give the same report.
- **Dropping a term.** A variable named in `drop` (N in the laws of B_opt and B_crit, which Power
  Lines and Zhang et al. find nearly independent of N) is fitted and reported, then dropped when
  its 90% interval holds 0; the law is refitted without it.
- **Backtest.** The law refitted without its largest-compute rung (C = 6 N D) predicts that rung.
  Its interval is where the prediction puts a measurement of that rung: the prediction's
  resamples, each moved by how far that rung's own seed resample lies from its value, so both the
  fit's and the measurement's noise count; `held` says whether the measured value lies inside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from orchestrator.analysis import critical_batch as cb
from orchestrator.formulas import cost

RESAMPLES, SEED = 400, 0
SHARED_RATIO = 1.2
"""Rungs whose D/N ratios all lie within this factor of each other share one ratio."""
VARIES = 1.01
"""A variable varies when its largest value is more than this factor above its smallest."""
SD_FLOOR = 0.02
"""The smallest spread (of a natural log) a rung's weight assumes."""
SINGULAR = 1e10
"""Normal equations with a larger condition number are singular (a resample that lost a variable)."""
UNTESTED_DECADES = 2.0
"""A backtest whose refit's interval spans more decades than this tests nothing (it would hold any
value the law could give): its `held` is None and its note says so, not True."""


@dataclass(frozen=True, eq=False)
class Point:
    """One measurement a law is fitted to: a rung's value (or a batch size's, for a law with a B
    term) and the logs of its seed resamples [R] (NaN: none)."""

    params: Optional[float]
    tokens: float
    value: float
    log_draws: Optional[np.ndarray] = None
    batch: Optional[float] = None
    rung: Optional[int] = None
    """Points of one rung are resampled together (None: a rung of its own)."""

    @property
    def compute(self) -> float:
        return cost.training_compute(self.params or 0.0, self.tokens)


@dataclass(frozen=True)
class Design:
    variables: Tuple[str, ...]
    """("N", "D"), ("D",), ("N",) or ("C",), and "B" for a law with a batch-size term; empty when
    nothing varies."""
    note: Optional[str] = None

    def logs(self, params: Any, tokens: Any, batch: Any = None) -> np.ndarray:
        """[..., len(variables)] natural logs of the variables."""
        d = np.log(np.asarray(tokens, np.float64))
        n = np.log(np.asarray(params, np.float64)) if {"N", "C"} & set(self.variables) else None
        b = np.log(np.asarray(batch, np.float64)) if "B" in self.variables else None
        log_c = n + d + math.log(cost.training_compute(1.0, 1.0)) if n is not None else None  # C's own formula, in logs
        columns = {"N": n, "D": d, "C": log_c, "B": b}
        shape = np.broadcast_shapes(*(np.shape(c) for c in columns.values() if c is not None))
        if not self.variables:  # a constant law: pooled over the rungs
            return np.zeros((*shape, 0))
        return np.stack([np.broadcast_to(columns[v], shape) for v in self.variables], axis=-1)

    def without(self, variable: str) -> "Design":
        return Design(tuple(v for v in self.variables if v != variable), self.note)

    def with_batch(self) -> "Design":
        return Design((*self.variables, "B"), self.note)


def design_of(points: Sequence[Point]) -> Design:
    """Which variables the rungs can tell apart (module docstring)."""
    tokens = [p.tokens for p in points]
    d_varies = max(tokens) > VARIES * min(tokens)
    if any(p.params is None for p in points):
        return Design(("D",) if d_varies else (), "model.params is missing: the law cannot see N")
    params = [p.params for p in points]
    n_varies = max(params) > VARIES * min(params)
    ratios = [d / n for n, d in zip(params, tokens)]
    if n_varies and d_varies and max(ratios) <= SHARED_RATIO * min(ratios):
        return Design(
            ("C",),
            f"every rung has about {np.median(ratios):.3g} tokens per parameter: N and D cannot be told apart, "
            "so the law is fitted in compute C = 6ND only (vary the ratio between rungs to separate them)",
        )
    if n_varies and d_varies:
        return Design(("N", "D"))
    if d_varies:
        return Design(("D",), "N is the same in every rung: the law cannot see N")
    if n_varies:
        return Design(("N",), "D is the same in every rung: the law cannot see D")
    return Design((), "N and D are the same in every rung")


@dataclass(frozen=True)
class Value:
    """A coefficient, an exponent or a prediction, with its 90% bootstrap interval."""

    value: Optional[float]
    interval: Optional[Tuple[float, float]]

    def to_json(self) -> Dict[str, Any]:
        return {"value": self.value, "interval": list(self.interval) if self.interval else None}


@dataclass(frozen=True)
class Backtest:
    held_out: Tuple[Optional[float], float]
    """(params, tokens) of the rung left out: the largest compute."""
    predicted: Optional[float]
    measured: float
    interval: Optional[Tuple[float, float]]
    held: Optional[bool]
    """Whether the interval holds the measured value; None when there was too little to refit, or
    when the refit's interval is too wide to test anything (`untested`)."""
    note: Optional[str] = None

    @property
    def untested(self) -> bool:
        """Refitted, but its interval spans more than UNTESTED_DECADES: it holds any value."""
        return self.held is None and self.interval is not None

    def to_json(self) -> Dict[str, Any]:
        return {
            "held_out": {"params": self.held_out[0], "tokens": self.held_out[1]},
            "predicted": self.predicted,
            "measured": self.measured,
            "interval": list(self.interval) if self.interval else None,
            "held": self.held,
            "note": self.note,
        }


@dataclass(frozen=True, eq=False)
class Fit:
    """Weighted least squares in logs, and its bootstrap."""

    design: Design
    reference: np.ndarray
    """The means of the variables' logs over the points: the fit is centred there."""
    theta: np.ndarray
    """[1 + variables]: the log of the value at the reference, then the exponents."""
    draws: np.ndarray
    """[R, 1 + variables]; NaN rows for resamples whose rungs no longer tell the variables apart."""
    floor: float = 0.0
    """E of y = E + k N^a D^b (`fit(..., floor=True)`); 0 for a plain power law."""
    floor_draws: Any = 0.0
    """E of each resample [R] (or 0)."""

    def widened(self, factor: float) -> "Fit":
        """The same fit with its resamples' spread around the fit multiplied by `factor`."""
        if factor == 1.0:
            return self
        draws = self.theta + factor * (self.draws - self.theta)
        floors = self.floor + factor * (np.asarray(self.floor_draws) - self.floor)
        return Fit(self.design, self.reference, self.theta, draws, self.floor, floors)

    def exponent(self, variable: str) -> Value:
        k = 1 + self.design.variables.index(variable)
        return Value(float(self.theta[k]), interval_of(self.draws[:, k]))

    def prefactor(self) -> Value:
        """k in y = k x1^a1 ...: the value at x = 1 (a long extrapolation: its interval is wide)."""
        logs = self.theta[0] - self.theta[1:] @ self.reference
        boots = self.draws[:, 0] - self.draws[:, 1:] @ self.reference
        return Value(float(np.exp(logs)), interval_of(_exp_of_draws(boots)))

    def prediction(self, params: float, tokens: float, batch: Any = None, batch_draws: Any = None):
        """(value, resamples [R]) at (N, D) (and B: a value, with its own resamples to pair)."""
        x = self.design.logs(params, tokens, batch) - self.reference
        value = float(self.floor + np.exp(self.theta[0] + x @ self.theta[1:]))
        if batch_draws is not None:
            x = self.design.logs(params, tokens, np.asarray(batch_draws)) - self.reference  # [R, p - 1]
            return value, self.floor_draws + _exp_of_draws(self.draws[:, 0] + (self.draws[:, 1:] * x).sum(-1))
        return value, self.floor_draws + _exp_of_draws(self.draws[:, 0] + self.draws[:, 1:] @ x)


def _exp_of_draws(logs: np.ndarray) -> np.ndarray:
    """exp of resamples' logs, without numpy's console warning: a resample whose exponent runs far
    out gives inf or 0, which its readers already handle (interval_of keeps the finite ones, the
    calibration counts neither)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(logs)


def fit(
    points: Sequence[Point], design: Design, resamples: int = RESAMPLES, seed: Any = SEED, floor: bool = False
) -> Fit:
    """The weighted fit of `points` in `design`'s variables, and its bootstrap over seeds and rungs:
    a resample draws every point from its own seed resamples and the rungs with replacement (as
    multiplicities of their points' weights, so a rung's points stay together). With `floor`, the
    law is y = E + k N^a D^b, E profiled (`_profile`) in the fit and again in every resample."""
    rungs = [p.rung if p.rung is not None else -1 - i for i, p in enumerate(points)]
    labels, cluster = np.unique(rungs, return_inverse=True)
    p_count = 1 + len(design.variables) + int(floor)
    if len(labels) < p_count + 1 or len(points) < p_count + 1:
        raise ValueError(
            f"a law in {', '.join(design.variables) or 'nothing'} needs {p_count + 1} rungs, got {len(labels)}"
        )
    logs = design.logs([p.params or 1.0 for p in points], [p.tokens for p in points], [p.batch or 1.0 for p in points])
    reference = logs.mean(axis=0)
    x = np.concatenate([np.ones((len(points), 1)), logs - reference], axis=1)
    y = np.log([p.value for p in points])
    draws = np.stack([_draws(p, resamples) for p in points], axis=-1)  # [R, n]
    spread = np.nanvar(draws, axis=0)
    w = 1.0 / np.maximum(np.where(np.isfinite(spread), spread, 0.0), SD_FLOOR**2)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(len(labels), np.full(len(labels), 1.0 / len(labels)), size=resamples)  # [R, rungs]
    resampled, weights = np.where(np.isfinite(draws), draws, y), w * counts[:, cluster]
    if not floor:
        theta, ok = _solve(x, y, w)
        if not ok:
            raise ValueError(f"the rungs do not tell {', '.join(design.variables)} apart")
        thetas, valid = _solve(x, resampled, weights)
        return Fit(design, reference, theta, np.where(valid[:, None], thetas, np.nan))
    e, theta, ok = _profile(x, y[None], w[None])
    if not ok[0]:
        raise ValueError(f"the rungs do not tell {', '.join(design.variables)} apart")
    floors, thetas, valid = _profile(x, resampled, weights)
    return Fit(design, reference, theta[0], np.where(valid[:, None], thetas, np.nan), float(e[0]), floors)


FLOOR_STEPS = 120
"""The offsets E a profile tries, from 0 to 0.99 of the smallest value."""


def _profile(x: np.ndarray, log_y: np.ndarray, w: np.ndarray):
    """E of y = E + k N^a D^b per row of log_y [R, n] (weights w [R, n]): the value, from 0 to just
    below the row's smallest y, whose weighted power-law fit of y - E leaves the least squared error
    in ln y. A loss falls towards an irreducible part, which a plain power law misses when it
    extrapolates (on the basin worlds of tests/basin_truth.py, 1.5 decades past the rungs, 8 % low).
    (E [R], theta [R, p], valid [R]). Every E of a row shares its normal matrix: one inverse a row."""
    y = np.exp(log_y)
    xw = x * w[..., None]  # [R, n, p]
    a = np.swapaxes(xw, -1, -2) @ x
    valid = np.linalg.cond(a) < SINGULAR
    inverse = np.linalg.inv(np.where(valid[:, None, None], a, np.eye(x.shape[1])))
    e = np.linspace(0.0, 0.99, FLOOR_STEPS)[:, None] * y.min(axis=-1)  # [S, R]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        theta = np.einsum("rpq,rnq,srn->srp", inverse, xw, np.log(y - e[..., None]))  # [S, R, p]
        fitted = np.log(e[..., None] + np.exp(theta @ x.T))
        error = np.sum(w * (fitted - log_y) ** 2, axis=-1)  # [S, R]
    best = np.argmin(np.where(np.isfinite(error), error, np.inf), axis=0)
    rows = np.arange(len(y))
    return e[best, rows], theta[best, rows], valid


def _draws(point: Point, resamples: int) -> np.ndarray:
    if point.log_draws is None:
        return np.full(resamples, math.log(point.value))
    return np.asarray(point.log_draws, np.float64)[:resamples]


def _solve(x: np.ndarray, y: np.ndarray, w: np.ndarray):
    """Weighted least squares per leading index of y and w: (theta [..., p], valid [...])."""
    xw = x * w[..., None]
    a = np.swapaxes(xw, -1, -2) @ x
    b = (np.swapaxes(xw, -1, -2) @ y[..., None])[..., 0]
    valid = np.linalg.cond(a) < SINGULAR
    eye = np.broadcast_to(np.eye(a.shape[-1]), a.shape)
    theta = np.linalg.solve(np.where(valid[..., None, None], a, eye), b[..., None])[..., 0]
    return theta, valid


def interval_of(draws: np.ndarray) -> Optional[Tuple[float, float]]:
    """The 90% percentile interval of the finite resamples; None without any."""
    finite = np.asarray(draws)[np.isfinite(draws)]
    return tuple(cb.percentile_interval(finite)) if len(finite) else None


# ---------------------------------------------------------------- what a law reports


def drop_if_zero(
    points: Sequence[Point], design: Design, drop: Sequence[str], seed: Any, keep_one: bool = True, floor: bool = False
) -> Tuple[Fit, List[Tuple[str, Value]]]:
    """The fit, with each variable of `drop` removed when its exponent's interval holds 0 (all of
    them, leaving a constant, unless `keep_one`)."""
    result = fit(points, design, seed=seed, floor=floor)
    dropped = []
    for variable in drop:
        if variable in result.design.variables and (len(result.design.variables) > 1 or not keep_one):
            exponent = result.exponent(variable)
            if exponent.interval is None or exponent.interval[0] <= 0 <= exponent.interval[1]:
                dropped.append((variable, exponent))
                result = fit(points, result.design.without(variable), seed=seed, floor=floor)
    return result, dropped


def _rung_of(p: Point) -> Any:
    return p.rung if p.rung is not None else id(p)


def calibration(points: Sequence[Point], design: Design, seed: Any, floor: bool = False) -> Tuple[float, Optional[str]]:
    """How much wider the bootstrap's spread must be to hold what leaving one rung out shows: each
    rung in turn is refitted without and predicted, its error standardised by the refit's spread and
    its own (floored at SD_FLOOR, as the weights are); the factor is the root mean square of those
    errors when above 1, else 1 (a law whose rungs fit it within their noise keeps its intervals).
    A law that bends, or rungs noisier than their seeds say, widens instead of only failing its
    backtest. (factor, a note when it widened)."""
    labels = list(dict.fromkeys(_rung_of(p) for p in points))
    errors = []
    for label in labels:
        rest = [p for p in points if _rung_of(p) != label]
        try:
            refit = fit(rest, design, seed=seed, floor=floor)
        except ValueError:
            continue
        for p in points:
            if _rung_of(p) != label:
                continue
            predicted, boots = refit.prediction(p.params or 1.0, p.tokens, p.batch)
            own = _draws(p, len(boots))
            with np.errstate(divide="ignore"):  # a resample far out predicts 0 or inf: no resample
                log_boots = np.log(boots)
            log_boots[~np.isfinite(log_boots)] = np.nan
            spread = np.nanvar(log_boots) + max(float(np.nanvar(own)) if np.isfinite(own).any() else 0.0, SD_FLOOR**2)
            errors.append((math.log(p.value) - math.log(predicted)) / math.sqrt(spread))
    if len(errors) < 3:
        return 1.0, None
    factor = float(np.sqrt(np.mean(np.square(errors))))
    if factor <= 1.0:
        return 1.0, None
    return factor, f"intervals widened {factor:.2f}x: leaving one rung out missed by more than the bootstrap's spread"


def backtest(
    points: Sequence[Point], design: Design, seed: Any, measured: Optional[Point] = None, floor: bool = False
) -> Backtest:
    """Refit without the largest-compute rung and predict it (module docstring). `measured`: what
    the held-out rung measured, when its points are not single values of it (a law with a B term
    is fitted to batch sizes, and backtested on the rung's lr_opt at its B_opt)."""
    held = max(points, key=lambda p: (p.compute, p.tokens))
    rung = held.rung if held.rung is not None else id(held)
    rest = [p for p in points if (p.rung if p.rung is not None else id(p)) != rung]
    out = measured or held
    try:
        refit = fit(rest, design, seed=seed, floor=floor)
    except ValueError as e:
        return Backtest((out.params, out.tokens), None, out.value, None, None, f"no backtest: {e}")
    predicted, boots = refit.prediction(out.params or 1.0, out.tokens, out.batch)
    own = _draws(out, len(boots)) - math.log(out.value)
    held_in = interval_of(boots * np.exp(np.where(np.isfinite(own), own, 0.0)))
    if held_in is not None and math.log10(held_in[1] / held_in[0]) > UNTESTED_DECADES:
        note = (
            f"not a test: the refit's 90% interval spans {math.log10(held_in[1] / held_in[0]):.0f} decades "
            "(too few rungs left for its terms, or rungs too noisy)"
        )
        return Backtest((out.params, out.tokens), predicted, out.value, held_in, None, note)
    inside = held_in is not None and held_in[0] <= out.value <= held_in[1]
    return Backtest((out.params, out.tokens), predicted, out.value, held_in, bool(inside))


def batch_slope(sums: Sequence[Tuple[float, float, np.ndarray]], seed: Any) -> Optional[Value]:
    """The pooled within-rung slope of ln(best lr) on ln B near B_opt, from each rung's (sxx,
    point sxy, resampled sxy [R]); resampled over seeds and rungs; None without two batch sizes."""
    sums = [s for s in sums if s[0] > 0]
    if not sums:
        return None
    sxx = np.array([s[0] for s in sums])
    point = float(sum(s[1] for s in sums) / sxx.sum())
    draws = np.stack([s[2] for s in sums])  # [rungs, R]
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(sums), (draws.shape[1], len(sums)))
    boots = draws[pick, np.arange(draws.shape[1])[:, None]].sum(-1) / sxx[pick].sum(-1)
    return Value(point, interval_of(boots))
