"""The worker's report window and cadence (workloads/metrics_window.py)."""

import math
from types import SimpleNamespace

from workloads.metrics_window import MetricsWindow, due
from workloads.model import mfu


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
    return {"loss_sum": loss_sum, "real_tokens": real, "local_slots": slots, "source_tokens": shares}


def test_window_metrics_over_two_updates():
    window = MetricsWindow(tokens_at_start=100)
    window.add(stats(30.0, 60, 64, {"a": 40, "b": 20}))
    window.add(stats(10.0, 40, 64, {"a": 10, "b": 30}))
    gns = SimpleNamespace(b_simple=5.0, g_squared=2.0, trace_sigma=10.0)
    m = window.metrics(update=3, tokens=356, world=2, flops_per_token=6.0, peak_flops=None, gns=gns)
    assert window.mean_loss() == 40.0 / 100
    assert m["train/optimizer_step"] == 3 and m["train/tokens"] == 356
    assert m["data/packing_efficiency"] == 100 / (128 * 2)  # slots are per worker
    assert m["data/share/a"] == 0.5 and m["data/share/b"] == 0.5
    assert m["gns/b_simple"] == 5.0 and m["perf/tokens_per_s"] > 0
    assert math.isnan(m["perf/mfu"]), "no peak, no MFU"


def test_window_leaves_evaluation_out_of_throughput_and_uses_the_one_mfu_formula():
    window = MetricsWindow(tokens_at_start=0)
    window.started -= 2.0  # two seconds ago...
    with window.evaluating():
        window.eval_s += 1.0  # ...one of them evaluating
    m = window.metrics(update=1, tokens=1000, world=1, flops_per_token=6.0, peak_flops=1e4, gns=None)
    assert 900 < m["perf/tokens_per_s"] <= 1000
    assert m["perf/mfu"] == mfu(m["perf/tokens_per_s"], 6.0, 1e4)
    assert not any(k.startswith(("gns/", "data/share/")) for k in m)
