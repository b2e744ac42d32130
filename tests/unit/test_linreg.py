"""Linear regression workload: closed-form noise scale checked by Monte Carlo; split-invariant data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrator.formulas import noise
from workloads.builtin.linreg import LinRegData, LinRegModel, closed_form

DIM, SIGMA = 8, 0.5


def per_example_grads(model: LinRegModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example gradients of the summed loss by plain autograd, one example at a time."""
    grads = []
    for i in range(len(x)):
        model.zero_grad()
        summed, _ = model.token_losses(model(x[i : i + 1]), y[i : i + 1])
        summed.backward()
        grads.append(model.linear.weight.grad.reshape(-1).clone())
    return torch.stack(grads)


def test_closed_form_matches_monte_carlo():
    data = LinRegData(DIM, SIGMA, w_star_norm=1.0, seed=0)
    w = torch.linspace(-0.5, 0.5, DIM)
    x, y = data.micro_batch(0, 400_000, 0, 400_000)
    x, y = x.double(), y.double()
    # Per-example gradient of (w.x - y)^2 / 2 is x (w.x - y); autograd agrees on a few examples.
    grads = x * (x @ w.double() - y)[:, None]
    model = LinRegModel(DIM)
    with torch.no_grad():
        model.linear.weight.copy_(w[None])
    torch.testing.assert_close(
        per_example_grads(model, x[:5].float(), y[:5].float()), grads[:5].float(), rtol=1e-5, atol=1e-5
    )

    g_squared, trace_sigma, b_simple = closed_form(w, data.w_star, SIGMA)
    mean = grads.mean(0)
    assert mean.square().sum().item() == pytest.approx(g_squared, rel=0.03)
    mc_trace = grads.var(0).sum().item()
    assert mc_trace == pytest.approx(trace_sigma, rel=0.03)
    assert b_simple == pytest.approx(trace_sigma / g_squared)
    # The independent formula for the covariance itself: (|delta|^2 + sigma^2) I + delta delta^T.
    delta = (w - data.w_star).double()
    cov = torch.cov(grads.T)
    expected = (delta.square().sum() + SIGMA**2) * torch.eye(DIM, dtype=torch.float64) + torch.outer(delta, delta)
    torch.testing.assert_close(cov, expected, atol=0.05 * expected.diagonal().mean().item(), rtol=0)


def test_closed_form_at_the_optimum():
    w_star = torch.ones(DIM)
    g_squared, trace_sigma, b_simple = closed_form(w_star, w_star, SIGMA)
    assert g_squared == 0 and trace_sigma == pytest.approx(DIM * SIGMA**2) and b_simple == float("inf")


def test_noise_estimator_recovers_closed_form_b_simple():
    """End to end: per-token-mean micro-batch gradients, through noise.estimate, averaged."""
    data = LinRegData(DIM, SIGMA, w_star_norm=1.0, seed=1)
    w = torch.zeros(DIM, dtype=torch.float64)
    b_small, n_small = 16, 32  # 32 micro-batches of 16 examples = an update of 512
    estimates = []
    for update in range(300):
        x, y = data.update_batch(update, b_small * n_small)
        grads = (x.double() * (x.double() @ w - y.double())[:, None]).view(n_small, b_small, DIM).mean(1)
        small = grads.square().sum(1).mean().item()
        big = grads.mean(0).square().sum().item()
        estimates.append(noise.estimate(small, b_small, big, b_small * n_small))
    g_squared, trace_sigma = np.mean(estimates, axis=0)
    true_g2, true_trace, true_b = closed_form(w, data.w_star, SIGMA)
    assert g_squared == pytest.approx(true_g2, rel=0.05)
    assert trace_sigma == pytest.approx(true_trace, rel=0.05)
    assert trace_sigma / g_squared == pytest.approx(true_b, rel=0.08)


def test_w_star_is_deterministic_with_the_given_norm():
    a, b = LinRegData(DIM, SIGMA, 2.5, seed=7), LinRegData(DIM, SIGMA, 2.5, seed=7)
    assert torch.equal(a.w_star, b.w_star)
    assert a.w_star.norm().item() == pytest.approx(2.5, rel=1e-6)
    assert not torch.equal(a.w_star, LinRegData(DIM, SIGMA, 2.5, seed=8).w_star)


@pytest.mark.parametrize("splits", [[8], [4, 4], [2, 2, 2, 2], [1] * 8, [3, 5], [1, 6, 1]])
def test_same_examples_however_the_update_is_split(splits):
    n = sum(splits)
    whole = LinRegData(DIM, SIGMA, 1.0, seed=3).micro_batch(5, n, 0, n)
    data = LinRegData(DIM, SIGMA, 1.0, seed=3)  # a fresh object: no shared cache
    parts, start = [], 0
    for count in reversed(splits):  # in any order, e.g. as different workers draw them
        parts.insert(0, data.micro_batch(5, n, n - start - count, count))
        start += count
    assert torch.equal(torch.cat([p[0] for p in parts]), whole[0])
    assert torch.equal(torch.cat([p[1] for p in parts]), whole[1])


def test_every_batch_size_sees_the_same_examples_at_equal_tokens():
    data = LinRegData(DIM, SIGMA, 1.0, seed=3)
    stream = data.examples(0, 3 * LinRegData.BLOCK)
    for n in (1, 7, 64, 4096, 5000):
        updates = [LinRegData(DIM, SIGMA, 1.0, seed=3).update_batch(u, n) for u in range(len(stream[1]) // n)]
        x, y = torch.cat([u[0] for u in updates]), torch.cat([u[1] for u in updates])
        assert torch.equal(x, stream[0][: len(x)]) and torch.equal(y, stream[1][: len(y)]), n


def test_updates_differ_and_eval_is_held_out():
    data = LinRegData(DIM, SIGMA, 1.0, seed=0)
    x0, _ = data.micro_batch(0, 64, 0, 64)
    x1, _ = data.micro_batch(1, 64, 0, 64)
    assert not torch.allclose(x0, x1)
    ex, ey = data.eval_batch(64)
    assert torch.equal(ex, data.eval_batch(64)[0]) and torch.equal(ey, data.eval_batch(64)[1])
    assert not torch.allclose(ex, x0)
    # Labels follow the model: y - w*.x has the noise's spread.
    assert (ey - ex @ data.w_star).std().item() == pytest.approx(SIGMA, rel=0.3)
    with pytest.raises(ValueError):
        data.micro_batch(0, 64, 60, 8)


def test_model_starts_at_zero_and_sums_half_squared_errors():
    model = LinRegModel(DIM)
    assert torch.equal(model.w, torch.zeros(DIM))
    x, y = torch.randn(5, DIM), torch.tensor([1.0, -2.0, 0.0, 3.0, 0.5])
    pred = model(x)
    assert pred.shape == (5,) and torch.equal(pred, torch.zeros(5))
    summed, count = model.token_losses(pred, y)
    assert summed.item() == pytest.approx(0.5 * (1 + 4 + 0 + 9 + 0.25))
    assert count.item() == 5
