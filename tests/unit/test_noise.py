"""Gradient noise scale estimators, their EMA, and the critical-batch fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.noise import (
    NoiseScaleEMA,
    best_config,
    bootstrap_b_crit,
    estimate,
    fit_critical_batch,
    per_token_sq_norm,
    power_law_fit,
    smooth,
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
    ema = NoiseScaleEMA(ema_tokens=1000)
    assert ema.b_simple is None
    ema.update(2.0, 10.0, tokens=100)
    assert ema.g_squared == pytest.approx(2.0) and ema.trace_sigma == pytest.approx(10.0)
    assert ema.b_simple == pytest.approx(5.0)
    ema.update(4.0, 40.0, tokens=300)
    # By hand: the first input's weight decays by exp(-300/1000) over the second update's
    # tokens; the bias correction divides by 1 - exp(-400/1000).
    d1, d2 = math.exp(-0.1), math.exp(-0.3)
    raw_g, raw_s = d2 * (1 - d1) * 2 + (1 - d2) * 4, d2 * (1 - d1) * 10 + (1 - d2) * 40
    assert ema.g_squared == pytest.approx(raw_g / (1 - math.exp(-0.4)))
    assert ema.trace_sigma == pytest.approx(raw_s / (1 - math.exp(-0.4)))
    # The ratio of averages, not the average of ratios.
    assert ema.b_simple == pytest.approx(raw_s / raw_g)


@pytest.mark.parametrize("stretch", [8192, 65536])
def test_ema_lag_is_the_same_in_tokens_for_every_batch_size(stretch):
    """A step change in the inputs is followed alike by runs at 512 and 8,192 tokens per update:
    the EMA forgets per token, so its lag does not grow with the batch size."""
    seen = []
    for batch in (512, 2048, 8192):
        ema = NoiseScaleEMA(ema_tokens=20000)
        for tokens in range(0, 3 * stretch, batch):
            level = 1.0 if tokens < stretch else 3.0
            ema.update(level, 100 * level, tokens=batch)
        seen.append(ema.g_squared)
    assert seen == pytest.approx([seen[0]] * 3, rel=1e-12)
    assert 1.0 < seen[0] < 3.0


def test_ema_of_a_constant_is_that_constant():
    ema = NoiseScaleEMA(ema_tokens=5000)
    for _ in range(50):
        ema.update(3.0, 300.0, tokens=512)
    assert ema.b_simple == pytest.approx(100.0, rel=1e-12)


def test_ema_non_positive_g2_and_non_finite_inputs():
    ema = NoiseScaleEMA(ema_tokens=100)
    ema.update(-1.0, 5.0, tokens=100)
    assert ema.b_simple is None  # ema(|G|^2) <= 0: no meaningful ratio yet
    ema.update(float("nan"), 1.0, tokens=100)
    ema.update(1.0, float("inf"), tokens=100)
    assert ema.tokens == 100  # a skipped update does not age the average either
    ema.update(3.0, 5.0, tokens=100)
    d = math.exp(-1)
    assert ema.g_squared == pytest.approx((d * (1 - d) * -1 + (1 - d) * 3) / (1 - d**2))


def test_ema_state_dict_round_trip():
    a = NoiseScaleEMA(ema_tokens=800)
    for g2, s in [(1.0, 7.0), (2.0, 5.0), (1.5, 9.0)]:
        a.update(g2, s, tokens=256)
    state = a.state_dict()
    assert all(isinstance(v, (int, float)) for v in state.values())
    b = NoiseScaleEMA(ema_tokens=1)
    b.load_state_dict(state)
    a.update(0.7, 3.0, tokens=256)
    b.update(0.7, 3.0, tokens=256)
    assert b.b_simple == a.b_simple and b.ema_tokens == 800


def test_fp16_loss_scale_is_divided_out_of_the_small_batch_norms():
    """The probe's hooks see gradients of the loss as DeepSpeed backpropagates it: the summed
    token loss x D / N (token weighting) x the fp16 loss scale. Unscaled, B_simple equals the
    computation on plain per-token-mean gradients; left scaled, |G|^2 comes out negative."""
    import torch

    from workloads.gns_probe import GradNormProbe

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    x, y = torch.randn(4, 16, 8), torch.randn(4, 16)  # 4 micro-batches of 16 tokens
    workers, loss_scale = 2, 2.0**16
    total = 2 * 64  # tokens of the update over both workers
    weight = workers / total
    probe = GradNormProbe(model)
    scaled, plain = [], []
    for xb, yb in zip(x, y):
        model.zero_grad()
        probe.start()
        summed = 0.5 * (model(xb).squeeze(-1) - yb).square().sum()
        (summed * weight * loss_scale).backward(retain_graph=True)
        scaled.append(per_token_sq_norm(probe.squared_norm(), weight * loss_scale, 16))
        model.zero_grad()
        (summed / 16).backward()  # the per-token-mean gradient, by plain autograd
        plain.append(sum(float(p.grad.double().square().sum()) for p in model.parameters()))
    probe.remove()
    assert scaled == pytest.approx(plain, rel=1e-6)
    big = float(np.mean(plain)) * 0.4  # any big-batch norm below the small ones
    expected = estimate(float(np.mean(plain)), 16, big, 64)
    got = estimate(float(np.mean(scaled)), 16, big, 64)
    assert got[1] / got[0] == pytest.approx(expected[1] / expected[0], rel=1e-6)
    still_scaled = float(np.mean(scaled)) * loss_scale**2
    assert estimate(still_scaled, 16, big, 64)[0] < 0  # the defect this guards against


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


def test_best_config_needs_every_seed_to_reach_the_target():
    assert best_config([[10.0, 14.0], [9.0, None], [11.5, 11.5]]) == (2, 11.5)
    assert best_config([[None], []]) is None


def test_bootstrap_redoes_the_best_configuration_choice_in_every_resample():
    """At one batch size a steady configuration (every seed 1,500 steps) ties on the mean with a
    noisy one (1,000 or 2,000). Alone, the steady one gives a point. With the noisy one beside it
    and the choice redone in every resample, the better of the two draws wins each time: the
    interval opens, mostly on the side of fewer steps at the smallest batch size (a smaller
    E_min, so a smaller B_crit)."""
    steps = {b: [[1000.0 + 4.0e6 / b] * 3] for b in BATCHES}
    b = BATCHES[0]
    steady = [1000.0 + 4.0e6 / b] * 3
    noisy = [steady[0] - 500, steady[0] + 500, steady[0]]
    point = fit_critical_batch(BATCHES, [s[0][0] for s in steps.values()])[2]
    assert bootstrap_b_crit({**steps, b: [steady]}, n=300) == pytest.approx((point, point))
    lo, hi = bootstrap_b_crit({**steps, b: [steady, noisy]}, n=300)
    assert lo < point * 0.99 and point - lo > 1.5 * (hi - point)


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
    # Seeds that agree: every resample gives the same B_crit.
    steps = {b: [[1000.0 + 4.0e6 / b] * 3] for b in BATCHES}
    assert bootstrap_b_crit(steps, n=200) == pytest.approx((4000.0, 4000.0))
    # One seed per configuration: nothing to resample, the interval is the point.
    assert bootstrap_b_crit({b: [[1000.0 + 4.0e6 / b]] for b in BATCHES}, n=50) == pytest.approx((4000.0, 4000.0))
    with pytest.raises(ValueError):
        bootstrap_b_crit({256: [[2000.0]]})
    with pytest.raises(ValueError):
        bootstrap_b_crit({256: [[2000.0]], 512: [[float("nan")]]})


# ---------------------------------------------------------------- curves and power laws


def test_steps_to_reach_interpolates():
    tokens = [0, 1000, 2000, 3000]
    losses = [5.0, 4.0, 3.0, 2.5]
    steps, reached = steps_to_reach(tokens, losses, tokens_per_update=100, target_loss=3.5)
    assert reached == pytest.approx(1500.0) and steps == pytest.approx(15.0)
    assert steps_to_reach(tokens, losses, 100, 3.0) == (20.0, 2000.0)  # exactly on a point
    assert steps_to_reach(tokens, losses, 100, 6.0) == (0.0, 0.0)
    assert steps_to_reach(tokens, losses, 100, 2.0) is None


def test_steps_to_reach_takes_the_first_crossing():
    tokens = [0, 100, 200, 300, 400]
    losses = [4.0, 2.0, 4.0, 2.0, 2.0]  # a spike below target at 100
    assert steps_to_reach(tokens, losses, 10, 2.5)[1] == pytest.approx(75.0)


def test_smoothing_window_is_in_tokens_and_centred():
    # Points every 100 tokens; a window of 200 tokens averages a point with both neighbours.
    tokens, values = [0, 100, 200, 300, 400], [4.0, 2.0, 4.0, 2.0, 2.0]
    assert smooth(tokens, values, 200).tolist() == pytest.approx([3.0, 10 / 3, 8 / 3, 8 / 3, 2.0])
    # The same stretch of tokens logged 4x as often is averaged over 4x as many points.
    fine = np.arange(0, 401, 25)
    assert smooth(fine, np.where(fine % 200 == 0, 1.0, 0.0), 200)[8] == pytest.approx(1 / 9)
    # A line is unchanged by a centred window away from the ends: no lag.
    line = np.arange(0, 1000, 10.0)
    assert smooth(line, 5 - line / 100, 100)[10:-10] == pytest.approx(5 - line[10:-10] / 100)


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
