"""LR schedules in tokens: continuity at segment boundaries, peak at the end of warmup,
floor respected, monotone segments."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.formulas.schedules import DECAYS, lr_at

schedule = st.fixed_dictionaries(
    {
        "peak": st.floats(1e-6, 1.0),
        "total_tokens": st.integers(1_000, 10**9),
        "warmup_share": st.floats(0.0, 1.0),
        "decay": st.sampled_from(DECAYS),
        "min_lr_ratio": st.floats(0.0, 1.0),
        "wsd_decay_share": st.floats(0.01, 1.0),
    }
)


def make(p):
    kw = dict(p)
    kw["warmup_tokens"] = int(kw.pop("warmup_share") * kw["total_tokens"])
    return kw


def grid(total, n=400):
    return [total * i / n for i in range(n + 1)]


@settings(max_examples=300, deadline=None)
@given(schedule)
def test_peak_at_end_of_warmup_and_floor_after(p):
    kw = make(p)
    peak, floor = kw["peak"], kw["peak"] * kw["min_lr_ratio"]
    assert lr_at(kw["warmup_tokens"], **kw) == pytest.approx(peak, rel=1e-12)
    for t in grid(kw["total_tokens"]):
        lr = lr_at(t, **kw)
        assert 0 <= lr <= peak * (1 + 1e-12)
        if t >= kw["warmup_tokens"]:
            assert lr >= floor * (1 - 1e-12)
    if kw["decay"] != "constant" and kw["warmup_tokens"] < kw["total_tokens"]:
        assert lr_at(kw["total_tokens"], **kw) == pytest.approx(floor, rel=1e-9, abs=1e-15)


@settings(max_examples=300, deadline=None)
@given(schedule)
def test_monotone_segments(p):
    kw = make(p)
    values = [(t, lr_at(t, **kw)) for t in grid(kw["total_tokens"])]
    for (t0, a), (t1, b) in zip(values, values[1:]):
        if t1 <= kw["warmup_tokens"]:
            assert b >= a - 1e-15, "warmup must rise"
        elif t0 >= kw["warmup_tokens"]:
            assert b <= a + 1e-15, "decay must not rise"


@settings(max_examples=300, deadline=None)
@given(schedule, st.floats(0.0, 1.0))
def test_continuous_everywhere(p, where):
    """No jumps: a tiny step in tokens gives a tiny change in LR (incl. segment boundaries)."""
    kw = make(p)
    total, peak = kw["total_tokens"], kw["peak"]
    boundaries = [kw["warmup_tokens"], total * (1 - kw["wsd_decay_share"]), where * total]
    eps = total * 1e-9
    for b in boundaries:
        if 0 < b < total:
            decay_start = kw["warmup_tokens"]
            if kw["decay"] == "wsd":
                decay_start = max(decay_start, total * (1 - kw["wsd_decay_share"]))
            span = max(total - decay_start, 1)
            slope_bound = peak / max(kw["warmup_tokens"], 1) + math.pi * peak / span
            assert abs(lr_at(b + eps, **kw) - lr_at(b - eps, **kw)) <= 2 * eps * slope_bound + 1e-12


def test_shapes_against_closed_forms():
    kw = dict(peak=1.0, total_tokens=1000, warmup_tokens=100, min_lr_ratio=0.0)
    assert lr_at(50, decay="cosine", **kw) == pytest.approx(0.5)
    assert lr_at(550, decay="cosine", **kw) == pytest.approx(0.5)
    assert lr_at(550, decay="linear", **kw) == pytest.approx(0.5)
    assert lr_at(700, decay="wsd", wsd_decay_share=0.2, **kw) == pytest.approx(1.0)
    assert lr_at(900, decay="wsd", wsd_decay_share=0.2, **kw) == pytest.approx(0.5)
    assert lr_at(900, decay="constant", **kw) == 1.0


def test_unknown_decay():
    with pytest.raises(ValueError, match="valid: cosine"):
        lr_at(1, peak=1, total_tokens=10, decay="step")
