"""The schedule a branch study advises, judged exactly against the best fixed batch (issue 54's
acceptance) on worlds whose every schedule's loss is known (tests/schedule_worlds.py), and the
rule of orchestrator/analysis/branch_schedule.py on tables in memory."""

from __future__ import annotations

import math

import pytest

from orchestrator.analysis import branch_cbs, branch_schedule
from orchestrator.analysis.branch_cbs import BranchEnd
from tests.schedule_worlds import SGDWorld, judge, true_critical_batch

WORLDS = {
    "sgd, linear lr scaling": lambda draw, noise=0.0: SGDWorld(draw, alpha=1.0, branch_noise=noise),
    "sgd, sqrt lr scaling": lambda draw, noise=0.0: SGDWorld(draw, alpha=0.5, branch_noise=noise),
    "no schedule pays": lambda draw, noise=0.0: SGDWorld(draw, alpha=0.5, no_pay=True, branch_noise=noise),
}
DRAWS = range(5)
MEASURED_BRANCH_NOISE = 0.003
"""A branch's own training noise on branches.yaml's study, between two seeds (docs/branches.md):
about the eval's standard error, and in no standard error with one seed."""


@pytest.mark.parametrize("noise", [0.0, MEASURED_BRANCH_NOISE])
@pytest.mark.parametrize("name", WORLDS)
def test_the_advised_schedule_is_within_the_tolerance_of_the_best_fixed_batch_at_no_more_updates(name, noise):
    """In every draw the advice ends at most SCHEDULE_TOLERANCE (0.1 %) above the best fixed batch's
    exact loss in no more updates (the issue asks 4 of 5; these worlds give 5), also with a branch
    training noise that no standard error holds; where it keeps the base batch the reason names
    what the closest alternative would have cost."""
    for draw in DRAWS:
        judged = judge(WORLDS[name](draw, noise))
        assert judged.holds(branch_schedule.SCHEDULE_TOLERANCE), (draw, judged.chosen, judged.excess)
        if judged.chosen == judged.choice.best_fixed:
            assert "nothing with fewer updates" in judged.choice.why or "nothing measured" in judged.choice.why


def test_where_the_ramp_pays_it_is_chosen_and_where_it_does_not_it_is_not():
    """sqrt scaling on SGD: the larger batch's lower noise floor makes the ramp beat every fixed
    batch, and it is chosen; linear scaling and the no-pay world: no ramp, and nothing larger than
    the base."""
    sqrt = [judge(WORLDS["sgd, sqrt lr scaling"](d)) for d in DRAWS]
    assert all(
        j.chosen == "suggested ramp" and j.excess < -0.05 and j.chosen_updates < j.best_fixed_updates for j in sqrt
    )
    for name in ("sgd, linear lr scaling", "no schedule pays"):
        assert all(judge(WORLDS[name](d)).chosen_ramp == [(0, 16)] for d in DRAWS), name


def test_fixed_batches_trained_to_the_budget_find_what_the_branches_cannot_see():
    """Compared with a sweep of the factors trained from the start to the budget (branch.compare_with,
    each final loss with the eval's noise): the SGD worlds keep their advice; on the Adam world, whose
    every 16x branch ends above its factor-1 branch while 16x from the start ends 1.6 % to 2.9 %
    below the base, the trained 16x is measured, advised, and within the tolerance of the best fixed
    batch (one draw here; benchmarks/schedule_choice.py --trained runs five)."""
    from tests.schedule_worlds import AdamWorld

    for name, make in WORLDS.items():
        for draw in (0, 1):
            plain, compared = judge(make(draw)), judge(make(draw), trained=True)
            assert compared.chosen_ramp == plain.chosen_ramp, (name, draw)
            assert compared.holds(branch_schedule.SCHEDULE_TOLERANCE), (name, draw)
    compared = judge(AdamWorld(0), trained=True)
    assert compared.choice.chosen.startswith("fixed 256 (trained")
    assert compared.holds(branch_schedule.SCHEDULE_TOLERANCE), (compared.chosen, compared.excess)


@pytest.mark.parametrize("noise", [0.0, MEASURED_BRANCH_NOISE])
def test_the_branched_critical_batch_interval_covers_the_truth_in_at_least_80_percent(noise):
    """Every branch point of every draw of the three worlds: the 90 % interval of the branched
    critical batch holds the exact one (found by bisection on the worlds' exact losses), with or
    without a branch training noise outside the standard error."""
    held = total = 0
    for make in WORLDS.values():
        for draw in DRAWS:
            world = make(draw, noise)
            for point in branch_cbs.critical_batch_along(world.study().ends):
                truth = true_critical_batch(world, point["tokens"])
                low, high = point["cbs_interval"] or (None, None)
                held += (low is None or truth >= low) and (high is None or truth <= high)
                total += 1
    assert total == 45 and held / total >= 0.8


