"""The worker's report window and cadence (workloads/train/metrics_window.py)."""

import math

from orchestrator.formulas.noise import NoiseScaleEMA
from workloads.builtin.gpt import mfu
from workloads.train.metrics_window import MetricsWindow, UpdateStats, due, noise_scale_metrics


def test_due_fires_once_per_multiple_passed():
    assert [due(t, t + 100, 250) for t in range(0, 1000, 100)] == [
        False,
        False,
        True,
        False,
        True,
        False,
        False,
        True,
        False,
        True,
    ]
    assert not due(0, 10_000, 0), "every <= 0 means never"


def stats(loss_sum, real, slots, shares):
    return UpdateStats(loss_sum, real, loss_sum / real, 1.0, 0.0, 1.0, slots, shares)


def test_window_metrics_over_two_updates():
    window = MetricsWindow(tokens_at_start=100)
    window.add(stats(30.0, 60, 64, {"a": 40, "b": 20}))
    window.add(stats(10.0, 40, 64, {"a": 10, "b": 30}))
    m = window.metrics(tokens=356, world=2, flops_per_token=6.0, peak_flops=None)
    assert window.mean_loss() == 40.0 / 100
    assert m["train/tokens"] == 356 and "train/optimizer_step" not in m  # logged per update by the loop
    assert m["data/packing_efficiency"] == 100 / (128 * 2)  # slots are per worker
    assert m["data/share/a"] == 0.5 and m["data/share/b"] == 0.5
    assert m["perf/tokens_per_s"] > 0
    assert math.isnan(m["perf/mfu"]), "no peak, no MFU"
    assert not any(k.startswith("gns/") for k in m), "the noise scale goes at its own step"


def test_noise_scale_metrics_sit_at_the_emas_centre_of_mass():
    """Two updates of 100 tokens starting at 0 and 100, each weighing (1 - e^-1) before bias
    correction, the older times e^-1: the centre is 100 / (1 + e^-1), not the 200 seen after."""
    ema = NoiseScaleEMA(ema_tokens=100)
    assert noise_scale_metrics(ema) == (0, {}) and noise_scale_metrics(None) == (0, {})
    ema.update(2.0, 10.0, tokens=100, at=0)
    ema.update(4.0, 40.0, tokens=100, at=100)
    step, m = noise_scale_metrics(ema)
    assert step == round(100 / (1 + math.exp(-1))) == 73
    assert m == {"gns/b_simple": ema.b_simple, "gns/g_squared": ema.g_squared, "gns/trace_sigma": ema.trace_sigma}


def test_window_leaves_evaluation_out_of_throughput_and_uses_the_one_mfu_formula():
    window = MetricsWindow(tokens_at_start=0)
    window.started -= 2.0  # two seconds ago...
    with window.evaluating():
        window.eval_s += 1.0  # ...one of them evaluating
    m = window.metrics(tokens=1000, world=1, flops_per_token=6.0, peak_flops=1e4)
    assert 900 < m["perf/tokens_per_s"] <= 1000
    assert m["perf/mfu"] == mfu(m["perf/tokens_per_s"], 6.0, 1e4)
    assert not any(k.startswith("data/share/") for k in m)
