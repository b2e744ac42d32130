"""The ladder's two points and its trade-off at a target 1.5 decades of compute beyond its largest
rung, on ladders whose loss has an interior minimum in batch size and whose best lr moves with B
(tests/basin_truth.py: a Chinchilla loss, a linex penalty, an asymmetric lr response: not the
fitted forms), with two seeds and with one seed per configuration. Fixed draws;
benchmarks/ladder_coverage.py runs 30 of each (docs/benchmarks.md)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from orchestrator.analysis import ladder
from tests.basin_truth import WORLDS, BasinWorld

DRAWS = 10


def analyse(world: BasinWorld) -> ladder.Ladder:
    return ladder.analyse(world.trials(), world.target)


@pytest.fixture(scope="module")
def two_seeds():
    world = WORLDS["basin"]
    return world, [analyse(world.with_(draw=d)) for d in range(DRAWS)]


@pytest.fixture(scope="module")
def one_seed():
    world = WORLDS["basin-one-seed"]
    return world, [analyse(world.with_(draw=d)) for d in range(DRAWS)]


def truth(world: BasinWorld):
    n, d = world.target
    return world.b_star(n, d), world.lr_star(n, d)


def covers(value, true: float) -> bool:
    return value.interval is not None and value.interval[0] <= true <= value.interval[1]


def test_the_world_has_an_interior_minimum_and_a_best_lr_that_moves_with_b():
    world = WORLDS["basin"]
    n, d = world.target
    b = world.b_star(n, d)
    lr = world.lr_star(n, d)
    best = float(world.final_loss(n, d, b, lr))
    for factor in (0.5, 2.0):  # the loss rises on both sides of B*, each at its own best lr
        assert float(world.final_loss(n, d, b * factor, world.lr_star(n, d, b * factor))) > best
        assert float(world.final_loss(n, d, b * factor, lr)) > float(
            world.final_loss(n, d, b * factor, world.lr_star(n, d, b * factor))
        )
    assert world.lr_star(n, d, 2 * b) / lr == pytest.approx(2**world.eta)
    decades = math.log10(n * d / max(p * t for p, t in world.rungs()))
    assert decades == pytest.approx(1.5)


def test_b_star_and_its_lr_are_within_125x_of_the_truth_and_covered_in_80_percent(two_seeds):
    world, results = two_seeds
    b_true, lr_true = truth(world)
    optimal = [r.tradeoff.loss_optimal for r in results]
    b_ratio = [o.tokens_per_update.value / b_true for o in optimal]
    lr_ratio = [o.lr.value / lr_true for o in optimal]
    print("B* / truth", np.round(b_ratio, 3), "lr / truth", np.round(lr_ratio, 3))
    assert all(1 / 1.25 <= x <= 1.25 for x in b_ratio + lr_ratio)
    assert sum(covers(o.tokens_per_update, b_true) for o in optimal) >= 0.8 * DRAWS
    assert sum(covers(o.lr, lr_true) for o in optimal) >= 0.8 * DRAWS
    n, d = world.target
    losses = [o.predicted_loss for o in optimal]
    assert all(x.value == pytest.approx(world.loss_star(n, d), rel=0.01) for x in losses)
    assert sum(covers(x, world.loss_star(n, d)) for x in losses) >= 0.8 * DRAWS


def test_the_predicted_penalty_is_within_01_percent_of_the_truth_from_b_star_over_4_to_4_b_star(two_seeds):
    """As a function of B / B* (the curve the laws extrapolate; B*'s own error is the test above):
    the predicted penalty at r x the predicted B* against the true penalty at r x the true B*."""
    world, results = two_seeds
    n, d = world.target
    b_true, _ = truth(world)
    ratios = 2.0 ** np.linspace(-2, 2, 17)
    for result in results:
        b_star = result.tradeoff.loss_optimal.tokens_per_update.value
        predicted = np.array([result.tradeoff.curve.penalty(b_star * r)[0] for r in ratios])
        true = world.penalty(n, d, b_true * ratios)
        assert np.max(np.abs(predicted - true)) <= 0.001, np.round(predicted - true, 4)


def test_with_one_seed_per_configuration_intervals_exist_and_cover_in_80_percent(one_seed):
    world, results = one_seed
    b_true, lr_true = truth(world)
    optimal = [r.tradeoff.loss_optimal for r in results]
    assert all(o.tokens_per_update.interval and o.lr.interval for o in optimal)
    assert sum(covers(o.tokens_per_update, b_true) for o in optimal) >= 0.8 * DRAWS
    assert sum(covers(o.lr, lr_true) for o in optimal) >= 0.8 * DRAWS
    n, d = world.target
    points = [r.tradeoff.tolerance_point for r in results]
    assert all(p.predicted_loss_penalty.interval for p in points)
    # The penalty's interval at the tolerance point holds the true penalty of that batch (at its best lr).
    held = [covers(p.predicted_loss_penalty, float(world.penalty(n, d, p.tokens_per_update.value))) for p in points]
    assert sum(held) >= 0.8 * DRAWS


def test_the_tolerance_point_is_the_largest_batch_within_the_tolerance_and_saves_steps(two_seeds):
    world, results = two_seeds
    n, d = world.target
    for result in results:
        t = result.tradeoff
        point, b_star = t.tolerance_point, t.loss_optimal.tokens_per_update.value
        assert point.predicted_loss_penalty.value == pytest.approx(result.tolerance, rel=1e-3)
        assert t.curve.penalty(point.tokens_per_update.value * 1.05)[0] > result.tolerance
        assert point.steps_saved.value == pytest.approx(d / b_star - d / point.tokens_per_update.value)
        assert 1.5 < point.tokens_per_update.value / b_star < 4
    # Followed, it pays: the true penalty at the recommended batch (its best lr) stays near the
    # tolerance, for 55-65 % fewer steps than at B*.
    true = [float(world.penalty(n, d, r.tradeoff.tolerance_point.tokens_per_update.value)) for r in results]
    assert np.median(true) == pytest.approx(0.005, abs=0.001) and max(true) < 0.0085


def test_the_recommendation_is_the_tolerance_point_and_report_json_carries_both_points(two_seeds):
    world, results = two_seeds
    result = results[0]
    rec, point = result.recommendation, result.tradeoff.tolerance_point
    assert rec.tokens_per_update is point.tokens_per_update and rec.lr is point.lr
    assert rec.loss_optimal is result.tradeoff.loss_optimal
    report = json.loads(json.dumps(ladder.to_json(result)))
    recommendation = report["recommendation"]
    assert recommendation["tolerance"] == result.tolerance == 0.005
    for key in ("tokens_per_update", "lr", "predicted_loss"):
        assert set(recommendation["loss_optimal"][key]) == {"value", "interval"}
    for key in ("predicted_loss_penalty", "steps_saved", "tokens_per_update", "lr", "warmup_tokens"):
        assert set(recommendation[key]) == {"value", "interval"}
    assert "largest batch" in recommendation["point"]
    rows = report["tradeoff"]
    assert len(rows) == 9
    assert all(set(row) == {"tokens_per_update", "lr", "predicted_loss_penalty", "interval", "steps"} for row in rows)
    names = [law["name"] for law in report["laws"]]
    assert names == ["b_opt", "b_crit", "lr_opt", "b_star", "loss_star", "penalty_half", "penalty_double"]
    for rung in report["rungs"]:
        assert rung["b_star"]["status"] == "resolved" and rung["b_star"]["interval"]
    text = "\n".join(ladder.lines(result))
    assert "Loss-optimal: B* = " in text and "optimizer steps fewer than at B*" in text


def test_a_tolerance_moves_only_the_tolerance_point():
    world = WORLDS["basin"]
    trials = world.trials()
    tight, loose = (ladder.analyse(trials, world.target, tolerance) for tolerance in (0.002, 0.01))
    assert tight.tradeoff.loss_optimal.tokens_per_update.value == loose.tradeoff.loss_optimal.tokens_per_update.value
    assert tight.recommendation.tokens_per_update.value < loose.recommendation.tokens_per_update.value
    assert tight.recommendation.steps_saved.value < loose.recommendation.steps_saved.value