def _ends(at, gaps, se=0.0, base=1.0):
    return [BranchEnd(at, 100 * 2**i, base + g, se) for i, g in enumerate(gaps)]


def _flat_after(tokens: float) -> float:
    """A base curve: 2 at the start, falling linearly to 1 at 1,000 tokens, flat after."""
    return max(1.0, 2.0 - tokens / 1000)


def test_a_stretch_costs_its_gap_times_its_length_over_the_branch_and_gains_count_nothing():
    """One branch point at 1,000 tokens, branches of 500: factor 2 ends 0.01 above factor 1, factor
    4 0.02 below. A ramp to factor 2 at 1,000 until 3,000 costs 0.01 x 2000 / 500 = 0.04; one to
    factor 4 costs nothing (a gain is not counted); a stretch shorter than a branch costs one
    branch's gap."""
    measured = branch_schedule.gaps(_ends(1000, [0.0, 0.01, -0.02]), {1000: 500})
    gap = branch_schedule.predicted_gap
    assert gap(measured, [(0, 100), (1000, 200)], 100, 3000, _flat_after) == pytest.approx(0.04)
    assert gap(measured, [(0, 100), (1000, 400)], 100, 3000, _flat_after) == 0.0
    assert gap(measured, [(0, 100), (2900, 200)], 100, 3000, _flat_after) == pytest.approx(0.01)


def test_a_fixed_batch_before_the_first_branch_point_is_priced_at_its_worst():
    """Fixed factor 2 from 0: before the first point (1,000) it falls 1,000 x (1 - 1/2) = 500 base
    tokens behind, which at the end of a curve still falling (budget 800 here, slope 1/1000) costs
    0.5; on a curve already flat at the budget, nothing."""
    measured = branch_schedule.gaps(_ends(1000, [0.0, 0.0, 0.0]), {1000: 500})
    falling = lambda t: 3.0 - t / 1000  # noqa: E731
    assert branch_schedule.predicted_gap(measured, [(0, 200)], 100, 1000, falling) == pytest.approx(0.5)
    assert branch_schedule.predicted_gap(measured, [(0, 200)], 100, 3000, _flat_after) == pytest.approx(0.0)


def test_the_choice_is_the_fewest_updates_within_the_tolerance_at_the_upper_end():
    """Three arms: the base (0), factor 2 at +0.05 % with an upper end of +0.08 % (within 0.1 %), a
    ramp at +0.02 % with an upper end of +0.15 % (not): factor 2 is chosen; with its upper end at
    +0.12 %, the base, and the reason names the closest."""
    arm = branch_schedule.Arm
    base = arm("fixed 100", ((0, 100),), 40, 0.0, 0.0)
    double = arm("fixed 200", ((0, 200),), 20, 0.0005, 0.0008)
    ramp = arm("suggested ramp", ((0, 100), (2000, 200)), 30, 0.0002, 0.0015)
    assert branch_schedule.choose([base, double, ramp]) == (base, double)
    worse = arm("fixed 200", ((0, 200),), 20, 0.0005, 0.0012)
    best, chosen = branch_schedule.choose([base, worse, ramp])
    assert chosen is base
    words = branch_schedule.why([base, worse, ramp], best, chosen, branch_schedule.SCHEDULE_TOLERANCE)
    assert "fixed 200, saves 50% of the updates at +0.05% (+0.12% at the upper end)" in words
    assert "a lower eval standard error" in words  # within on its value: the noise alone holds it back
    far = arm("fixed 200", ((0, 200),), 20, 0.0015, 0.002)
    assert "lower eval standard error" not in branch_schedule.why([base, far], base, base, 0.001)


