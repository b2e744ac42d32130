"""The learning-rate bracket of one batch size (orchestrator/analysis/lr_bracket.py), driven round by round
by score functions whose best lr is known: extension past either edge, the refinement vertex,
the bound, failures as +inf, seeds averaged, two criteria, and its JSON state."""

import json
import math

import pytest

from orchestrator.analysis.lr_bracket import Bracket, scores_of

INF = math.inf


def bowl(opt, criterion="final_loss", floor=2.0):
    """A loss quadratic in log lr with its minimum at `opt`."""
    return lambda lr, seed: {criterion: floor + math.log(lr / opt) ** 2}


def drive(bracket, score):
    """Every round to the end: [the lrs of each round] (each lr once, however many seeds)."""
    rounds = []
    while not bracket.done:
        taken = []
        while (trial := bracket.take()) is not None:
            taken.append(trial)
        assert taken, "not done, yet nothing to run"
        rounds.append(sorted({lr for lr, _ in taken}))
        for lr, seed in taken:
            bracket.record(lr, seed, score(lr, seed))
    return rounds


def test_extends_past_the_high_edge_then_refines_at_the_vertex():
    b = Bracket([1e-3, 2e-3, 4e-3])
    rounds = drive(b, bowl(0.02))
    assert rounds == [[1e-3, 2e-3, 4e-3], [8e-3], [0.016], [0.032], [0.02]]  # a parabola's vertex is exact
    assert b.best("final_loss") == 0.02 and b.why == "interior, refined"


def test_without_refinement_it_extends_to_an_interior_best_and_stops_there():
    b = Bracket([1e-3, 2e-3, 4e-3], refine=False)
    assert drive(b, bowl(0.02)) == [[1e-3, 2e-3, 4e-3], [8e-3], [0.016], [0.032]]
    assert b.best("final_loss") == 0.016 and b.why == "interior"
    again = Bracket.from_json(json.loads(json.dumps(Bracket([1e-3], refine=False).to_json())))
    assert again.refine is False
    old = Bracket([1e-3]).to_json()
    del old["refine"]  # a state saved before the flag existed refines, as it did then
    assert Bracket.from_json(old).refine is True


def test_extends_past_the_low_edge():
    b = Bracket([1e-3, 2e-3])
    rounds = drive(b, bowl(1e-4))
    assert rounds == [[1e-3, 2e-3], [5e-4], [2.5e-4], [1.25e-4], [6.25e-5], [1e-4]]
    assert len(b.lrs) == 7 and b.best("final_loss") == 1e-4


def test_the_bound_stops_the_extension_at_the_edge():
    b = Bracket([1e-3, 2e-3, 4e-3], seeds=2, max_lrs=5)
    rounds = drive(b, bowl(1.0))
    assert rounds[1:] == [[8e-3], [0.016]]
    assert len(b.lrs) == 5 and len(b.results) == 5 * 2
    assert b.best("final_loss") == 0.016 and "high edge" in b.why and "max_lrs_per_batch" in b.why


def test_vertex_of_a_lopsided_bracket_and_no_refinement_next_to_a_tried_lr():
    b = Bracket([1e-3, 2e-3, 4e-3])
    assert drive(b, bowl(2.6e-3)) == [[1e-3, 2e-3, 4e-3], [2.6e-3]]
    b = Bracket([1e-3, 2e-3, 4e-3])
    assert drive(b, bowl(2.1e-3)) == [[1e-3, 2e-3, 4e-3]]  # within 2^(1/4) of 2e-3: nothing to refine
    assert b.why == "interior, nothing to refine"
    # scores that are not a parabola: the vertex lies between the best's neighbours
    b = Bracket([1e-3, 2e-3, 4e-3])
    scores = {1e-3: 3.0, 2e-3: 1.0, 4e-3: 1.1}
    rounds = drive(b, lambda lr, seed: {"final_loss": scores.get(lr, 2.0)})
    assert len(rounds) == 2 and 2e-3 * 2**0.25 < rounds[1][0] < 4e-3


def test_failures_score_inf():
    diverges = lambda lr, seed: {"final_loss": INF if lr > 5e-3 else 2 + math.log(lr / 4.5e-3) ** 2}  # noqa: E731
    b = Bracket([1e-3, 2e-3, 4e-3])
    rounds = drive(b, diverges)
    # 8e-3 diverged: the best is interior, refined half way (in log) towards the divergence
    assert rounds == [[1e-3, 2e-3, 4e-3], [8e-3], [pytest.approx(math.sqrt(4e-3 * 8e-3), rel=1e-5)]]
    assert b.score(8e-3, "final_loss") == INF
    b = Bracket([1e-3, 2e-3], max_lrs=4)  # every lr fails: too high, most likely
    assert drive(b, lambda lr, seed: {"final_loss": math.nan}) == [[1e-3, 2e-3], [5e-4], [2.5e-4]]
    assert b.best("final_loss") is None and "low edge" in b.why


