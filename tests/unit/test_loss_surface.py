"""One sweep's loss surface (orchestrator/analysis/loss_surface.py) and the penalty curve and trade-off
read from it (orchestrator/analysis/tradeoff.py): against a surface of the fitted form computed by
hand, against the basin worlds of tests/basin_truth.py (a linex penalty and an asymmetric lr
response: not the fitted form), and on a world where the smallest batch is best."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.analysis import loss_surface, tradeoff
from orchestrator.analysis.ladder_laws import interval_of
from orchestrator.analysis.ladder_rungs import loss_metric
from tests.basin_truth import BasinWorld
from tests.ladder_truth import WORLDS as MONOTONE_WORLDS


def exact_grid(theta, batches, lrs, x0, y0):
    """Final losses that are exactly exp(the fitted form) with coefficients theta."""
    b, lr = np.meshgrid(batches, lrs, indexing="ij")
    x, y = np.log(b.ravel()) - x0, np.log(lr.ravel()) - y0
    c = theta
    log_loss = c[0] + c[1] * x + c[2] * y + c[3] * x * x + c[4] * y * y + c[5] * x * y + c[6] * x**3
    return loss_surface.Grid.from_arrays(b.ravel(), lr.ravel(), np.exp(log_loss))


def floor_slope(surface, log_batch: float, step: float = 0.05) -> float:
    """d ln lr / d ln B along the surface's floor: how the best lr moves with B."""
    return (surface.floor(log_batch + step)[1] - surface.floor(log_batch - step)[1]) / (2 * step)


def test_a_surface_of_the_fitted_form_is_recovered_with_its_optimum_in_closed_form():
    batches = 2.0 ** np.arange(14, 21)  # 16Ki .. 1Mi tokens
    lrs = 1e-3 * math.sqrt(2) ** np.arange(-4, 5)
    x0, y0 = float(np.log(batches).mean()), float(np.log(lrs).mean())
    theta = np.array([0.8, -0.01, 0.02, 0.006, 0.03, -0.02, 0.001])
    surface = loss_surface.fit(exact_grid(theta, batches, lrs, x0, y0))
    # The fit's own centring differs (it centres on the configurations in its window): compare the
    # surfaces, not the coefficients, at points of the grid.
    x = np.linspace(np.log(batches[0]), np.log(batches[-1]), 7)
    fitted, _ = surface.floor(x)
    # By hand: the floor is min over y of a quadratic in y: c0 + c1 x + c3 x^2 + c6 x^3 - (c2 + c5 x)^2 / 4 c4.
    u = x - x0
    c = theta
    by_hand = c[0] + c[1] * u + c[3] * u * u + c[6] * u**3 - (c[2] + c[5] * u) ** 2 / (4 * c[4])
    assert np.allclose(fitted, by_hand, atol=1e-9)
    # B*: the root of the floor's derivative where its second derivative is positive.
    a1, a2, a3 = c[1] - c[2] * c[5] / (2 * c[4]), c[3] - c[5] ** 2 / (4 * c[4]), c[6]
    u_star = -a1 / (a2 + math.sqrt(a2 * a2 - 3 * a1 * a3))
    log_b, log_lr, log_loss = surface.optimum()
    assert surface.status == "resolved"
    grid_step = math.log(16.0) / loss_surface.PROFILE_POINTS  # the floor is read on a grid this fine
    assert log_b == pytest.approx(x0 + u_star, abs=grid_step)
    assert log_lr == pytest.approx(y0 - (c[2] + c[5] * (log_b - x0)) / (2 * c[4]), abs=1e-9)
    summary = surface.summary()
    assert floor_slope(surface, log_b) == pytest.approx(-c[5] / (2 * c[4]))  # the best lr ~ B^eta
    # The penalties at B* / 2 and 2 B* are the floor's rise there.
    for shift, penalty in ((-math.log(2), summary.penalty_half), (math.log(2), summary.penalty_double)):
        rise = surface.floor(log_b + shift)[0] - surface.floor(log_b)[0]
        assert penalty == pytest.approx(math.expm1(rise))


def test_on_a_basin_world_rung_b_star_lr_and_the_penalties_are_near_the_truth():
    world = BasinWorld(seeds=2)
    for n, d in world.rungs()[::4]:
        trials = world.trials([(n, d)])
        surface = loss_surface.fit(loss_surface.Grid.of(trials, loss_metric(trials)))
        assert surface.status == "resolved"
        s = surface.summary()
        assert math.exp(s.log_b_star) == pytest.approx(world.b_star(n, d), rel=0.12)
        assert floor_slope(surface, s.log_b_star) == pytest.approx(world.eta, abs=0.1)
        b = math.exp(s.log_b_star)
        truth = world.penalty(n, d, [world.b_star(n, d) / 2, 2 * world.b_star(n, d)])
        assert [s.penalty_half, s.penalty_double] == pytest.approx(truth, abs=0.0006)
        lo, hi = interval_of(np.exp(s.draws_b_star))
        assert lo < b < hi and hi / lo < 1.6


