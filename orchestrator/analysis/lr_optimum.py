"""The best of a run's outcome over a grid of learning rates (pure: numpy only).

An lr grid of factor 2 misses the optimum by up to a factor sqrt(2), differently at every batch
size, which would bend any fit across batch sizes; so the best comes from a parabola through the
best grid point and its neighbours, not from the best grid point. The rule, per row (rows are
bootstrap resamples and targets):

- **The form.** Each caller names two forms of the parabola, e.g. for steps to a target the
  speed 1 / S in the lr (progress per step is quadratic in the lr in the second-order model the
  hyperbola comes from: lr |G|^2 - lr^2 (G'HG + tr(H Sigma) / B) / 2, McCandlish et al. 2018)
  and log speed in log lr (exact for a log-normal lr response). Both are fitted by least squares
  to the best four points that have a value (the best, its neighbours and the better of the next
  two); the one that leaves the smaller relative residual is used, the first on a tie (three
  points leave no residual to choose by).
- **Two-sided** (`kind` INTERPOLATED): both neighbours of the best have a value; the vertex of a
  concave parabola, kept between the neighbours.
- **One-sided** (`kind` ONE_SIDED): a neighbour failed or never reached the target (NaN: worse
  than any number, so it brackets the best but has no value). The parabola through the best and
  the points on the other side is extrapolated at most half a grid step past the best towards the
  missing neighbour: where the optimum lies between the best and a failed lr, the best grid point
  alone overstates the steps by up to a fifth on a factor-2 grid.
- **Not interpolated** (`kind` FLAT): no concave parabola through what there is (too few points,
  or noise made it convex); the best grid point's value is used.
- **Edges** (`edge`): a best at the lowest or highest lr tried is an edge whatever else: its value
  is the best grid point's, a bound.

Everything but an interpolated interior optimum is flagged wherever it is used (`flag_word`), and
`grid_error` is the error such a point carries: what up to half a grid step costs a quadratic response.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np

INTERPOLATED, ONE_SIDED, FLAT = 0, 1, 2
REACH = 0.5
"""How far past the best grid point, in grid steps, a one-sided optimum may be extrapolated."""
FORMS = {"lin": lambda v: v, "log": np.log}
"""How a coordinate enters the parabola: as it is, or its logarithm."""
Form = Tuple[str, str]
"""(x form, y form): ("lin", "lin") is the value in the lr, ("log", "log") its log in log lr."""


@dataclass
class Optimum:
    """The best over a grid of learning rates, per row."""

    value: np.ndarray
    position: np.ndarray
    """The learning rate of the refined best."""
    index: np.ndarray
    """The best grid point."""
    at_index: np.ndarray
    """The value at the best grid point: how far the parabola moved it is the scale of its error."""
    edge: np.ndarray
    """-1: the best is the lowest lr tried; 1: the highest; 0: interior (2: the only one)."""
    kind: np.ndarray
    """INTERPOLATED, ONE_SIDED or FLAT (module docstring); edges are FLAT."""
    step: np.ndarray
    """The grid's factor around the best (the larger of its two steps)."""

    def edge_word(self, i: Any = ()) -> Optional[str]:
        """The edge (of row or target i) as the report says it: lowest, highest, only, or None."""
        return {-1: "lowest", 1: "highest", 2: "only"}.get(int(self.edge[i]))

    def flag_word(self, i: Any = ()) -> Optional[str]:
        """Why the optimum of row i is not a two-sided interpolation, or None: the edge, else
        `one-sided` or `not interpolated`."""
        return self.edge_word(i) or {ONE_SIDED: "one-sided", FLAT: "not interpolated"}.get(int(self.kind[i]))

    @property
    def flagged(self) -> np.ndarray:
        return (self.edge != 0) | (self.kind != INTERPOLATED)


def grid_error(step: np.ndarray) -> np.ndarray:
    """The root mean square of the log excess of steps of an lr anywhere within half a grid step
    of the optimum of a quadratic response (2 f - f^2, f the lr over the optimal one; ln f uniform
    over +-ln(step) / 2): the error scale of an optimum that no two-sided parabola refined (0.06
    on a factor-2 grid, whose worst case, sqrt(2) off, is 0.19)."""
    steps, where = np.unique(np.asarray(step, np.float64), return_inverse=True)  # a grid has few
    offsets = (np.arange(200) + 0.5) / 200 - 0.5  # midpoints
    f = np.exp(np.multiply.outer(np.log(steps), offsets))
    excess = -np.log(np.clip(2 * f - f * f, 1e-3, None))
    return np.sqrt((excess**2).mean(-1))[where].reshape(np.shape(step))


