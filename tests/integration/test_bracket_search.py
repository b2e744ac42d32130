"""`search.algorithm: bracket` through Ray Tune: the Searcher (orchestrator/studies/bracket_search.py)
drives a known-truth world (tests/known_truth.py) as a plain Tune function, and finds per batch
size a best learning rate inside what it tried and near the world's own optimum, though the
initial grid lies wholly below it at the largest batch sizes. Then the searcher as `sweep` builds
it from a sweep file: the grid sweep's form of suggestion, its early-stopping groups, its first
round as the shapes `submit` checks, and its JSON state."""

import json
import math

import numpy as np
import yaml

from orchestrator.studies import kinds, search_space
from orchestrator.studies.bracket_search import BracketSearch
from orchestrator.studies.grouped_asha import GroupedASHA
from tests.conftest import ROOT
from tests.known_truth import World, factor_grid

BATCHES = (256, 1024, 4096)
INITIAL = [2e-3, 4e-3, 8e-3]  # below the optimum at 1024 and 4096 tokens per update
STEP, MAX_LRS = 2.0, 7
WORLD = World(seed_noise=0.0, total_tokens=2**20)


def stable_loss(world, run):
    """The eval loss where wsd's decay starts (NaN before it: a run that failed earlier)."""
    start = world.total_tokens * (1 - world.wsd_decay_share)
    before = [v for t, v in run.eval if t <= start]
    return before[-1] if before and run.status == "FINISHED" else math.nan


def objective(config, world):
    """A trial: no training, the world's run of (B, lr, seed), reported as the trainer reports."""
    from ray import tune

    v = config["trial"]
    (run,) = world.simulate([(v["batch.tokens_per_update"], v["optim.lr"], v.get("train.seed", 0))])
    tokens = world.total_tokens if run.status == "FINISHED" else run.eval[-1][0]
    tune.report({"eval_loss": run.final_loss, "stable_loss": stable_loss(world, run), "tokens": tokens})


def true_optimum(world, batch):
    """The world's best final loss over a fine scan of lr (2^(1/8) apart)."""
    lrs = factor_grid(5e-4, 0.1, 2**0.125)
    losses = [r.final_loss for r in world.simulate([(batch, lr, 0) for lr in lrs])]
    return lrs[int(np.argmin(losses))]


def test_the_bracket_extends_a_grid_below_the_optimum_until_the_best_is_interior(ray_session, tmp_path):
    from ray import tune

    assert all(max(INITIAL) < WORLD.lr_opt(b) for b in BATCHES[1:])  # the premise
    groups = [({"batch.tokens_per_update": b}, INITIAL, WORLD.total_tokens) for b in BATCHES]
    searcher = BracketSearch(groups, criterion="final_loss", step=STEP, max_lrs=MAX_LRS)
    bound = MAX_LRS * len(BATCHES)
    trainable = tune.with_resources(tune.with_parameters(objective, world=WORLD), {"cpu": 0.5})
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=bound, max_concurrent_trials=4, reuse_actors=True),
        run_config=tune.RunConfig(name="bracket", storage_path=str(tmp_path), verbose=0),
    )
    results = tuner.fit()
    assert not results.errors and len(results) <= bound
    tried = {}
    for r in results:
        v = r.config["trial"]
        tried.setdefault(v["batch.tokens_per_update"], {})[v["optim.lr"]] = r.metrics["eval_loss"]
    assert set(tried) == set(BATCHES)
    for batch, scores in tried.items():
        lrs = sorted(scores)
        best = min(lrs, key=lambda lr: scores[lr])
        assert lrs[0] < best < lrs[-1], (batch, scores)  # bracketed: interior
        truth = true_optimum(WORLD, batch)
        assert truth / STEP <= best <= truth * STEP, (batch, best, truth, scores)
        assert len(lrs) <= MAX_LRS
        if batch in BATCHES[1:]:
            assert lrs[-1] > max(INITIAL)  # it went past the grid's high edge
    # Tune kept the searcher's state as JSON, and a restored run reads it (nothing left to run)
    (state,) = (tmp_path / "bracket").glob("searcher-state-*.json")
    assert all(b["phase"] == "done" for b in json.loads(state.read_text())["brackets"])
    again = tune.Tuner.restore(str(tmp_path / "bracket"), trainable, resume_unfinished=True).fit()
    assert len(again) == len(results) and not again.errors


