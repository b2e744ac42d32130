"""A ladder rung's first round placed from the finished rungs' laws
(orchestrator/analysis/ladder_placement.py), on known-truth ladders (tests/ladder_truth.py) in
memory: the eight smallest-compute rungs finished, the largest placed, against the world's own
brute-force optima there."""

from __future__ import annotations

import math

import pytest

from orchestrator.analysis import ladder_placement, lr_bracket
from tests.ladder_truth import WORLDS

GRID = [2**k for k in range(4, 17)]  # 16 .. 65,536 tokens per update: a wide sweep space


def placed(name: str):
    world = WORLDS[name]
    rungs = sorted(world.rungs(), key=lambda r: r[0] * r[1])
    *finished, last = rungs
    return world, last, ladder_placement.place(world.trials(finished), *last, GRID)


@pytest.mark.parametrize("name", ["power-law", "lr-depends-on-b"])
def test_the_first_round_brackets_the_true_optima_with_fewer_batch_sizes(name):
    world, (params, tokens), p = placed(name)
    truth = world.truth(params, tokens)
    assert p.rungs == 8
    assert p.b_opt == pytest.approx(truth.b_opt, rel=0.15) and p.b_crit == pytest.approx(truth.b_crit, rel=0.15)
    assert p.lr_opt == pytest.approx(truth.lr_opt, rel=0.15)
    # The batch sizes reach B_opt / 4 (where the loss has flattened) and past B_crit, from the grid.
    assert set(p.batches) <= set(GRID) and len(p.batches) <= len(GRID) // 2
    assert min(p.batches) <= truth.b_opt / 4 and max(p.batches) >= truth.b_crit
    for b in p.batches:  # each batch size's three lrs hold the world's best lr at that batch size
        low, middle, high = p.lrs[b]
        assert low < world.lr_law(params, tokens, b) < high
        assert middle == lr_bracket.round_lr(p.lr_opt * (b / p.b_opt) ** p.lr_batch_exponent)
        assert (low, high) == pytest.approx((middle / 2, middle * 2), rel=1e-5)
    if world.lr_b:  # the lr law's B term moves the lrs with B as the world's do
        assert p.lr_batch_exponent == pytest.approx(world.lr_b, abs=0.2)
    else:
        assert p.lr_batch_exponent == 0.0


def test_no_placement_until_the_finished_rungs_fit_the_laws():
    world = WORLDS["power-law"]
    rungs = sorted(world.rungs(), key=lambda r: r[0] * r[1])
    assert ladder_placement.place(world.trials(rungs[:2]), *rungs[2], GRID) is None
    assert ladder_placement.place([], *rungs[0], GRID) is None
    narrow = ladder_placement.place(world.trials(rungs[:4]), *rungs[4], [4096, 8192, 16384, 32768])
    assert narrow.batches == (4096, 8192, 16384)  # the window holds none: the 3 nearest B_opt
    assert narrow.b_opt < 4096 and all(math.isfinite(lr) for lrs in narrow.lrs.values() for lr in lrs)
