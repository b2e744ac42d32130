"""The branched critical batch size on SGD over a noisy quadratic, whose truth is exact
(tests/branch_truth.py: the expected loss from the second-moment recursion), with linear and
square-root lr scaling: the interval covers the truth, also where noise is small beside the gap
between the factors; absolute tolerances and Merrill et al.'s every-smaller rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.analysis import branch_cbs as bc
from tests.branch_truth import QuadraticBranches

FACTORS = (1, 2, 4, 8, 16)
DRAWS = 30


def covers(interval, value) -> bool:
    lo, hi = interval
    return (lo is None or lo <= value) and (hi is None or value <= hi)


@pytest.mark.parametrize(
    "alpha, tokens, se",
    [
        (1.0, 2048, 0.0003),  # the crossing just past factor 4, eval noise a thirtieth of the tolerance
        (1.0, 1024, 0.001),  # just under factor 8
        (0.5, 512, 0.001),  # just past factor 2: noise sends some draws below
        (0.5, 1024, 0.001),
    ],
)
def test_the_interval_covers_the_exact_truth_at_80_percent(alpha, tokens, se):
    world = QuadraticBranches(alpha=alpha, se=se)
    truth = world.truth(tokens)
    base = world.base_batch
    assert 2 * base < truth < 16 * base and all(abs(math.log(truth / (f * base))) > 0.01 for f in FACTORS)
    results = [bc.critical_batch_at(world.ends(tokens, FACTORS, draw)) for draw in range(DRAWS)]
    covered = sum(covers(r["cbs_interval"], truth) for r in results)
    errors = [r["cbs"] / truth - 1 for r in results if r["status"] == "resolved"]
    print(f"alpha {alpha}, t {tokens}: truth {truth:.1f}, covered {covered}/{DRAWS}, error {np.median(errors):+.3f}")
    assert covered >= 0.8 * DRAWS
    assert all("the gap between factors" in r["interval_from"] for r in results)


def test_an_absolute_tolerance_is_the_relative_one_times_the_reference_loss():
    world = QuadraticBranches(alpha=1.0)
    ends = world.ends(1024, FACTORS, draw=0)
    relative = bc.critical_batch_at(ends, bc.Tolerance(0.01))
    reference = relative["reference_loss"]
    absolute = bc.critical_batch_at(ends, bc.Tolerance(0.01 * reference, "absolute"))
    assert absolute["cbs"] == pytest.approx(relative["cbs"], rel=1e-12)
    assert absolute["excess"] == pytest.approx([x * reference for x in relative["excess"]], rel=1e-9)
    assert world.truth(1024, 0.01 * reference, absolute=True) == pytest.approx(world.truth(1024), rel=1e-6)
    assert absolute["tolerance_kind"] == "absolute" and "in loss" in bc.Tolerance(0.02, "absolute").words()
    with pytest.raises(ValueError, match="relative tolerance is in"):
        bc.Tolerance(1.5)


def test_every_smaller_is_the_reference_rule_on_rising_losses_and_stricter_after_a_dip():
    """Merrill et al.'s rule compares each batch with every smaller one: where losses rise with B it
    is the reference rule; where factor 2 came out under factor 1 (noise), factor 4 must be within
    the tolerance of factor 2's lower loss, so the crossing comes no later."""
    rising = [bc.BranchEnd(100, 8 * f, x, 0.0) for f, x in zip(FACTORS, (2.0, 2.004, 2.012, 2.03, 2.08))]
    every = bc.Tolerance(0.01, compare="every_smaller")
    assert bc.critical_batch_at(rising, every)["cbs"] == pytest.approx(bc.critical_batch_at(rising)["cbs"])
    dip = [bc.BranchEnd(100, 8 * f, x, 0.0) for f, x in zip(FACTORS, (2.0, 1.99, 2.015, 2.03, 2.08))]
    reference, strict = bc.critical_batch_at(dip), bc.critical_batch_at(dip, every)
    assert strict["excess"][2] == pytest.approx((2.015 - 1.99) / 1.99)
    assert strict["cbs"] < reference["cbs"] and 16 <= strict["cbs"] < 32 <= reference["cbs"]