def test_with_one_seed_the_residuals_give_the_intervals():
    world = BasinWorld(seeds=1)
    n, d = world.rungs()[4]
    trials = world.trials([(n, d)])
    grid = loss_surface.Grid.of(trials, "eval/loss")
    assert len(grid.deviations) == 0 and set(grid.seeds) == {1}
    surface = loss_surface.fit(grid)
    assert not surface.seeded
    s = surface.summary()
    interval = interval_of(np.exp(s.draws_b_star))
    assert interval is not None and interval[0] < interval[1]


def test_where_the_smallest_batch_is_best_b_star_is_below_not_resolved():
    """The McCandlish worlds of tests/ladder_truth.py: at equal tokens the loss falls all the way to
    the smallest batch tried, so there is no interior optimum to claim."""
    world = MONOTONE_WORLDS["power-law"]
    for n, d in world.rungs()[::4]:
        trials = world.trials([(n, d)])
        surface = loss_surface.fit(loss_surface.Grid.of(trials, loss_metric(trials)))
        assert surface.status == "below", surface.notes
        assert "at or below" in surface.notes[0]


def test_too_few_configurations_make_no_surface():
    grid = loss_surface.Grid.from_arrays([64, 128, 256] * 2, [1e-3] * 3 + [2e-3] * 3, [3.0, 2.9, 3.1] * 2)
    assert loss_surface.fit(grid) is None


def test_the_tolerance_point_is_where_the_floor_crosses_the_tolerance():
    batches = 2.0 ** np.arange(14, 21)
    lrs = 1e-3 * math.sqrt(2) ** np.arange(-4, 5)
    x0, y0 = float(np.log(batches).mean()), float(np.log(lrs).mean())
    theta = np.array([0.8, 0.0, 0.0, 0.006, 0.03, 0.0, 0.0])  # floor: 0.8 + 0.006 u^2 around B* = e^x0
    surface = loss_surface.fit(exact_grid(theta, batches, lrs, x0, y0))
    point, draws, beyond = surface.summary().curve().tolerance_point(0.005)
    # ln(1.005) = 0.006 u^2 (the fit's centring is the same here: a symmetric window).
    assert not beyond
    assert math.log(point) == pytest.approx(x0 + math.sqrt(math.log(1.005) / 0.006), abs=0.01)
    assert np.allclose(draws, point)  # no noise: every resample is the data


# ---------------------------------------------------------------- the penalty curve


def cubic_curve(a: float, b: float, b_star: float = 1e6, draws: int = 5) -> tradeoff.Curve:
    half, double = (
        math.expm1(a * math.log(2) ** 2 - b * math.log(2) ** 3),
        math.expm1(a * math.log(2) ** 2 + b * math.log(2) ** 3),
    )
    ones = np.ones(draws)
    return tradeoff.Curve.of((b_star, b_star * ones), (half, half * ones), (double, double * ones))


def test_the_curve_through_two_penalties_is_the_cubic_they_came_from():
    curve = cubic_curve(0.006, 0.0015)
    assert curve.a == pytest.approx(0.006) and curve.b == pytest.approx(0.0015)
    for u in np.linspace(-1.4, 1.4, 9):
        expected = math.expm1(0.006 * u * u + 0.0015 * u**3)
        assert curve.penalty(1e6 * math.exp(u))[0] == pytest.approx(expected, rel=1e-9)


def test_the_curves_tolerance_point_solves_its_cubic():
    curve = cubic_curve(0.006, 0.0015)
    batch, draws, beyond = curve.tolerance_point(0.005)
    # Brute force: bisection of a u^2 + b u^3 = ln(1.005) on (0, 2 ln 2).
    lo, hi = 0.0, 2 * math.log(2)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.006 * mid**2 + 0.0015 * mid**3 < math.log(1.005) else (lo, mid)
    assert not beyond and batch == pytest.approx(1e6 * math.exp(lo), rel=1e-4)
    assert np.allclose(draws, batch)
    # A tolerance the curve stays within up to 4 B*: a bound, said so.
    batch, _, beyond = curve.tolerance_point(0.5)
    assert beyond and batch == pytest.approx(4e6)


def test_the_tradeoff_table_and_its_two_points():
    curve = cubic_curve(0.006, 0.0015)
    tokens = 1e10

    def lr_at(batch, draws):  # lr ~ B^0.3 from 1e-3 at B*
        lr = 1e-3 * (batch / 1e6) ** 0.3
        return lr, None if draws is None else 1e-3 * (np.asarray(draws) / 1e6) ** 0.3

    t = tradeoff.tradeoff(curve, lr_at, tokens, 0.005)
    assert t.loss_optimal.tokens_per_update.value == pytest.approx(1e6)
    point = t.tolerance_point
    assert point.predicted_loss_penalty.value == pytest.approx(0.005, rel=1e-3)
    assert point.steps_saved.value == pytest.approx(tokens / 1e6 - tokens / point.tokens_per_update.value)
    assert point.lr.value == pytest.approx(lr_at(point.tokens_per_update.value, None)[0])
    batches = [r.tokens_per_update for r in t.rows]
    assert batches[0] == pytest.approx(1e6 / 4) and batches[-1] == pytest.approx(4e6) and len(batches) == 9
    middle = t.rows[len(t.rows) // 2]
    assert middle.predicted_loss_penalty == pytest.approx(0.0, abs=1e-12) and middle.steps == pytest.approx(1e4)
    assert [r.steps for r in t.rows] == sorted((r.steps for r in t.rows), reverse=True)
