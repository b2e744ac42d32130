"""The known-truth world for batch-size schedules (tests/schedule_truth.py) reproduces its closed
forms: McCandlish's hyperbola at every fixed batch, the oracle's twice-the-minimum, and regret
that vanishes where it should."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.analysis import branch_cbs, branch_ramp, critical_batch
from tests.schedule_truth import (
    BATCHES,
    FIXED_SEED_SPREAD,
    STUDY_FACTORS,
    ScheduleWorld,
    branch_ends,
    online_schedule,
    regret,
)


@pytest.mark.parametrize("batch", [64.0, 700.0, 5000.0])
def test_a_constant_noise_scale_gives_steps_s_min_times_one_plus_b_noise_over_b(batch):
    """rise = 0: from loss_start to 2.5 the steps at B are S_min (1 + B_noise / B), with S_min
    written out by hand ((x^-1/2 - x0^-1/2) / (rate / 2) for exponent 3/2), also through run()."""
    world = ScheduleWorld(rise=0.0, b_noise=700.0)
    s_min = (0.5**-0.5 - 3.5**-0.5) / (0.5 * world.rate)
    expected = s_min * (1 + 700.0 / batch)
    assert world.steps_to([(0, batch)], 2.5) == pytest.approx(expected, rel=1e-12)
    tokens = expected * batch
    assert world.run([(0, batch)], tokens).loss == pytest.approx(2.5, rel=1e-12)


def test_a_rising_noise_scale_gives_the_hyperbola_with_its_path_average():
    """rise = 1: steps at every fixed batch lie on S_min (1 + B_crit / B), and B_crit (the report's
    fit recovers it) is B_noise averaged over the path weighted by the fewest steps at each loss,
    here by quadrature: below the B_noise at the target, above the one at the start."""
    world = ScheduleWorld()
    target = 2.4
    steps = np.array([[world.steps_to([(0, b)], target) for b in BATCHES]])
    fit = critical_batch.fit(BATCHES, steps)
    losses = np.linspace(world.loss_start, target, 200_001)
    ds_min = 1 / (world.rate * (losses - world.floor) ** world.exponent)  # dS_min / dL
    average = np.trapezoid(np.array([world.b_crit(v) for v in losses]) * ds_min, losses) / np.trapezoid(ds_min, losses)
    assert float(fit.b_crit[0]) == pytest.approx(average, rel=1e-3)
    assert float(fit.s_min[0]) == pytest.approx(world.s_min(target), rel=1e-4)  # the fit's B_crit grid
    assert world.b_crit(world.loss_start) < average < world.b_crit(target)


def test_the_oracle_takes_twice_the_fewest_steps_and_tokens_and_a_fine_ramp_approaches_it():
    world = ScheduleWorld()
    oracle = world.oracle()
    assert oracle.tokens == pytest.approx(2 * world.e_min(oracle.loss), rel=1e-12)
    assert oracle.steps == pytest.approx(2 * world.s_min(oracle.loss), rel=1e-12)
    errors = []
    for changes in (16, 128, 1024):
        r = regret(world.oracle_schedule(changes), world)
        errors.append((r.extra_steps_vs_oracle / oracle.steps, r.extra_loss_vs_oracle))
        # the ramp lags the oracle (it reads B_crit where a stretch starts): smaller batches, so
        # more steps and a lower loss at equal tokens
        assert r.extra_steps_vs_oracle > 0 and r.extra_loss_vs_oracle < 0
    # the lag is of first order in a stretch's length: 8 times as many changes, about an eighth
    assert [s for s, _ in errors] == pytest.approx([errors[0][0] / 8**k for k in range(3)], rel=0.3)
    assert errors[-1][0] < 2e-3 and abs(errors[-1][1]) < 5e-4


def test_regret_against_the_best_fixed_batch_and_a_schedule_split_anywhere():
    """The best fixed batch of a list is its smallest (a token buys the most progress there); its
    own regret against itself is 0, a larger fixed batch loses loss at equal tokens and saves steps
    at equal loss; a segment split in two changes nothing."""
    world = ScheduleWorld()
    assert world.best_fixed(BATCHES) == min(BATCHES)
    own = regret([(0, min(BATCHES))], world)
    assert own.extra_steps_vs_best_fixed == pytest.approx(0, abs=1e-6) and own.extra_loss_vs_best_fixed == 0
    big = regret([(0, 2048.0)], world)
    assert big.extra_loss_vs_best_fixed > 0 and big.extra_steps_vs_best_fixed < 0
    split = world.run([(0, 512.0), (1e6, 512.0), (2e6, 2048.0)])
    assert split.loss == pytest.approx(world.run([(0, 512.0), (2e6, 2048.0)]).loss, rel=1e-12)
    assert split.steps == pytest.approx(2e6 / 512 + (world.total_tokens - 2e6) / 2048, rel=1e-12)
    with pytest.raises(ValueError, match="starts at 0"):
        world.run([(10, 512.0)])
    assert math.isfinite(world.steps_to([(0, 512.0)], world.oracle().loss))


BASE = 256.0  # branches.yaml's base batch; the world's B_crit at its start
TRIED = tuple(BASE * k for k in STUDY_FACTORS)


def suggested(world: ScheduleWorld, threshold: float = branch_ramp.THRESHOLD):
    """The ramp `report` suggests from the world's branch study, as a schedule."""
    along = branch_cbs.critical_batch_along(branch_ends(world, BASE))
    fit = branch_ramp.power_law_fit(along)
    ramp = branch_ramp.suggested_ramp(along, fit, int(BASE), int(world.total_tokens), 1, 1, threshold)
    return [(s["from_tokens"], s["tokens_per_update"]) for s in ramp]