def test_a_fixed_batch_trained_to_the_budget_is_measured_in_place_of_its_prediction():
    """Branches at 1,000 put factor 2 at +0.01 (x 4 stretches: +4 % of the final loss 1) and factor
    4 at +0.02. Fixed 200 trained from the start ended 1 % below the base (se 0.1 %): it replaces
    the prediction at 200, is the best fixed batch and is chosen, at its own lr; the base's arm
    stays first, the reference. Trained 0.5 % above (se 0.03 %): the base, with 200's measured cost
    in the why. A run at the base's own batch with a better lr (0.2 % below): chosen beside the
    base's arm, advised as a fixed batch at its lr."""
    measured = branch_schedule.gaps(_ends(1000, [0.0, 0.01, 0.02]), {1000: 500})
    trained = [branch_schedule.Trained(batch=200, lr=0.003, excess=-0.01, excess_se=0.001)]
    choice = branch_schedule.compare(measured, [(0, 100)], _flat_after, 100, 3000, 0.002, 0.5, trained=trained)
    assert [a.name for a in choice.arms] == ["fixed 100", "fixed 200 (trained, lr 0.003)", "fixed 400"]
    assert choice.arms[1].trained and choice.arms[1].excess == -0.01
    assert choice.arms[1].excess_high == pytest.approx(-0.01 + branch_schedule.Z_UPPER * 0.001)
    assert choice.arms[2].excess == pytest.approx(0.02 * 4) and not choice.arms[2].trained  # predicted as before
    assert (choice.best_fixed, choice.chosen, choice.advice) == ("fixed 200 (trained, lr 0.003)",) * 2 + ("fixed",)
    assert choice.chosen_ramp == ((0, 200),) and choice.chosen_lr == 0.003, "its own lr, not 0.002 x 2^0.5"

    worse = [branch_schedule.Trained(batch=200, lr=0.003, excess=0.005, excess_se=0.0003)]
    choice = branch_schedule.compare(measured, [(0, 100)], _flat_after, 100, 3000, 0.002, 0.5, trained=worse)
    assert (choice.chosen, choice.advice, choice.chosen_lr) == ("fixed 100", "base", 0.002)
    assert "fixed 200 (trained, lr 0.003), saves 50% of the updates at +0.50%" in choice.why
    at_base = [branch_schedule.Trained(batch=100, lr=0.001, excess=-0.002, excess_se=0.0)]
    choice = branch_schedule.compare(measured, [(0, 100)], _flat_after, 100, 3000, 0.002, 0.5, trained=at_base)
    assert [a.name for a in choice.arms][:2] == ["fixed 100", "fixed 100 (trained, lr 0.001)"]
    assert (choice.chosen, choice.advice, choice.chosen_lr) == ("fixed 100 (trained, lr 0.001)", "fixed", 0.001)


def test_a_diverged_branch_makes_its_factor_and_every_larger_one_unpredicted():
    measured = branch_schedule.gaps(_ends(1000, [0.0, 0.001, math.inf]), {1000: 500})
    assert branch_schedule.gap_at(measured, 1500, 2) == pytest.approx(0.001)
    assert math.isinf(branch_schedule.gap_at(measured, 1500, 4))
    assert math.isinf(branch_schedule.gap_at(measured, 1500, 8))  # past the largest factor branched


def _adam_by_hand(world, schedule, seeds, v_of=None):
    """Adam run update by update on `seeds` sampled paths (a plain loop, independent of the
    recursion); with `v_of`, the second moment is that deterministic sequence instead of the EMA
    of the sampled squares (what the mean-field world assumes)."""
    import numpy as np

    from tests import schedule_worlds as sw

    rng = np.random.default_rng(3)
    e = np.tile(world.e0, (seeds, 1))
    m, v, tokens, t = np.zeros_like(e), np.zeros_like(e), 0.0, 0
    for _, end, batch in sw.stretches(schedule, world.total_tokens):
        peak = world.lr * (batch / world.base_batch) ** world.alpha
        while tokens < end - 1e-9:
            lr = peak * min(1.0, (tokens + batch) / (sw.WARMUP_SHARE * world.total_tokens))
            g = world.h * e + rng.standard_normal(e.shape) * np.sqrt(world.s2 / batch)
            t += 1
            m = sw.BETA1 * m + (1 - sw.BETA1) * g
            v = v_of[t - 1] if v_of is not None else sw.BETA2 * v + (1 - sw.BETA2) * g * g
            e = e - lr * (m / (1 - sw.BETA1**t)) / (np.sqrt(v / (1 - sw.BETA2**t)) + sw.EPS)
            tokens += batch
    return (0.5 * world.h * e * e).sum(-1)


def test_the_adam_world_s_recursion_is_adam_given_its_second_moment():
    """Without noise the world's exact loss is a plain Adam loop's to float precision; with noise,
    sampled paths driven by the world's own deterministic second moment average to its loss within
    four standard errors (the recursion's noise terms), across a ramp's changes too."""
    import dataclasses

    import numpy as np

    from tests.schedule_worlds import AdamWorld

    world = AdamWorld(0, total_tokens=16 * 256)
    ramp = [(0, 16), (1024, 32), (2048, 64)]
    quiet = dataclasses.replace(world)
    object.__setattr__(quiet, "s2", np.zeros(world.dims))
    assert quiet.loss(ramp) == pytest.approx(float(_adam_by_hand(quiet, ramp, 1)[0]), rel=1e-9)
    second_moments: list = []
    exact = world._run(world.lr, ramp, trace=second_moments)
    sampled = _adam_by_hand(world, ramp, 8000, second_moments)
    assert len(second_moments) == 64 + 32 + 32
    assert abs(sampled.mean() - exact) < 4 * sampled.std() / np.sqrt(len(sampled))
