"""orchestrator/analysis/lr_optimum.py: the best over an lr grid, against exact parabolas in each
form, a neighbour without a value, convex noise, edges, and rows refined each as alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.analysis import lr_optimum as lo

LIN, LOG = ("lin", "lin"), ("log", "log")
GRID = 1e-3 * 2.0 ** np.arange(7)  # factor 2, seven lrs


def quadratic(lr, optimum):
    """McCandlish's progress per step, 2 f - f^2 in f = lr / optimum: a parabola in the lr."""
    f = lr / optimum
    return 2 * f - f * f


def lognormal(lr, optimum, width=1.0):
    """A log-normal response: its log is a parabola in log lr."""
    return np.exp(-0.5 * (np.log(lr / optimum) / width) ** 2)


@given(offset=st.floats(0.05, 0.45))
@settings(max_examples=40, deadline=None)
def test_each_exact_form_is_chosen_by_its_residual_and_its_vertex_found(offset):
    """Four points or more: the form that leaves no residual wins, whichever is listed first. (The
    optimum lies above the best lr tried, so both its neighbours make progress: 2 f - f^2 > 0.)"""
    optimum = 8e-3 * 2.0**offset
    for response in (quadratic, lognormal):
        values = response(GRID, optimum)
        values[values <= 0] = np.nan  # so slow it never reached the target
        for forms in ((LIN, LOG), (LOG, LIN)):
            best = lo.best_over(GRID, values, maximize=True, forms=forms)
            assert float(best.position) == pytest.approx(optimum, rel=1e-6), (response.__name__, forms)
            assert float(best.value) == pytest.approx(1.0, rel=1e-9)
            assert int(best.kind) == lo.INTERPOLATED and best.flag_word() is None


def test_a_minimum_is_found_the_same_way():
    loss = 2.0 + 0.3 * np.log(GRID / 5e-3) ** 2
    best = lo.best_over(GRID, loss, maximize=False, forms=[("log", "lin")])
    assert float(best.position) == pytest.approx(5e-3) and float(best.value) == pytest.approx(2.0)
    assert float(best.at_index) == pytest.approx(loss.min())


def test_a_failed_neighbour_makes_the_optimum_one_sided_and_flagged():
    """The response is exact on the lower side; the lr above the best failed. The vertex is
    extrapolated past the best, at most half a grid step (sqrt(2) on a factor-2 grid)."""
    best_tried = GRID[3]
    for optimum, expected in ((best_tried * 1.2, best_tried * 1.2), (best_tried * 1.9, best_tried * math.sqrt(2))):
        values = quadratic(GRID, optimum)
        values[4:] = np.nan  # failed
        best = lo.best_over(GRID, values, maximize=True, forms=[LIN, LOG])
        assert int(best.index) == 3 and int(best.edge) == 0, "a failed lr above the best still brackets it"
        assert int(best.kind) == lo.ONE_SIDED and best.flag_word() == "one-sided" and bool(best.flagged)
        assert float(best.position) == pytest.approx(expected, rel=1e-6)
        assert float(best.value) == pytest.approx(float(quadratic(np.array(expected), optimum)), rel=1e-9)


def test_no_concave_parabola_keeps_the_best_point_and_flags_it():
    values = np.array([1.0, 2.0, 1.9, 2.05, 1.0, np.nan, np.nan])  # a zigzag: convex around the best
    best = lo.best_over(GRID, values, maximize=True, forms=[LIN, LOG])
    assert int(best.index) == 3 and int(best.kind) == lo.FLAT and best.flag_word() == "not interpolated"
    assert float(best.value) == 2.05 and float(best.position) == GRID[3]
    two = lo.best_over(GRID, np.array([np.nan, np.nan, 1.0, 2.0, np.nan, np.nan, np.nan]), True, [LIN])
    assert int(two.kind) == lo.FLAT and float(two.value) == 2.0, "two points make no parabola"


def test_edges_and_a_single_lr():
    x = GRID[:3]
    assert lo.best_over(x, np.array([3.0, 2.0, 1.0]), maximize=False, forms=[LIN]).flag_word() == "highest"
    assert lo.best_over(x, np.array([1.0, 2.0, np.nan]), maximize=False, forms=[LIN]).flag_word() == "lowest"
    only = lo.best_over(x[:1], np.array([5.0]), maximize=True, forms=[LIN])
    assert only.flag_word() == "only" and float(only.value) == 5.0


def test_rows_are_resamples_each_refined_as_alone():
    rng = np.random.default_rng(1)
    rows = quadratic(GRID, 9e-3) * np.exp(0.1 * rng.normal(size=(60, 7)))
    rows[rng.random((60, 7)) < 0.15] = np.nan
    together = lo.best_over(GRID, rows, maximize=True, forms=[LIN, LOG])
    for i, row in enumerate(rows):
        alone = lo.best_over(GRID, row, maximize=True, forms=[LIN, LOG])
        for field in ("value", "position", "kind", "edge", "step"):
            assert np.allclose(getattr(together, field)[i], getattr(alone, field), equal_nan=True), (i, field)


def test_the_grid_error_is_the_rms_cost_of_up_to_half_a_step_off_a_quadratic_optimum():
    """Brute force over offsets uniform in log lr within half a factor-2 step: steps / fewest =
    1 / (2 f - f^2); at the worst, sqrt(2) off, 2 sqrt(2) - 2 = 0.83 of the best speed."""
    u = np.random.default_rng(0).uniform(-0.5, 0.5, 400_000) * math.log(2)
    excess = -np.log(2 * np.exp(u) - np.exp(2 * u))
    assert float(lo.grid_error(2.0)) == pytest.approx(math.sqrt(np.mean(excess**2)), rel=2e-3)
    assert float(lo.grid_error(2.0)) < -math.log(2 * math.sqrt(2) - 2)
    assert float(lo.grid_error(1.0)) == 0.0
    assert float(lo.grid_error(4.0)) > float(lo.grid_error(2.0))
