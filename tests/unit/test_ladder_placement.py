"""A ladder rung's first round placed from the finished rungs' laws
(orchestrator/analysis/ladder_placement.py), on known-truth ladders (tests/ladder_truth.py) in
memory: the eight smallest-compute rungs finished, the largest placed, against the world's own
brute-force optima there."""

from __future__ import annotations

import math

import pytest

from orchestrator.analysis import ladder_placement, lr_bracket
from orchestrator.studies import kinds
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


def test_before_the_laws_fit_the_nearest_finished_rung_stands_in():
    """Two finished rungs fit no law: the larger (nearest in compute) is read as the prediction, its
    own B_opt, B_crit and best lr; its lrs still hold the world's best lr at the new rung."""
    from orchestrator.analysis import ladder

    world = WORLDS["power-law"]
    rungs = sorted(world.rungs(), key=lambda r: r[0] * r[1])
    finished = world.trials(rungs[:2])
    p = ladder_placement.place(finished, *rungs[2], GRID)
    fitted = ladder.analyse(finished, rungs[2])
    assert fitted.recommendation.tokens_per_update is None  # no law yet
    nearest = fitted.rungs[1]
    assert (nearest.params, nearest.tokens) == rungs[1] and p.rungs == 1
    assert (p.b_opt, p.b_crit, p.lr_opt) == (nearest.b_opt.value, nearest.b_crit.value, nearest.lr_opt.value)
    for b in p.batches:
        low, _, high = p.lrs[b]
        assert low < world.lr_law(*rungs[2], b) < high
    assert ladder_placement.place([], *rungs[0], GRID) is None
    narrow = ladder_placement.place(world.trials(rungs[:4]), *rungs[4], [4096, 8192, 16384, 32768])
    assert narrow.batches == (4096, 8192, 16384)  # the window holds none: the 3 nearest B_opt
    assert narrow.b_opt < 4096 and all(math.isfinite(lr) for lrs in narrow.lrs.values() for lr in lrs)


def test_the_ladder_search_holds_a_rung_until_the_smaller_ones_are_done_then_places_it(tmp_path):
    """LadderSearch on the four smallest rungs of a known-truth ladder, each trial scored by the
    world's noise-free final loss: the first rung runs from the space, each later one only once the
    smaller ones are done, at the placed batch sizes and lrs, with fewer trials; its state survives
    save/restore."""
    from orchestrator.studies.bracket_search import LadderSearch

    world = WORLDS["power-law"]
    rungs = sorted(world.rungs(), key=lambda r: r[0] * r[1])[:4]
    grid = [2**k for k in range(6, 15)]
    groups = [  # a rung's values: its model (here its N) and budget, as ladder_plan gives them
        ({"model.params": n, "train.total_tokens": d, "batch.tokens_per_update": b}, [1.5e-3, 3e-3, 6e-3], None)
        for n, d in rungs
        for b in grid
    ]
    rung_of = [r for r in range(len(rungs)) for _ in grid]
    reads = []
    search = LadderSearch(  # the k-th read places rung k: the world's own tables of the k before it
        groups, rungs, rung_of, max_lrs=5, finished=lambda: reads.append(1) or world.trials(rungs[: len(reads)])
    )

    def run_all(search) -> list:
        """Every trial the search hands out, scored at once: [(rung, batch, lr)] in order."""
        ran = []
        while (suggested := search.suggest(str(len(ran)))) not in (None, LadderSearch.FINISHED):
            values = suggested["trial"]
            rung = (values["model.params"], values["train.total_tokens"])
            b, lr = values["batch.tokens_per_update"], values["optim.lr"]
            ran.append((rung, b, lr))
            search.on_trial_complete(str(len(ran) - 1), {"eval_loss": world.final_loss_at(*rung, b, lr)})
        return ran

    ran = run_all(search)
    last = rungs[3]
    order = [rungs.index(rung) for rung, _, _ in ran]
    assert order == sorted(order)  # smallest first, one rung at a time
    assert len(reads) == 3 and set(search.placed) == {1, 2, 3}
    # the nearest finished rung stands in until the laws fit (from three rungs here)
    assert [search.placed[k]["from_rungs"] for k in (1, 2, 3)] == [1, 1, 3]
    placed = search.placed[3]
    truth = world.truth(*rungs[3])
    assert placed["b_opt"] == pytest.approx(truth.b_opt, rel=0.3)
    assert {b for rung, b, _ in ran if rung == last} == set(placed["batches"]) < set(grid)
    state = tmp_path / "state.json"
    search.save(str(state))
    again = LadderSearch(groups, rungs, rung_of, finished=lambda: [])
    again.restore(str(state))
    assert again.released == [True] * 4 and again.placed == search.placed
    assert [b.to_json() for b in again.brackets] == [b.to_json() for b in search.brackets]
    assert search.suggest("end") == LadderSearch.FINISHED
    per_rung = {rung: sum(1 for x in ran if x[0] == rung) for rung in rungs}
    assert max(per_rung[r] for r in rungs[1:]) < per_rung[rungs[0]]  # fewer trials than the space's rung
    # At step 2 every bracket keeps its refinement round; at sqrt 2 none has one.
    assert all(b.refine for b in search.brackets)
    fine = LadderSearch(groups, rungs, rung_of, step=math.sqrt(2), finished=lambda: world.trials(rungs[:1]))
    run_all(fine)
    assert set(fine.placed) == {1, 2, 3} and not any(b.refine for b in fine.brackets)


def test_a_ladder_sweeps_searcher_knows_each_groups_rung(tmp_path):
    from orchestrator.studies import ladder_plan
    from tests.unit.test_ladder_plan import ladder_sweep

    sweep = ladder_sweep(tmp_path)
    groups = kinds.kind_of(sweep).brackets(sweep)
    first = [kinds.kind_of(sweep).resolve(sweep, {**point, "optim.lr": lrs[0]}) for point, lrs in groups]
    search = kinds.kind_of(sweep).searcher(sweep, first, {})
    plans = ladder_plan.rungs(sweep)
    assert search.rungs == [(p.params, p.tokens) for p in plans]
    for values, rung in zip(search.values, search.rung_of):
        assert values["train.total_tokens"] == plans[rung].tokens
        assert all(values[k] == v for k, v in plans[rung].model.items())
    assert search.rung_of == sorted(search.rung_of) and search.tolerance == sweep.ladder.tolerance


def test_where_the_loss_rises_on_both_sides_the_first_round_holds_both_sides_of_b_star():
    """A ladder whose rungs have a loss-optimal batch B* (tests/basin_truth.py): the placement
    reads the recommendation's tolerance point (about 2.4 B*) as it reads B_opt, so its batch sizes
    run from below B* / 2 to past 1.5 B* (a surface needs both sides of its basin; the window ends
    at 0.9 B_opt, about 2.2 B*), and each one's three lrs hold the world's best lr there."""
    from tests.basin_truth import WORLDS as BASINS

    world = BASINS["basin"]
    rungs = sorted(world.rungs(), key=lambda r: r[0] * r[1])
    *finished, (params, tokens) = rungs
    grid = [2**k for k in range(14, 24)]
    p = ladder_placement.place(world.trials(finished), params, tokens, grid, step=math.sqrt(2))
    b_star = world.b_star(params, tokens)
    assert min(p.batches) <= b_star / 2 and max(p.batches) >= 1.5 * b_star
    assert len(p.batches) == 3
    for b in p.batches:
        low, _, high = p.lrs[b]
        assert low < world.lr_star(params, tokens, b) < high