def test_the_suggested_ramp_reaches_the_best_fixed_loss_in_fewer_steps_and_near_the_oracle():
    """The acceptance test of the ramp rule: on the world's branch study (branches.yaml's layout),
    the ramp the report suggests ends within the fixed arm's seed spread of the best fixed batch the
    study tried (its base, 256) in at most 2/3 of its steps, and takes at most 2.5 times the oracle's
    steps more than the oracle to the oracle's loss (the oracle: B = B_crit(t), 2 S_min steps).
    Measured: 10,259 against 16,384 steps, 0.007 more loss (the spread: 0.014); 5,690 steps past the
    oracle's 2,464 to its loss (the branches long enough for Adam end the last point at 69 % of the
    budget, so the ramp stops growing earlier than the oracle). Merrill et al.'s 2x misses by three
    spreads: 0.044 more loss."""
    world = ScheduleWorld()
    spread = FIXED_SEED_SPREAD * world.run([(0.0, BASE)]).loss
    r = regret(suggested(world), world, TRIED)
    assert r.best_fixed_batch == BASE
    assert 0 <= r.extra_loss_vs_best_fixed <= spread
    assert r.outcome.steps <= 2 / 3 * r.best_fixed.steps and r.extra_steps_vs_best_fixed < 0
    assert 0 < r.extra_steps_vs_oracle <= 2.5 * r.oracle.steps
    # the fixed rule's cause: at 2x the batch is up to B_crit, a token costs up to twice its least
    doubling_at_2x = regret(suggested(world, 2.0), world, TRIED)
    assert doubling_at_2x.extra_loss_vs_best_fixed > 2 * spread
    assert doubling_at_2x.outcome.steps < r.outcome.steps


def test_the_online_rule_holds_the_loss_at_a_quarter_of_the_noise_scale_and_not_at_all_of_it():
    """batch.schedule=adaptive at its best on the world (the exact B_crit read every 1,024 tokens):
    with calibration 1 (double at 2x) it ends 0.051 above the best fixed batch, outside the spread;
    with 0.25 (8x) within it (+0.009) in 47 % fewer steps; its regret against the oracle is at most
    2 times the oracle's steps past it to the oracle's loss (measured: 4,407 past 2,464)."""
    world = ScheduleWorld()
    spread = FIXED_SEED_SPREAD * world.run([(0.0, BASE)]).loss
    quarter = regret(online_schedule(world, BASE, 8.0), world, TRIED)
    assert 0 < quarter.extra_loss_vs_best_fixed <= spread and quarter.outcome.steps <= 0.6 * quarter.best_fixed.steps
    assert 0 < quarter.extra_steps_vs_oracle <= 2 * quarter.oracle.steps
    assert regret(online_schedule(world, BASE, 2.0), world, TRIED).extra_loss_vs_best_fixed > 3 * spread


def test_a_calibration_read_within_its_margin_keeps_the_online_batch_under_half_the_critical_batch():
    """branch_ramp.CALIBRATION_MARGIN's reason, on the world: the online rule (double where the
    calibrated reading passes 2x the batch, calibrated to 1/4 of the ratio) reads the critical batch
    size CALIBRATION_MARGIN x too high at worst when resolved, which is threshold 8 / 2 = 4 here: every
    batch it takes is then at most half of B_crit where it takes it (0.5 measured); read 4x too high
    (a setting the status refuses) it reaches B_crit itself (1.0): the threshold-2 rule of the test
    above, which ends more than 3 spreads above the best fixed batch."""
    world = ScheduleWorld()
    margin = branch_ramp.CALIBRATION_MARGIN

    def worst_share(schedule):
        return max(batch / world.b_crit(world.run(schedule, t).loss) for t, batch in schedule[1:])

    assert worst_share(online_schedule(world, BASE, 8.0)) <= 0.25 + 1e-9
    assert worst_share(online_schedule(world, BASE, 8.0 / margin)) <= 0.5 + 1e-9
    assert worst_share(online_schedule(world, BASE, 8.0 / (2 * margin))) > 0.5
