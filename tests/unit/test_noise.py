"""Gradient noise scale estimators, their EMA, and the critical-batch fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.formulas.noise import (
    NoiseScaleEMA,
    adam_memory_filled,
    estimate,
    per_token_sq_norm,
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


@pytest.mark.parametrize("beta2, memory", [(0.8, 5), (0.95, 20), (0.999, 1000), (0.5, 2)])
def test_adams_memory_is_filled_after_one_over_one_minus_beta2_steps(beta2, memory):
    """At exactly 1 / (1 - beta2) steps, however the division rounds (1 / (1 - 0.8) is 5.000000000000001)."""
    assert not adam_memory_filled(memory - 1, beta2) and adam_memory_filled(memory, beta2)


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


def test_an_ema_of_linear_trends_is_their_value_at_its_centre():
    """|G|^2 falling and tr(Sigma) rising linearly in tokens: at every update the EMAs equal the
    trends at the centre of mass (so B_simple logged there has no lag), which trails the newest
    input by B d / (1 - d) tokens in the steady state, about ema_tokens; at the newest input the
    ratio is well off."""
    B, tau = 256, 3000.0

    def g2(t):
        return 2.0 - 2e-5 * t

    def trace(t):
        return 50.0 + 2e-3 * t

    ema = NoiseScaleEMA(ema_tokens=tau)
    for u in range(200):
        ema.update(g2(u * B), trace(u * B), tokens=B, at=u * B)
        c = ema.centre
        assert ema.g_squared == pytest.approx(g2(c), rel=1e-9) and ema.trace_sigma == pytest.approx(trace(c), rel=1e-9)
        assert ema.b_simple == pytest.approx(trace(c) / g2(c), rel=1e-9)
    d = math.exp(-B / tau)
    assert 199 * B - ema.centre == pytest.approx(B * d / (1 - d), rel=1e-6)
    newest = trace(199 * B) / g2(199 * B)
    assert ema.b_simple / newest - 1 < -0.05, "logged at the newest update it would lag by over 5 %"


def test_the_centre_survives_a_checkpoint_and_defaults_to_the_tokens_averaged():
    ema = NoiseScaleEMA(ema_tokens=1000)
    for _ in range(5):
        ema.update(1.0, 10.0, tokens=100)  # at = the tokens averaged so far: 0, 100, ... 400
    again = NoiseScaleEMA(ema_tokens=1)
    again.load_state_dict(ema.state_dict())
    assert again.centre == ema.centre
    w = [math.exp(-0.1 * (4 - k)) for k in range(5)]
    assert ema.centre == pytest.approx(sum(wk * 100 * k for k, wk in enumerate(w)) / sum(w))


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

    from workloads.train.gns_probe import GradNormProbe

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
        scaled.append(per_token_sq_norm(probe.squared_norms()[0], weight * loss_scale, 16))
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
