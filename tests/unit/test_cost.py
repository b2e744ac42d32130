"""The arithmetic of a sweep's cost and ETA (orchestrator/formulas/cost.py): throughput against hand
numbers, list scheduling against a brute force, the cost range of a sweep not known in advance."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.formulas import cost
from tests.conftest import TINY


def brute_force_makespan(durations, slots):
    """Whole-second clock: at every tick the finished trials free their slots, then the next
    trials in order take the free slots. When the last one ends."""
    running, queue, t, end = [], list(durations), 0, 0
    while queue or running:
        running = [finish for finish in running if finish > t]
        while queue and len(running) < slots:
            finish = t + queue.pop(0)
            running.append(finish)
            end = max(end, finish)
        t += 1
    return end


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 12), max_size=9), st.integers(1, 4))
def test_makespan_is_the_list_schedule(durations, slots):
    assert cost.makespan(durations, slots) == brute_force_makespan(durations, slots)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(1.0, 100.0), min_size=1, max_size=12), st.integers(1, 5))
def test_makespan_bounds(durations, slots):
    """Never below the work per slot or the longest trial; never above ceil(n / slots) x the longest,
    which is what the cost range of an Optuna sweep relies on."""
    m = cost.makespan(durations, slots)
    assert m >= max(max(durations), sum(durations) / slots) - 1e-9
    rounds = math.ceil(len(durations) / slots)
    assert rounds * min(durations) - 1e-9 <= m <= rounds * max(durations) + 1e-9


def test_list_schedule_by_hand():
    # slots: [0 -> 10 -> 13], [0 -> 4 -> 9 -> 15]: the third trial takes the slot free at 4
    assert cost.list_schedule([10, 4, 5, 3, 6], 2) == [0, 0, 4, 9, 10]
    assert cost.makespan([10, 4, 5, 3, 6], 2) == 16
    assert cost.makespan([10, 4, 5], 8) == 10
    assert cost.makespan([], 2) == 0
    with pytest.raises(ValueError):
        cost.list_schedule([1], 0)


def test_trial_cost_by_hand():
    rate = cost.Throughput("GPU", peak_flops=1e12, mfu=0.5, startup_s=60)
    c = cost.trial_cost(tokens=3_600_000, flops_per_token=1e9, devices=2, held=2, rate=rate)
    assert c.tokens_per_s == pytest.approx(1000.0)  # 2 x 1e12 x 0.5 / 1e9
    assert c.wall_s == pytest.approx(60 + 3600)
    assert c.device_hours == pytest.approx(3660 * 2 / 3600)
    assert c.flops == pytest.approx(3.6e15)
    unknown = cost.trial_cost(3_600_000, None, 2, 2, rate)
    assert (unknown.flops, unknown.wall_s, unknown.device_hours) == (None, None, None)


def test_gpu_defaults_gpt_350m():
    """8 H100s at 40% MFU on 2.4178 GFLOP per token: 1.309M tokens/s; 3.36B tokens in 42m 43s."""
    rate = cost.throughput(True)
    assert (rate.kind, rate.peak_flops, rate.mfu, rate.startup_s) == ("GPU", 989e12, 0.40, 60.0)
    c = cost.trial_cost(3_355_443_200, 2_417_799_168.0, 8, 8, rate)
    assert c.tokens_per_s == pytest.approx(8 * 989e12 * 0.4 / 2_417_799_168.0)
    assert c.tokens_per_s == pytest.approx(1_308_959, rel=1e-6)
    assert c.wall_s == pytest.approx(60 + 3_355_443_200 / 1_308_958.0, rel=1e-6)
    assert c.device_hours == pytest.approx(c.wall_s * 8 / 3600)
    assert cost.throughput(True, peak_flops=312e12, mfu=0.5, startup_s=0) == cost.Throughput("GPU", 312e12, 0.5, 0)


def test_cpu_default_reproduces_the_measured_tiny_run():
    """The CPU figure is the measured tiny.yaml run: its own FLOPs per token give back its tokens/s."""
    from orchestrator.core import config
    from workloads import workload

    assert workload.costs(config.load(TINY, [])).flops_per_token == cost.CPU_MEASURED_FLOPS_PER_TOKEN
    rate = cost.throughput(False)
    assert (rate.kind, rate.mfu, rate.startup_s) == ("CPU", 1.0, 15.0)
    assert rate.tokens_per_s(1, cost.CPU_MEASURED_FLOPS_PER_TOKEN) == pytest.approx(21_391)
    assert rate.peak_flops == pytest.approx(63.18e9, rel=1e-3)
    assert cost.throughput(False, mfu=0.5).tokens_per_s(2, cost.CPU_MEASURED_FLOPS_PER_TOKEN) == pytest.approx(21_391)


def test_sweep_cost_totals_and_unknowns():
    gpu = cost.Throughput("GPU", 1e12, 1.0, 0)
    trials = [cost.trial_cost(1_000_000, 1e6, 1, 1, gpu), cost.trial_cost(3_000_000, 1e6, 1, 1, gpu)]  # 1 s, 3 s
    total = cost.sweep_cost(trials, slots=1)
    assert (total.trials, total.flops, total.wall_s, total.eta_s, total.unknown) == (2, 4e12, 4.0, 4.0, 0)
    assert total.device_hours == {"GPU": pytest.approx(4 / 3600)}
    assert cost.sweep_cost(trials, slots=2).eta_s == 3.0
    with_unknown = cost.sweep_cost(trials + [cost.trial_cost(5, None, 1, 1, gpu)], slots=2)
    assert (with_unknown.flops, with_unknown.eta_s, with_unknown.unknown) == (None, None, 1)


def test_cost_range():
    gpu = cost.Throughput("GPU", 1e12, 1.0, startup_s=10)
    corners = [
        cost.trial_cost(90_000_000, 1e6, 1, 1, gpu),  # 100 s
        cost.trial_cost(290_000_000, 1e6, 1, 1, gpu),  # 300 s
        cost.trial_cost(10, None, 1, 1, gpu),  # unknown: left out
    ]
    r = cost.cost_range(corners, num_samples=5, slots=2)
    assert (r.trial_wall_s.low, r.trial_wall_s.high) == (100, 300)
    assert (r.trial_flops.low, r.trial_flops.high) == (9e13, 2.9e14)
    assert (r.flops.low, r.flops.high) == (5 * 9e13, 5 * 2.9e14)
    assert r.device_hours.low == pytest.approx(5 * 100 / 3600)
    assert r.device_hours.high == pytest.approx(5 * 300 / 3600)
    assert (r.eta_s.low, r.eta_s.high) == (300, 900)  # 3 rounds of 2 slots
    assert r.kind == "GPU" and r.num_samples == 5
    assert cost.cost_range([cost.trial_cost(10, None, 1, 1, gpu)], 5, 2) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10), st.integers(1, 4))
def test_any_mix_of_trials_ends_within_the_eta_range(shares, slots):
    low, high = 100.0, 300.0
    gpu = cost.Throughput("GPU", 1.0, 1.0, 0)
    r = cost.cost_range(
        [cost.trial_cost(int(low), 1.0, 1, 1, gpu), cost.trial_cost(int(high), 1.0, 1, 1, gpu)], len(shares), slots
    )
    m = cost.makespan([low + s * (high - low) for s in shares], slots)
    assert r.eta_s.low - 1e-9 <= m <= r.eta_s.high + 1e-9


def test_live_eta_arithmetic():
    assert cost.rate(8192, 10.0, 16384, 20.0) == pytest.approx(819.2)
    assert cost.rate(8192, 10.0, 8192, 20.0) is None  # no tokens since the first result
    assert cost.rate(8192, 10.0, 16384, 10.0) is None
    assert cost.eta_s(278_528, 819.2) == pytest.approx(340.0)
    assert cost.eta_s(0, None) == 0.0
    assert cost.eta_s(100, None) is None


@pytest.mark.parametrize(
    "seconds,text",
    [(None, "-"), (math.inf, "-"), (0, "0 s"), (59.4, "59 s"), (340, "5m 40s"), (3600, "1h 00m"), (93_784, "1d 02h")],
)
def test_format_duration(seconds, text):
    assert cost.format_duration(seconds) == text
