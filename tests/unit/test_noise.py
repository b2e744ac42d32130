"""Gradient noise scale estimators, their EMA, and the critical-batch fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.noise import (
    NoiseScaleEMA,
    bootstrap_b_crit,
    estimate,
    fit_critical_batch,
    power_law_fit,
    steps_to_reach,
)


# ---------------------------------------------------------------- estimate


@settings(max_examples=300, deadline=None)
@given(
    g2=st.floats(1e-3, 1e3),
    trace=st.floats(0, 1e6),
    b_small=st.integers(1, 10_000),
    factor=st.integers(2, 1000),
)
def test_estimate_inverts_the_expectations_exactly(g2, trace, b_small, factor):
    b_big = b_small * factor
    small, big = g2 + trace / b_small, g2 + trace / b_big
    g2_hat, trace_hat = estimate(small, b_small, big, b_big)
    # Tolerances from the conditioning of the two differences, not a loose fudge.
    eps = 1e-12
    assert math.isclose(g2_hat, g2, rel_tol=1e-9, abs_tol=eps * (b_big * big + b_small * small) / (b_big - b_small))
    assert math.isclose(trace_hat, trace, rel_tol=1e-9, abs_tol=eps * small / (1 / b_small - 1 / b_big))


def test_estimate_is_unbiased_on_synthetic_gradients():
    """Per-token gradients ~ N(G, diag(var)); small = micro-batch means, big = their mean."""
    rng = np.random.default_rng(0)
    dim, b_small, n_micro, trials = 20, 8, 16, 4000
    G = rng.normal(size=dim) * 0.3
    var = rng.uniform(0.5, 2.0, size=dim)
    tokens = G + rng.normal(size=(trials, n_micro, b_small, dim)) * np.sqrt(var)
    micro = tokens.mean(axis=2)  # [trials, n_micro, dim]
    small = (micro**2).sum(-1).mean(-1)
    big = (micro.mean(axis=1) ** 2).sum(-1)
    est = np.array([estimate(s, b_small, b, b_small * n_micro) for s, b in zip(small, big)])
    g2_hat, trace_hat = est.mean(0)
    assert g2_hat == pytest.approx(float(G @ G), rel=0.03)
    assert trace_hat == pytest.approx(float(var.sum()), rel=0.03)
    # The naive estimate |G_big|^2 is biased up by tr(Sigma)/B_big: the correction matters.
    assert big.mean() - float(G @ G) == pytest.approx(var.sum() / (b_small * n_micro), rel=0.1)


@pytest.mark.parametrize("b_small,b_big", [(8, 8), (16, 8), (0, 8)])
def test_estimate_rejects_bad_batch_sizes(b_small, b_big):
    with pytest.raises(ValueError):
        estimate(1.0, b_small, 0.5, b_big)


# ---------------------------------------------------------------- EMA


def test_ema_first_value_is_the_input_and_bias_correction():
    ema = NoiseScaleEMA(0.9)
    assert ema.b_simple is None
    ema.update(2.0, 10.0)
    assert ema.g_squared == pytest.approx(2.0) and ema.trace_sigma == pytest.approx(10.0)
    assert ema.b_simple == pytest.approx(5.0)
    ema.update(4.0, 40.0)
    # By hand: raw = 0.9 * 0.1 * x1 + 0.1 * x2, corrected by 1 - 0.9^2 = 0.19.
    assert ema.g_squared == pytest.approx((0.09 * 2 + 0.1 * 4) / 0.19)
    assert ema.trace_sigma == pytest.approx((0.09 * 10 + 0.1 * 40) / 0.19)
    # The ratio of averages, not the average of ratios (which would be 5 + ... = 7.5ish).
    assert ema.b_simple == pytest.approx((0.09 * 10 + 0.1 * 40) / (0.09 * 2 + 0.1 * 4))


def test_ema_of_a_constant_is_that_constant():
    ema = NoiseScaleEMA(0.95)
    for _ in range(50):
        ema.update(3.0, 300.0)
    assert ema.b_simple == pytest.approx(100.0, rel=1e-12)


def test_ema_non_positive_g2_and_non_finite_inputs():
    ema = NoiseScaleEMA(0.5)
    ema.update(-1.0, 5.0)
    assert ema.b_simple is None  # ema(|G|^2) <= 0: no meaningful ratio yet
    ema.update(float("nan"), 1.0)
    ema.update(1.0, float("inf"))
    assert ema.count == 1
    ema.update(3.0, 5.0)
    assert ema.g_squared == pytest.approx((0.25 * -1 + 0.5 * 3) / 0.75)


def test_ema_state_dict_round_trip():
    a = NoiseScaleEMA(0.8)
    for g2, s in [(1.0, 7.0), (2.0, 5.0), (1.5, 9.0)]:
        a.update(g2, s)
    state = a.state_dict()
    assert all(isinstance(v, (int, float)) for v in state.values())
    b = NoiseScaleEMA(0.1)
    b.load_state_dict(state)
    a.update(0.7, 3.0)
    b.update(0.7, 3.0)
    assert b.b_simple == a.b_simple and b.decay == 0.8


# ---------------------------------------------------------------- critical batch


BATCHES = [2**k for k in range(8, 16)]


def test_fit_critical_batch_exact():
    s_min, e_min = 1000.0, 4.0e6
    steps = [s_min + e_min / b for b in BATCHES]
    s_hat, e_hat, b_crit = fit_critical_batch(BATCHES, steps)
    assert s_hat == pytest.approx(s_min, rel=1e-9)
    assert e_hat == pytest.approx(e_min, rel=1e-9)
    assert b_crit == pytest.approx(4000.0, rel=1e-9)


def test_fit_critical_batch_with_two_percent_noise():
    rng = np.random.default_rng(1)
    s_min, e_min = 1000.0, 4.0e6
    steps = [(s_min + e_min / b) * (1 + 0.02 * rng.standard_normal()) for b in BATCHES for _ in range(3)]
    s_hat, e_hat, b_crit = fit_critical_batch([b for b in BATCHES for _ in range(3)], steps)
    assert s_hat == pytest.approx(s_min, rel=0.05)
    assert e_hat == pytest.approx(e_min, rel=0.05)
    assert b_crit == pytest.approx(4000.0, rel=0.1)


def test_bootstrap_interval_covers_the_truth():
    """Over many noisy sweeps, the 90% interval holds the true B_crit most of the time."""
    rng = np.random.default_rng(3)
    batches = [b for b in BATCHES for _ in range(3)]
    covered = 0
    for trial in range(40):
        steps = [(1000.0 + 4.0e6 / b) * (1 + 0.02 * rng.standard_normal()) for b in batches]
        low, high = bootstrap_b_crit(batches, steps, n=200, seed=trial)
        assert low <= fit_critical_batch(batches, steps)[2] <= high
        assert high / low < 1.5  # 24 points at 2% noise: a tight interval
        covered += low <= 4000.0 <= high
    assert covered >= 30


def test_fit_critical_batch_constrains_coefficients():
    # Steps grow with batch size: the free fit has E_min < 0; constrained, E_min = 0.
    s_hat, e_hat, b_crit = fit_critical_batch([100, 200, 400], [10.0, 11.0, 12.0])
    assert e_hat == 0.0 and s_hat == pytest.approx(11.0) and b_crit == 0.0
    # Pure E/B data with a negative offset: S_min clamped to 0, B_crit infinite.
    s_hat, e_hat, b_crit = fit_critical_batch([100, 200, 400], [9.0, 4.0, 1.5])
    assert s_hat == 0.0 and e_hat > 0 and b_crit == math.inf
    with pytest.raises(ValueError):
        fit_critical_batch([100, 100], [5.0, 6.0])


def test_bootstrap_degenerate_cases():
    # Exact data: every resample gives the same B_crit.
    steps = [1000.0 + 4.0e6 / b for b in BATCHES]
    low, high = bootstrap_b_crit(BATCHES, steps, n=200)
    assert low == pytest.approx(4000.0) and high == pytest.approx(4000.0)
    # Two points: half the resamples repeat one point and are skipped, the rest are exact.
    # 2000 = S + E/256, 1250 = S + E/1024  ->  E = 256000, S = 1000, B_crit = 256.
    low, high = bootstrap_b_crit([256, 1024], [2000.0, 1250.0], n=50)
    assert low == pytest.approx(256.0) and high == pytest.approx(256.0)
    with pytest.raises(ValueError):
        bootstrap_b_crit([256], [2000.0])


# ---------------------------------------------------------------- curves and power laws


def test_steps_to_reach_interpolates():
    tokens = [0, 1000, 2000, 3000]
    losses = [5.0, 4.0, 3.0, 2.5]
    steps, reached = steps_to_reach(tokens, losses, tokens_per_update=100, target_loss=3.5)
    assert reached == pytest.approx(1500.0) and steps == pytest.approx(15.0)
    assert steps_to_reach(tokens, losses, 100, 3.0) == (20.0, 2000.0)  # exactly on a point
    assert steps_to_reach(tokens, losses, 100, 6.0) == (0.0, 0.0)
    assert steps_to_reach(tokens, losses, 100, 2.0) is None


def test_steps_to_reach_first_crossing_and_smoothing():
    tokens = [0, 100, 200, 300, 400]
    losses = [4.0, 2.0, 4.0, 2.0, 2.0]  # a spike below target at 100
    assert steps_to_reach(tokens, losses, 10, 2.5)[1] == pytest.approx(75.0)
    # Centred window of 3: [3.0, 3.33, 2.67, 2.67, 2.0] -> first <= 2.8 between 100 and 200.
    _, reached = steps_to_reach(tokens, losses, 10, 2.8, window=3)
    assert reached == pytest.approx(100 + (10 / 3 - 2.8) / (10 / 3 - 8 / 3) * 100)


@settings(max_examples=100, deadline=None)
@given(coef=st.floats(1e-6, 1e2), alpha=st.floats(-2, 2))
def test_power_law_fit_recovers_exact(coef, alpha):
    xs = [2.0**k for k in range(8, 16)]
    c_hat, a_hat = power_law_fit(xs, [coef * x**alpha for x in xs])
    assert a_hat == pytest.approx(alpha, abs=1e-9)
    assert c_hat == pytest.approx(coef, rel=1e-7)


def test_power_law_fit_with_noise():
    rng = np.random.default_rng(2)
    xs = np.array([2.0**k for k in range(8, 16)])
    ys = 3e-3 * xs**0.5 * np.exp(0.05 * rng.standard_normal(len(xs)))
    _, alpha = power_law_fit(xs, ys)
    assert alpha == pytest.approx(0.5, abs=0.05)
    with pytest.raises(ValueError):
        power_law_fit([1.0, 2.0], [1.0, -1.0])
