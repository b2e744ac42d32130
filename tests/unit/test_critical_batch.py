"""The arithmetic of orchestrator/analysis/critical_batch.py against closed forms and brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.analysis import critical_batch as cb

BATCHES = np.array([128, 256, 512, 1024, 2048, 4096], np.float64)


# ---------------------------------------------------------------- curves


def test_a_strictly_falling_curve_is_its_own_monotone_fit_and_crossings_interpolate():
    tokens = np.arange(0, 1000, 10.0)
    losses = 5.0 * np.exp(-tokens / 400)
    positions, values = cb.monotone(tokens, losses)
    assert np.array_equal(positions, tokens) and np.allclose(values, losses)
    level = 2.0
    exact = -400 * math.log(level / 5.0)
    assert cb.first_crossing((positions, values), level) == pytest.approx(exact, abs=0.5)
    assert cb.first_crossing((positions, values), 0.1) is None
    assert cb.value_at((positions, values), 55.0) == pytest.approx(np.interp(55.0, tokens, losses))


def test_the_monotone_fit_never_rises_and_its_crossing_is_unbiased_under_noise():
    """The old centred window shifted crossings on convex curves; the isotonic fit does not."""
    rng = np.random.default_rng(0)
    tokens = np.arange(0, 20_000, 20.0)
    clean = 2.0 + 3.0 / (1 + tokens / 2000)  # convex
    level = 3.0
    truth = 2000 * (3.0 / (level - 2.0) - 1)
    found = []
    for _ in range(200):
        curve = cb.monotone(tokens, clean + 0.05 * rng.standard_normal(len(tokens)))
        assert np.all(np.diff(curve[1]) < 0) and np.all(np.diff(curve[0]) > 0)
        found.append(cb.first_crossing(curve, level))
    assert np.mean(found) == pytest.approx(truth, rel=0.01)


def test_presmoothing_is_a_centred_window_in_tokens():
    t = np.array([0.0, 10, 20, 30, 40])
    v = np.array([1.0, 2, 3, 4, 5])
    assert np.allclose(cb.smooth(t, v, 20), [1.5, 2, 3, 4, 4.5])
    assert np.array_equal(cb.smooth(t, v, 0), v)


# ---------------------------------------------------------------- the fit


@given(b_crit=st.floats(30.0, 20_000.0), s_min=st.floats(5.0, 5000.0))
@settings(max_examples=60, deadline=None)
def test_an_exact_hyperbola_is_recovered(b_crit, s_min):
    steps = s_min * (1 + b_crit / BATCHES)
    fit = cb.fit(BATCHES, steps[None, :])
    assert float(fit.b_crit[0]) == pytest.approx(b_crit, rel=2e-3)
    assert float(fit.s_min[0]) == pytest.approx(s_min, rel=2e-3)
    assert float(fit.e_min[0]) == pytest.approx(s_min * b_crit, rel=3e-3)


def test_steps_flat_or_falling_as_one_over_b_are_the_grid_edges():
    flat = cb.fit(BATCHES, np.full((1, 6), 100.0))
    assert int(flat.at_grid_edge[0]) == -1 and float(flat.b_crit[0]) < BATCHES[0] / 100
    inverse = cb.fit(BATCHES, (1e6 / BATCHES)[None, :])
    assert int(inverse.at_grid_edge[0]) == 1 and float(inverse.b_crit[0]) > BATCHES[-1] * 100


def test_the_fit_weighs_points_by_their_variance():
    steps = 40 * (1 + 700 / BATCHES)
    off = steps.copy()
    off[0] *= 1.5  # one bad point
    equal = float(cb.fit(BATCHES, off[None]).b_crit[0])
    trusted_less = float(cb.fit(BATCHES, off[None], weights=[0.01, 1, 1, 1, 1, 1]).b_crit[0])
    assert abs(trusted_less / 700 - 1) < abs(equal / 700 - 1) / 5


def test_the_fit_is_least_squares_in_log_steps():
    """Brute force over a fine grid of (S_min, B_crit) finds the same minimum."""
    rng = np.random.default_rng(2)
    steps = 40 * (1 + 700 / BATCHES) * np.exp(0.05 * rng.standard_normal(6))
    fit = cb.fit(BATCHES, steps[None])
    grid_b = np.geomspace(300, 1500, 801)
    grid_s = np.geomspace(30, 55, 801)
    sse = ((np.log(steps) - np.log(grid_s[:, None, None] * (1 + grid_b[None, :, None] / BATCHES))) ** 2).sum(-1)
    i, j = np.unravel_index(np.argmin(sse), sse.shape)
    assert float(fit.b_crit[0]) == pytest.approx(grid_b[j], rel=0.005)
    assert float(fit.sse[0]) <= sse.min() + 1e-9


def test_lack_of_fit_is_calibrated_under_the_hyperbola_and_flags_a_sharper_knee():
    rng = np.random.default_rng(3)
    sigma, seeds, dof = 0.05, 3, 24
    var = sigma**2 / seeds
    ps = []
    for _ in range(2000):
        steps = 40 * (1 + 700 / BATCHES) * np.exp(math.sqrt(var) * rng.standard_normal(6))
        fit = cb.fit(BATCHES, steps[None], weights=np.full(6, 1 / var))
        ps.append(cb.lack_of_fit(float(fit.sse[0]), 6, dof))
    rate = np.mean(np.array(ps) < 0.05)
    assert 0.02 < rate < 0.07, rate  # F(4, 24) with a known variance is a little conservative
    knee = 40 * np.sqrt(1 + (700 / BATCHES) ** 2)  # a sharper knee
    fit = cb.fit(BATCHES, knee[None], weights=np.full(6, 1 / var))
    assert cb.lack_of_fit(float(fit.sse[0]), 6, dof) < 1e-3
    assert cb.lack_of_fit(1.0, 2, dof) is None and cb.lack_of_fit(1.0, 6, 0) is None


def test_slope_and_interval():
    x = np.array([3.0, 3.3, 3.8])
    assert float(cb.slope(x, 5.0 * x**-2.5)) == pytest.approx(-2.5)
    values = np.arange(1001.0)
    assert cb.percentile_interval(values, 0.9) == (50.0, 950.0)