def best_over(lrs: Sequence[float], values: np.ndarray, maximize: bool, forms: Sequence[Form]) -> Optimum:
    """The extreme of `values` [..., L] (NaN: failed or never reached) over the sorted positive
    learning rates `lrs` [L], by the rule of the module docstring."""
    lr = np.asarray(lrs, np.float64)
    log_lr = np.log(lr)
    y = np.asarray(values, np.float64)
    n = len(log_lr)
    sign = 1.0 if maximize else -1.0
    s = np.where(np.isnan(y), -np.inf, sign * y)  # maximise s; -inf: worse than any
    best = np.argmax(s, axis=-1)
    at_best = np.take_along_axis(y, best[..., None], -1)[..., 0]
    if n == 1:
        return Optimum(
            at_best,
            lr[best],
            best,
            at_best,
            np.full(best.shape, 2),
            np.full(best.shape, FLAT),
            np.ones(best.shape),
        )
    gaps = np.diff(log_lr)
    below, above = gaps[np.clip(best - 1, 0, None)], gaps[np.clip(best, None, n - 2)]
    edge = np.where(best == 0, -1, np.where(best == n - 1, 1, 0))
    result = Optimum(
        at_best, lr[best], best, at_best, edge, np.full(best.shape, FLAT), np.exp(np.maximum(below, above))
    )

    # Candidates: the best and up to three points on each side, each counted only through an
    # unbroken run of points with a value back to the best.
    offsets = np.arange(-3, 4)
    index = np.clip(best[..., None] + offsets, 0, n - 1)
    inside = (best[..., None] + offsets >= 0) & (best[..., None] + offsets < n)
    valid = inside & np.isfinite(np.take_along_axis(s, index, -1))
    for i in (2, 1, 0):  # the left side, inwards first
        valid[..., i] &= valid[..., i + 1]
    for i in (4, 5, 6):
        valid[..., i] &= valid[..., i - 1]
    left, right = valid[..., 2], valid[..., 4]
    # The best four: the best and its neighbours with a value first, then the better outer points.
    priority = np.where(valid, np.where(np.abs(offsets) <= 1, np.inf, np.take_along_axis(s, index, -1)), -np.inf)
    use = np.zeros(valid.shape, bool)
    np.put_along_axis(use, np.argsort(-priority, axis=-1, kind="stable")[..., :4], True, -1)
    use &= valid
    # The vertex stays between the neighbours; towards a missing neighbour half a grid step at most.
    low = log_lr[best] - np.where(left, 1.0, REACH) * below
    high = log_lr[best] + np.where(right, 1.0, REACH) * above
    fits = [_parabola(log_lr[index], np.take_along_axis(y, index, -1), use, form, low, high, sign) for form in forms]
    residual = np.stack([np.where(np.isnan(f[2]), np.inf, f[2]) for f in fits])
    choice = np.argmin(residual, axis=0)  # the first form on a tie
    vertex = np.choose(choice, [f[0] for f in fits])
    peak = np.choose(choice, [f[1] for f in fits])
    ok = (edge == 0) & (use.sum(-1) >= 3) & np.isfinite(peak) & (sign * peak >= sign * at_best)
    result.value = np.where(ok, peak, at_best)
    result.position = np.where(ok, np.exp(vertex), lr[best])
    result.kind = np.where(ok & left & right, INTERPOLATED, np.where(ok, ONE_SIDED, FLAT))
    return result


def _parabola(log_x, y, use, form: Form, low, high, sign) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vertex in log lr, the value there, relative residual) of the least-squares parabola in
    `form` through the points `use` selects, per row; NaN where it is not concave towards the best."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        x = np.exp(log_x) if form[0] == "lin" else log_x
        v = np.log(y) if form[1] == "log" else y
        w = use & np.isfinite(v)
        count = w.sum(-1)
        # Centred and scaled, so the normal equations stay well conditioned on either axis.
        centre = np.where(w, x, 0.0).sum(-1) / np.maximum(count, 1)
        spread = np.sqrt(np.where(w, (x - centre[..., None]) ** 2, 0.0).sum(-1) / np.maximum(count, 1))
        spread = np.where(spread > 0, spread, 1.0)
        u = np.where(w, (x - centre[..., None]) / spread[..., None], 0.0)
        design = np.stack([np.ones_like(u), u, u * u], -1) * w[..., None]
        normal = np.einsum("...ki,...kj->...ij", design, design)
        fitted = count >= 3
        normal = np.where(fitted[..., None, None], normal, np.eye(3))
        rhs = np.einsum("...ki,...k->...i", design, np.where(w, v, 0.0))
        c0, c1, c2 = np.moveaxis(np.linalg.solve(normal, rhs[..., None])[..., 0], -1, 0)
        u_vertex = -c1 / (2 * c2)
        x_vertex = centre + spread * u_vertex
        log_vertex = np.log(x_vertex) if form[0] == "lin" else x_vertex
        log_vertex = np.clip(log_vertex, low, high)
        u_at = ((np.exp(log_vertex) if form[0] == "lin" else log_vertex) - centre) / spread
        at = c0 + c1 * u_at + c2 * u_at * u_at
        peak = np.exp(at) if form[1] == "log" else at
        residual = np.where(w, v - (c0[..., None] + c1[..., None] * u + c2[..., None] * u * u), 0.0)
        dof = count - 3
        rms = np.sqrt((residual**2).sum(-1) / np.maximum(dof, 1))
        if form[1] == "lin":  # relative, as the log form's residual is
            rms = rms / np.abs(np.where(w, v, 0.0)).max(-1)
        relative = np.where(dof > 0, rms, 0.0)
    good = fitted & (sign * c2 < 0) & np.isfinite(log_vertex) & np.isfinite(peak)
    return np.where(good, log_vertex, np.nan), np.where(good, peak, np.nan), np.where(good, relative, np.nan)