def write_sweep(tmp_path):
    body = {
        "name": "bk",
        "base": {
            "config": str(ROOT / "conf" / "train" / "tiny.yaml"),
            "overrides": {"train.total_tokens": 65536, "train.eval_every_tokens": 16384},
        },
        "space": {
            "batch.tokens_per_update": {"grid": [1024, 4096]},
            "optim.lr": {"grid": [1e-3, 3e-3]},
            "schedule.warmup_share": {"grid": [0.25, 0.5]},
        },
        "search": {"algorithm": "bracket", "seeds": 2, "max_lrs_per_batch": 4},
        "scheduler": {"type": "asha", "grace_period_tokens": 16384},
    }
    path = tmp_path / "bk.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_a_sweep_s_searcher_suggests_what_a_grid_sweep_carries_and_resumes_from_json(tmp_path):
    from ray.tune.search import Searcher

    from orchestrator.cluster import submit

    path = write_sweep(tmp_path)
    sweep = kinds.load(path)
    first = kinds.expand(sweep)  # 2 batch sizes x 2 warmups x 2 lrs x 2 seeds
    assert len(first) == 16 and kinds.kind_of(sweep).bound(sweep) == 2 * 2 * 4 * 2
    assert "criterion final_loss" in kinds.kind_of(sweep).describe(sweep, first)
    found = kinds.kind_of(sweep).search(sweep, first, {})
    space, searcher = found.space, found.searcher
    assert space == {} and isinstance(searcher, BracketSearch)
    suggested = {f"t{i}": searcher.suggest(f"t{i}")["trial"] for i in range(16)}
    assert searcher.suggest("t16") is None  # every bracket waits for its first round
    assert list(suggested.values()) == [t.values for t in first]  # what run_trial resolves, in order
    assert {search_space.resolve(sweep, v).name for v in suggested.values()} == {t.name for t in first}
    asha = GroupedASHA(search_space.comparison_keys(sweep), time_attr="tokens", metric="eval_loss", mode="min")
    assert {asha.group(type("Trial", (), {"config": {"trial": v}})) for v in suggested.values()} == {
        (b, s) for b in (1024, 4096) for s in (0, 1)
    }  # ASHA compares a trial with its batch size and seed only

    # B=1024 at warmup 25%: the lower lr is better, but one of its seeds was stopped early by
    # ASHA (16,384 of 65,536 tokens): +inf, so the best is the highest lr and the bracket extends
    for tid, v in suggested.items():
        if (v["batch.tokens_per_update"], v["schedule.warmup_share"]) == (1024, 0.25):
            stopped = (v["optim.lr"], v["train.seed"]) == (1e-3, 1)
            result = {"eval_loss": 3.0 if v["optim.lr"] == 1e-3 else 3.5, "tokens": 16384 if stopped else 65536}
            searcher.on_trial_complete(tid, result)
    saved = tmp_path / "searcher-state-x.json"
    searcher.save(str(saved))
    state = json.loads(saved.read_text())  # plain JSON: nothing to unpickle
    assert state["brackets"][0]["lrs"] == [1e-3, 3e-3, 6e-3]
    restored = kinds.kind_of(sweep).searcher(sweep, first, {})
    restored.restore(str(saved))
    for s in (searcher, restored):
        assert s.suggest("t16")["trial"] == {
            "batch.tokens_per_update": 1024,
            "schedule.warmup_share": 0.25,
            "optim.lr": 6e-3,
            "train.seed": 0,
        }

    # the restored searcher runs to the end within its bound, then says FINISHED
    ids = [t for t in suggested if restored.trials[t][0] != 0] + ["t16"]  # all but the reported bracket's
    count = 17
    while ids:
        tid = ids.pop(0)
        _, lr, _ = restored.trials[tid]
        restored.on_trial_complete(tid, {"eval_loss": 2 + math.log(lr / 2e-3) ** 2, "tokens": 65536})
        while (nxt := restored.suggest(f"t{count}")) not in (None, Searcher.FINISHED):
            ids.append(f"t{count}")
            count += 1
    assert nxt == Searcher.FINISHED and count <= kinds.kind_of(sweep).bound(sweep)
    assert all(b.done for b in restored.brackets)
    assert submit.trial_shapes(path)  # submit checks the first round's shapes (an lr changes none)
