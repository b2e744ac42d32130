"""`batch.micro_batch_size: auto`: the probe's search against a brute force, the memory model's
answer, and resolution once per shape through the cache."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from orchestrator.core import config, derived
from orchestrator.core.errors import ConfigError
from orchestrator.driver import micro_batch
from orchestrator.formulas import memory
from tests.conftest import TINY
from workloads.train.micro_batch_probe import search


def brute_force(peak, capacity, upper):
    usable = capacity * (1 - memory.HEADROOM)
    fitting = [b for b in range(1, upper + 1) if peak(b) is not None and peak(b) <= usable]
    return max(fitting, default=0)


@settings(max_examples=300, deadline=None)
@given(
    fixed=st.floats(1e6, 1e9),
    per_sequence=st.floats(1e4, 1e8),
    curvature=st.floats(-0.3, 0.3),
    capacity=st.floats(1e6, 2e10),
    oom_at=st.floats(1.0, 3.0),
    upper=st.integers(1, 600),
)
def test_search_finds_the_largest_b_that_fits(fixed, per_sequence, curvature, capacity, oom_at, upper):
    """Any increasing peak(b), not only a straight line, and an allocator that fails outright
    (None) somewhere above the limit: the search agrees with trying every b."""
    calls = []

    def peak(b):
        value = fixed + per_sequence * b * (1 + curvature * min(b, 100) / 100)
        return None if value > capacity * oom_at else value

    def run(b):
        calls.append(b)
        return peak(b)

    assert search(run, capacity, upper) == brute_force(peak, capacity, upper)
    assert len(calls) == len(set(calls)), "each b is run once"


def test_search_needs_few_runs_when_memory_is_linear():
    calls = []

    def peak(b):
        calls.append(b)
        return 3e9 + 1.6e9 * b

    b = search(peak, 141e9, 256)
    assert b == brute_force(lambda b: 3e9 + 1.6e9 * b, 141e9, 256) == 77
    assert len(calls) == 4, calls  # b = 1, 2, the line's answer and the one above it


def test_memory_model_answer_is_the_largest_b_the_model_predicts_to_fit():
    cfg = config.load(TINY, ["batch.micro_batch_size=auto", "deepspeed.zero_stage=2"])
    capacity = 300 * 2**20
    answer = micro_batch.from_model(cfg, capacity, upper=10_000)
    predicted = [micro_batch.predict(cfg, b)[0].total for b in range(1, 400)]
    fitting = [b for b, total in enumerate(predicted, start=1) if total <= capacity * (1 - memory.HEADROOM)]
    assert answer["micro_batch_size"] == max(fitting) > 1


def _auto(tmp_path, *overrides):
    return config.load(
        TINY,
        [
            "batch.micro_batch_size=auto",
            f"train.storage_path={tmp_path / 'runs'}",
            "train.total_tokens=65536",
            *overrides,
        ],
    )


def test_each_shape_is_probed_once_and_every_config_of_it_gets_the_answer(tmp_path, monkeypatch):
    found = []

    def fake_find(cfg, upper):
        found.append((cfg.model.d_model, upper))
        return {
            "micro_batch_size": 12 if cfg.model.d_model == 128 else 5,
            "capacity_bytes": 1e9,
            "method": "fake",
            "device": "cpu",
        }

    monkeypatch.setattr(micro_batch, "_find", fake_find)
    configs = [
        _auto(tmp_path, "batch.tokens_per_update=4096"),  # 32 sequences
        _auto(tmp_path, "batch.tokens_per_update=8192"),  # 64
        _auto(tmp_path, "batch.tokens_per_update=2048", "optim.lr=0.01"),  # 16
        _auto(tmp_path, "model.d_model=64", "batch.tokens_per_update=4096"),
    ]
    micro_batch.resolve_all(configs)
    assert sorted(found) == [(64, 32), (128, 64)], "one search per shape, up to the largest share any needs"
    plans = [derived.batch_plan(c) for c in configs]
    # the largest divisor of each run's share not above the answer
    assert [(p.micro_batch_size, p.grad_accum_steps) for p in plans] == [(8, 4), (8, 8), (8, 2), (4, 8)]
    cached = list((tmp_path / "runs" / "micro_batch").glob("*.json"))
    assert len(cached) == 2 and {json.loads(p.read_text())["micro_batch_size"] for p in cached} == {12, 5}

    # a later run of a known shape reads the cache; one that needs more than was searched searches again
    again = _auto(tmp_path, "batch.tokens_per_update=4096")
    micro_batch.resolve(again)
    assert len(found) == 2 and again.batch.micro_batch_size == 12
    monkeypatch.setattr(micro_batch, "_find", lambda cfg, upper: {**fake_find(cfg, upper), "micro_batch_size": upper})
    capped = _auto(tmp_path, "model.d_model=64", "batch.tokens_per_update=4096")
    micro_batch.resolve(capped)  # 5 < 32 searched: a real bound, no new search
    assert len(found) == 2 and capped.batch.micro_batch_size == 5


def test_nothing_fits_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setattr(
        micro_batch,
        "_find",
        lambda cfg, upper: {"micro_batch_size": 0, "capacity_bytes": 2**20, "method": "x", "device": "cpu"},
    )
    with pytest.raises(ConfigError, match="batch.micro_batch_size.*not even one sequence"):
        micro_batch.resolve(_auto(tmp_path))


def test_given_accumulation_must_fit_the_answer(tmp_path, monkeypatch):
    monkeypatch.setattr(
        micro_batch,
        "_find",
        lambda cfg, upper: {"micro_batch_size": 6, "capacity_bytes": 1e9, "method": "x", "device": "cpu"},
    )
    cfg = _auto(tmp_path, "batch.grad_accum_steps=2")  # 32 sequences in 2 steps: b = 16 > 6
    with pytest.raises(ConfigError, match="batch.tokens_per_update"):
        micro_batch.resolve(cfg)


def test_plan_prints_the_memory_model(capsys):
    assert main(["plan", str(TINY), "--device-memory", "200MiB"]) == 0
    out = capsys.readouterr().out
    cfg = config.load(TINY)
    estimate, costs = micro_batch.predict(cfg, 8)
    assert f"{costs.params:,}" in out
    assert memory.format_bytes(estimate.total) in out
    largest = memory.largest_micro_batch(
        estimate.states + estimate.bucket, costs.activation_bytes_per_sequence, 200 * 2**20
    )
    assert re.search(rf"largest b that fits +{largest:,} in 200.0 MiB \(--device-memory\)", out), out


def test_plan_with_auto_uses_the_model_for_the_given_memory(capsys):
    assert main(["plan", str(TINY), "batch.micro_batch_size=auto", "--device-memory", "40MiB", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    cfg = config.load(TINY, ["batch.micro_batch_size=auto"])
    b_max = micro_batch.from_model(cfg, 40 * 2**20, 32)["micro_batch_size"]
    assert info["micro_batch_auto"] and info["micro_batch_size"] == max(b for b in range(1, b_max + 1) if 32 % b == 0)
    assert 1 < info["micro_batch_size"] < 32


@pytest.mark.parametrize("bad", ["80XB", "0GiB", "lots"])
def test_bad_device_memory_is_exit_2(bad, capsys):
    assert main(["plan", str(TINY), "--device-memory", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device-memory" in err[0] and "80GiB" in err[0]


def test_auto_says_the_split_the_run_trains_with_not_only_what_fits(tmp_path, capsys):
    """With the gradient noise scale measured an update needs two micro-batches: 4 sequences per
    worker fit, and the run trains 2 x 2. `train` used to print "auto: 4 fits" and train with b = 2."""
    cfg = config.load(
        TINY,
        ["batch.micro_batch_size=auto", "gns.enabled=true", f"train.storage_path={tmp_path}", "cluster.use_gpu=false"],
    )
    share = micro_batch.per_worker_share(cfg)
    micro_batch.resolve(cfg)
    plan = derived.batch_plan(cfg)
    line = capsys.readouterr().out.strip()
    assert f"up to {share} fit" in line
    assert f"this run trains with b = {plan.micro_batch_size} x A = {plan.grad_accum_steps}" in line
    assert plan.micro_batch_size * plan.grad_accum_steps == share and plan.grad_accum_steps >= 2