def test_seeds_are_averaged_and_a_round_waits_for_every_seed():
    per_seed = {0: {1e-3: 1.0, 2e-3: 0.9, 4e-3: 0.95}, 1: {1e-3: 1.0, 2e-3: 1.2, 4e-3: 0.96}}
    b = Bracket([1e-3, 2e-3, 4e-3], seeds=2)
    taken = [b.take() for _ in range(6)]
    assert taken == [(lr, k) for lr in (1e-3, 2e-3, 4e-3) for k in (0, 1)] and b.take() is None
    for lr, k in taken[:-1]:
        b.record(lr, k, {"final_loss": per_seed[k][lr]})
    assert b.take() is None and b.lrs == [1e-3, 2e-3, 4e-3]  # one seed of 4e-3 still out
    b.record(*taken[-1], {"final_loss": per_seed[1][4e-3]})
    # seed 0 alone has its best inside; the mean over both seeds is best at 4e-3, the edge
    assert b.score(2e-3, "final_loss") == pytest.approx(1.05) and b.best("final_loss") == 4e-3
    assert [b.take(), b.take(), b.take()] == [(8e-3, 0), (8e-3, 1), None]
    b = Bracket([1e-3, 2e-3, 4e-3], seeds=2)  # one failed seed makes its lr +inf
    scores = drive(b, lambda lr, k: {"final_loss": INF if (lr, k) == (4e-3, 1) else 2 + math.log(lr / 4e-3) ** 2})
    assert b.score(4e-3, "final_loss") == INF and scores[1] != [8e-3]


def test_both_criteria_must_be_interior_and_both_are_refined():
    both = lambda lr, seed: {**bowl(2.6e-3)(lr, seed), **bowl(1.1e-2, "stable_loss")(lr, seed)}  # noqa: E731
    b = Bracket([1e-3, 2e-3, 4e-3], criteria=("final_loss", "stable_loss"))
    rounds = drive(b, both)
    # final_loss is interior at once; stable_loss pulls the bracket up until it is interior too
    assert rounds[:3] == [[1e-3, 2e-3, 4e-3], [8e-3], [0.016]]
    assert rounds[3] == [pytest.approx(2.6e-3), pytest.approx(1.1e-2)]
    assert b.best("final_loss") == pytest.approx(2.6e-3) and b.best("stable_loss") == pytest.approx(1.1e-2)
    b = Bracket([2e-3], criteria=("final_loss", "stable_loss"))  # one lr is both edges: one of each way
    b.record(*b.take(), {"final_loss": 1.0, "stable_loss": 1.0})
    assert sorted(lr for lr, _ in [b.take(), b.take()]) == [1e-3, 4e-3]


def test_scores_of_a_trial_result():
    criteria = ("final_loss", "stable_loss")
    good = {"tokens": 4096, "eval_loss": 2.5, "stable_loss": 2.7}
    assert scores_of(good, False, criteria, budget=4096) == {"final_loss": 2.5, "stable_loss": 2.7}
    assert scores_of({"tokens": 4096, "eval_loss": 2.5}, False, criteria) == {"final_loss": 2.5, "stable_loss": INF}
    assert scores_of({**good, "stable_loss": math.nan}, False, criteria)["stable_loss"] == INF
    for result, error in [
        (good, True),  # the trial raised
        (None, True),
        (None, False),  # removed before it started
        ({**good, "tokens": 2048}, False),  # early stopping cut it at 2048 of 4096 tokens
        ({"tokens": 512, "diverged": 1.0, "loss": math.nan}, False),
        ({"tokens": 0, "eval_loss": INF, "infeasible": "no exact split"}, False),
    ]:
        assert scores_of(result, error, criteria, budget=4096) == {"final_loss": INF, "stable_loss": INF}


def test_state_survives_json_mid_search():
    score = bowl(0.02)
    whole = Bracket([1e-3, 2e-3, 4e-3], seeds=2)
    expected = drive(whole, score)
    b = Bracket([1e-3, 2e-3, 4e-3], seeds=2)
    for _ in range(2):  # two rounds, then one trial of the third handed out but not reported
        taken = [b.take() for _ in range(len(b.queue))]
        for lr, k in taken:
            b.record(lr, k, score(lr, k))
    out = b.take()
    restored = Bracket.from_json(json.loads(json.dumps(b.to_json(), allow_nan=False)))
    assert restored.out == [out] and restored.lrs == b.lrs
    restored.record(*out, score(*out))
    assert [expected[0], [8e-3]] + drive(restored, score) == expected
    assert restored.lrs == whole.lrs and restored.results == whole.results
