"""Sweep files -> trials: distributions, lr scaling rules, shares of the budget, joint
constraints, infeasible combinations listed before anything launches."""

import math

import pytest
import yaml

from orchestrator.core import derived
from orchestrator.core.errors import ConfigError
from orchestrator.studies import kinds, search_space
from tests.conftest import ROOT

TINY = str(ROOT / "conf" / "train" / "tiny.yaml")


def write(tmp_path, **body):
    body.setdefault("name", "t")
    body.setdefault("base", {"config": TINY})
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_grid_product_and_names(tmp_path):
    sweep = kinds.load(
        write(
            tmp_path,
            space={"batch.tokens_per_update": {"grid": [2048, 65536]}, "optim.lr": {"grid": [3e-4, 1e-3]}},
            base={"config": TINY, "overrides": {"train.total_tokens": 1048576, "schedule.warmup_tokens": 131072}},
        )
    )
    trials = kinds.expand(sweep)
    assert len(trials) == 4
    assert {(t.cfg.batch.tokens_per_update, t.cfg.optim.lr) for t in trials} == {
        (2048, 3e-4),
        (2048, 1e-3),
        (65536, 3e-4),
        (65536, 1e-3),
    }
    assert trials[2].name.startswith("B=64Ki lr=3e-4")


def test_random_draws_are_seeded_and_in_range(tmp_path):
    body = dict(
        space={"optim.lr": {"loguniform": [1e-4, 1e-2]}, "train.seed": {"randint": [1, 3]}},
        search={"algorithm": "random", "num_samples": 50, "seed": 7},
    )
    a = kinds.expand(kinds.load(write(tmp_path, **body)))
    b = kinds.expand(kinds.load(write(tmp_path, **body)))
    assert [t.cfg.optim.lr for t in a] == [t.cfg.optim.lr for t in b]
    assert all(1e-4 <= t.cfg.optim.lr <= 1e-2 for t in a)
    assert {t.cfg.train.seed for t in a} == {1, 2, 3}
    logs = [math.log10(t.cfg.optim.lr) for t in a]
    assert min(logs) < -3.3 and max(logs) > -2.7  # spread over decades, not clustered at the top


@pytest.mark.parametrize("alpha,expected", [("sqrt", 0.5), ("linear", 1.0), (0.25, 0.25)])
def test_lr_scaling_rule(tmp_path, alpha, expected):
    sweep = kinds.load(
        write(
            tmp_path,
            space={"batch.tokens_per_update": {"grid": [1024, 4096, 16384]}},
            lr_scaling={"reference_tokens": 4096, "base_lr": 1e-3, "alpha": alpha},
            base={"config": TINY, "overrides": {"train.total_tokens": 1048576, "schedule.warmup_tokens": 0}},
        )
    )
    for t in kinds.expand(sweep):
        ratio = t.cfg.batch.tokens_per_update / 4096
        assert t.cfg.optim.lr == pytest.approx(1e-3 * ratio**expected, rel=1e-5)


def test_warmup_as_share_of_budget(tmp_path):
    sweep = kinds.load(
        write(
            tmp_path,
            space={"schedule.warmup_share": {"grid": [0.01, 0.1]}},
            base={"config": TINY, "overrides": {"batch.tokens_per_update": 1024}},
        )
    )
    budget = kinds.expand(sweep)[0].cfg.train.total_tokens
    assert [t.cfg.schedule.warmup_tokens for t in kinds.expand(sweep)] == [
        round(0.01 * budget),
        round(0.1 * budget),
    ]


def test_constraints_and_infeasible_listing(tmp_path):
    body = dict(
        space={"batch.tokens_per_update": {"grid": [4096, 5000, 131072]}},
        constraints=[{"key": "batch.tokens_per_update", "max": 0.25, "of": "train.total_tokens"}],
        base={"config": TINY, "overrides": {"schedule.warmup_tokens": 0}},
    )
    sweep = kinds.load(write(tmp_path, **body))
    with pytest.raises(ConfigError) as info:
        search_space.split_feasible(sweep, kinds.expand(sweep))
    message = str(info.value)
    assert "2 of 3 trials infeasible" in message and "4,992" in message and "constraint" in message
    sweep = kinds.load(write(tmp_path, infeasible="skip", **body))
    good, bad = search_space.split_feasible(sweep, kinds.expand(sweep))
    assert [t.cfg.batch.tokens_per_update for t in good] == [4096] and len(bad) == 2


def test_asha_needs_reports_at_equal_tokens(tmp_path):
    sweep = kinds.load(
        write(
            tmp_path,
            space={"batch.tokens_per_update": {"grid": [4096, 12288]}},
            scheduler={"type": "asha", "grace_period_tokens": 65536},
        )
    )
    with pytest.raises(ConfigError, match="train.eval_every_tokens"):
        search_space.check_asha_alignment(sweep, kinds.expand(sweep))


@pytest.mark.parametrize(
    "body,key",
    [
        ({"space": {"optim.lrr": {"grid": [1]}}}, "space.optim.lrr"),
        ({"space": {"optim.lr": {"grid": []}}}, "space.optim.lr"),
        ({"space": {"optim.lr": {"uniform": [0.1, 0.01]}}, "search": {"algorithm": "random"}}, "space.optim.lr"),
        ({"space": {"optim.lr": {"normal": [0, 1]}}}, "space.optim.lr"),
        ({"constraints": [{"key": "optim.lrr", "max": 1}]}, "constraints.0.key"),
        ({"search": {"algorithm": "bayes"}}, "search.algorithm"),
        ({"scheduler": {"type": "pbt"}}, "scheduler.type"),
        ({"lr_scaling": {"reference_tokens": 1, "base_lr": 1e-3, "alpha": "cubic"}}, "lr_scaling.alpha"),
        ({"bogus": 1}, "bogus"),
        ({"local_mode": "yes"}, "local_mode"),
        ({"search": {"num_samples": "four"}}, "search.num_samples"),
        ({"search": {"max_concurrent": 2, "workers": 3}}, "search.workers"),
        ({"search": "grid"}, "search"),
        ({"scheduler": {"type": "asha", "grace_period_tokens": "64k"}}, "scheduler.grace_period_tokens"),
        ({"max_failures": "twice"}, "max_failures"),
        ({"space": ["optim.lr"]}, "space"),
        ({"space": {"schedule.warmup_share": {"grid": ["5%"]}}}, "space.schedule.warmup_share"),
        ({"space": {}, "lr_scaling": {"reference_tokens": 0, "base_lr": 1e-3}}, "lr_scaling.reference_tokens"),
        (
            {"space": {}, "lr_scaling": {"reference_tokens": 4096, "base_lr": {"grid": ["big"]}}},
            "space.lr_scaling.base_lr",
        ),
        (
            {"constraints": [{"key": "schedule.warmup_tokens", "max": "a tenth", "of": "train.total_tokens"}]},
            "constraints.0.max",
        ),
        ({"base": "tiny.yaml"}, "base"),
    ],
)
def test_bad_sweep_files(tmp_path, body, key):
    with pytest.raises(ConfigError) as info:
        kinds.load(write(tmp_path, **body))
    assert info.value.key == key


def test_shipped_sweeps_are_valid():
    for path in sorted((ROOT / "conf" / "sweep").glob("*.yaml")):
        sweep = kinds.load(path)
        good, _ = search_space.split_feasible(sweep, kinds.expand(sweep))
        search_space.check_asha_alignment(sweep, good)
        budgets = {t.cfg.train.total_tokens for t in good}
        assert len(budgets) == 1 or sweep.ladder, "every trial shares the budget (but a ladder's rungs)"


def test_optuna_search_space_is_built_from_the_sweep(tmp_path):
    """Optuna TPE proposes points adaptively: the sweep maps its space onto Tune's."""
    pytest.importorskip("optuna")
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    sweep = kinds.load(
        write(
            tmp_path,
            space={"optim.lr": {"loguniform": [1e-4, 1e-2]}, "batch.tokens_per_update": {"choice": [2048, 4096]}},
            search={"algorithm": "optuna", "num_samples": 4},
        )
    )
    found = kinds.kind_of(sweep).search(sweep, None, {})
    space, searcher = found.space, found.searcher
    assert isinstance(searcher, OptunaSearch)
    assert isinstance(space["trial"]["optim.lr"], tune.search.sample.Float)
    assert space["trial"]["batch.tokens_per_update"].categories == [2048, 4096]
    # what optuna proposes is resolved and validated inside the trial like any other point
    trial = search_space.resolve(sweep, {"optim.lr": 3e-3, "batch.tokens_per_update": 4096})
    assert trial.cfg.optim.lr == 3e-3 and trial.cfg.batch.tokens_per_update == 4096


def test_an_optuna_study_is_kept_where_optuna_dashboard_reads_it(tmp_path):
    """search.optuna_storage: the searcher's study lives in that database, named after the sweep
    and its MLflow parent run, and what it is told there `optuna.load_study` reads back."""
    import optuna

    from orchestrator.tracking import run_tags

    url = f"sqlite:///{tmp_path}/optuna.db"
    space = {"optim.lr": {"loguniform": [1e-4, 1e-2]}}
    sweep = kinds.load(write(tmp_path, space=space, search={"algorithm": "optuna", "optuna_storage": url}))
    runs = {"tags": {run_tags.PARENT_TAG: "0123456789abcdef"}}
    found = kinds.kind_of(sweep).search(sweep, None, runs)
    space, searcher = found.space, found.searcher
    assert searcher.set_search_properties(None, None, space)  # as Tune hands it the param space
    suggested = searcher.suggest("t1")
    searcher.on_trial_complete("t1", {sweep.search.metric: 2.5, **suggested})
    study = optuna.load_study(study_name=f"{sweep.name} 01234567", storage=url)
    (done,) = study.trials
    assert done.value == 2.5 and done.params["trial/optim.lr"] == suggested["trial"]["optim.lr"]


@pytest.mark.parametrize(
    "search,says",
    [
        ({"algorithm": "optuna", "optuna_storage": "optuna.db"}, "use a database URL"),
        ({"algorithm": "optuna", "optuna_storage": "redis://host"}, "use a database URL"),
        ({"algorithm": "random", "optuna_storage": "sqlite:///optuna.db"}, "only with search.algorithm: optuna"),
    ],
)
def test_optuna_storage_is_a_database_url_for_optuna_only(tmp_path, search, says):
    with pytest.raises(ConfigError, match=says):
        kinds.load(write(tmp_path, space={"optim.lr": {"loguniform": [1e-4, 1e-2]}}, search=search))


def test_trial_resources_follow_where_the_worker_runs(tmp_path):
    """A single-worker trial in local mode holds its worker's CPUs itself; a trial that starts a
    worker group (D > 1, or local_mode: false) holds only a fraction for waiting on it."""
    space = {"cluster.num_workers": {"grid": [1, 2]}, "cluster.cpus_per_worker": {"grid": [0.8]}}
    for local_mode, expected in [
        (True, [0.8, derived.TRIAL_DRIVER_CPUS]),
        (False, [derived.TRIAL_DRIVER_CPUS, derived.TRIAL_DRIVER_CPUS]),
    ]:
        sweep = kinds.load(write(tmp_path, space=space, local_mode=local_mode))
        trials = kinds.expand(sweep)
        assert [
            derived.trial_resources(kinds.kind_of(sweep).resolve(sweep, t.values).cfg, sweep.local_mode) for t in trials
        ] == [{"CPU": c} for c in expected]


def test_seeds_replicate_every_configuration(tmp_path):
    sweep = kinds.load(
        write(
            tmp_path,
            space={"optim.lr": {"grid": [1e-3, 3e-3]}},
            search={"seeds": 3},
            base={"config": TINY, "overrides": {"train.seed": 10}},
        )
    )
    trials = kinds.expand(sweep)
    assert [(t.cfg.optim.lr, t.cfg.train.seed) for t in trials] == [
        (lr, s) for lr in (1e-3, 3e-3) for s in (10, 11, 12)
    ]
    assert trials[1].name.endswith("seed=11") and len({t.name for t in trials}) == 6
    for body, key in [
        ({"search": {"seeds": 0}}, "search.seeds"),
        (
            {"search": {"seeds": 2, "algorithm": "optuna"}, "space": {"optim.lr": {"uniform": [1e-4, 1e-3]}}},
            "search.seeds",
        ),
        ({"search": {"seeds": 2}, "space": {"train.seed": {"grid": [1, 2]}}}, "search.seeds"),
    ]:
        with pytest.raises(ConfigError, match=key):
            kinds.load(write(tmp_path, **body))


def test_early_stopping_groups_share_batch_size_decay_shape_and_seed(tmp_path):
    space = {"batch.tokens_per_update": {"grid": [2048, 4096]}, "optim.lr": {"grid": [1e-3, 3e-3]}}
    sweep = kinds.load(write(tmp_path, space=space))
    assert search_space.comparison_keys(sweep) == ("batch.tokens_per_update",)
    assert search_space.lone_groups(sweep, kinds.expand(sweep)) == []
    sweep = kinds.load(
        write(tmp_path, space={**space, "schedule.decay": {"grid": ["cosine", "wsd"]}}, search={"seeds": 2})
    )
    keys = search_space.comparison_keys(sweep)
    assert keys == ("batch.tokens_per_update", "schedule.decay", "train.seed")
    trials = kinds.expand(sweep)
    groups = {search_space.comparison_group(keys, t.values) for t in trials}
    assert len(groups) == 2 * 2 * 2 and all(
        len([t for t in trials if search_space.comparison_group(keys, t.values) == g]) == 2 for g in groups
    )  # the two learning rates of each group
    one_per_batch = kinds.load(write(tmp_path, space={"batch.tokens_per_update": {"grid": [2048, 4096]}}))
    assert len(search_space.lone_groups(one_per_batch, kinds.expand(one_per_batch))) == 2


def test_a_ramp_axis_names_each_trial_by_its_ramp_and_groups_early_stopping_by_it(tmp_path):
    fixed = [{"from_tokens": 0, "tokens_per_update": 2048}]
    ramps = [fixed, [*fixed, {"from_tokens": 4096, "tokens_per_update": 4096}]]
    space = {"batch.ramp": {"grid": ramps}, "optim.lr": {"grid": [1e-3, 3e-3]}}
    sweep = kinds.load(write(tmp_path, space=space))
    trials = kinds.expand(sweep)
    assert [t.name.split(" lr=")[0] for t in trials] == ["B=2Ki", "B=2Ki", "B=2Ki>4Ki@4Ki", "B=2Ki>4Ki@4Ki"]
    assert [len(t.cfg.batch.ramp) for t in trials] == [1, 1, 2, 2]
    keys = search_space.comparison_keys(sweep)
    assert keys == ("batch.tokens_per_update", "batch.ramp")
    groups = [search_space.comparison_group(keys, t.values) for t in trials]
    assert groups[0] == groups[1] != groups[2] == groups[3]  # the lrs of one ramp compete, the ramps never
    assert search_space.lone_groups(sweep, trials) == []


BRACKET_BASE = {"config": TINY, "overrides": {"train.total_tokens": 1048576, "schedule.warmup_tokens": 0}}


def test_bracket_first_round_from_the_lr_grid_or_the_scaling_rule(tmp_path):
    """The first round: every batch size x group (the other grid axes) x initial lr x seed."""
    space = {
        "batch.tokens_per_update": {"grid": [2048, 8192]},
        "optim.lr": {"grid": [3e-3, 1e-3]},
        "schedule.decay": {"grid": ["wsd", "cosine"]},
    }
    sweep = kinds.load(write(tmp_path, base=BRACKET_BASE, space=space, search={"algorithm": "bracket", "seeds": 2}))
    trials = kinds.expand(sweep)
    assert [
        (t.cfg.batch.tokens_per_update, t.cfg.schedule.decay, t.cfg.optim.lr, t.cfg.train.seed) for t in trials
    ] == [(b, d, lr, s) for b in (2048, 8192) for d in ("wsd", "cosine") for lr in (1e-3, 3e-3) for s in (0, 1)]
    assert kinds.kind_of(sweep).bound(sweep) == 7 * 2 * 2 * 2  # max_lrs_per_batch x B x groups x seeds
    assert trials[1].name == "B=2Ki lr=1e-3 wu=0% wsd seed=1"
    rule = {"reference_tokens": 2048, "base_lr": 1e-3, "alpha": "sqrt"}
    sweep = kinds.load(
        write(
            tmp_path,
            base=BRACKET_BASE,
            space={"batch.tokens_per_update": {"grid": [2048, 8192]}},
            lr_scaling=rule,
            search={"algorithm": "bracket", "lr_step": 3},
        )
    )
    trials = kinds.expand(sweep)
    assert [t.cfg.batch.tokens_per_update for t in trials] == [2048] * 3 + [8192] * 3
    # the rule's guess at B, / step, x 1, x step: 1e-3 x (B / 2048)^0.5
    assert [t.cfg.optim.lr for t in trials] == pytest.approx([1e-3 / 3, 1e-3, 3e-3, 2e-3 / 3, 2e-3, 6e-3], rel=1e-5)


BRACKET = {"batch.tokens_per_update": {"grid": [2048, 4096]}, "optim.lr": {"grid": [1e-3, 2e-3, 4e-3]}}


@pytest.mark.parametrize(
    "search,space,lr_scaling,key,says",
    [
        ({"criterion": "best"}, BRACKET, None, "search.criterion", "final_loss, stable_loss, steps, both"),
        ({"criterion": "steps"}, BRACKET, None, "search.target_loss", "steps to this train loss"),
        ({"criterion": "both", "target_loss": -1.0}, BRACKET, None, "search.target_loss", "> 0"),
        ({"max_lrs_per_batch": 2}, BRACKET, None, "search.max_lrs_per_batch", ">= 3"),
        (
            {"max_lrs_per_batch": 3},
            {**BRACKET, "optim.lr": {"grid": [1, 2, 3, 4]}},
            None,
            "search.max_lrs_per_batch",
            "the 4 learning rates",
        ),
        ({"lr_step": 1}, BRACKET, None, "search.lr_step", "> 1"),
        ({"lr_step": 0.5}, BRACKET, None, "search.lr_step", "> 1"),
        ({}, {"optim.lr": BRACKET["optim.lr"]}, None, "space.batch.tokens_per_update", "a grid"),
        (
            {},
            {**BRACKET, "batch.tokens_per_update": {"choice": [2048, 4096]}},
            None,
            "space.batch.tokens_per_update",
            "a grid",
        ),
        ({}, {**BRACKET, "optim.lr": {"loguniform": [1e-4, 1e-2]}}, None, "space.optim.lr", "a grid of learning rates"),
        ({}, {**BRACKET, "optim.lr": {"grid": [0, 1e-3]}}, None, "space.optim.lr", "> 0"),
        ({}, {"batch.tokens_per_update": BRACKET["batch.tokens_per_update"]}, None, "space.optim.lr", "lr_scaling"),
        (
            {},
            {**BRACKET, "schedule.warmup_share": {"uniform": [0, 0.1]}},
            None,
            "space.schedule.warmup_share",
            "a grid",
        ),
        (
            {},
            {"batch.tokens_per_update": BRACKET["batch.tokens_per_update"]},
            {"reference_tokens": 2048, "base_lr": {"loguniform": [1e-4, 1e-2]}},
            "lr_scaling.base_lr",
            "a fixed number",
        ),
        (
            {},
            {"batch.tokens_per_update": BRACKET["batch.tokens_per_update"]},
            {"reference_tokens": 2048, "base_lr": 1e-3, "alpha": {"grid": [0.5, 1.0]}},
            "lr_scaling.alpha",
            "a fixed number",
        ),
    ],
)
def test_bad_bracket_sweep_files_exit_2_with_one_line(tmp_path, capsys, search, space, lr_scaling, key, says):
    from orchestrator.cli import main

    body = {"space": space, "search": {"algorithm": "bracket", **search}}
    if lr_scaling:
        body["lr_scaling"] = lr_scaling
    path = write(tmp_path, **body)
    with pytest.raises(ConfigError) as info:
        kinds.load(path)
    assert info.value.key == key
    assert main(["sweep", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and (f"{key}: got" in err[0] or f"{key}: missing" in err[0]), err
    assert says in err[0], err


# ---------------------------------------------------------------- branch studies

BRANCH_BASE = {  # SGD: branches of a few updates are a layout, not the measurement AdamW needs them long for
    "config": TINY,
    "overrides": {"train.total_tokens": 131072, "batch.tokens_per_update": 4096, "optim.name": "sgd"},
}


def test_a_branch_study_lays_out_a_branch_per_point_and_factor(tmp_path):
    """Every (branch point, factor): the base config with a ramp to k x B at the point, the lr
    scaled by k^alpha from there, stopping `tokens` later; the base trial keeps its checkpoints."""
    from orchestrator.core import config
    from orchestrator.studies import branch_study

    branch = {"at_tokens": [65536, 16384], "factors": [1, 2, 4], "tokens": 16384, "lr_scaling": "sqrt"}
    sweep = kinds.load(write(tmp_path, base=BRANCH_BASE, branch={**branch, "from": None}))
    trials = kinds.expand(sweep)
    assert [t.name for t in trials] == [f"at={a} B={b}" for a in ("16Ki", "64Ki") for b in ("4Ki", "8Ki", "16Ki")]
    for t, (at, k) in zip(trials, [(a, k) for a in (16384, 65536) for k in (1, 2, 4)]):
        c = t.cfg
        assert [(r.from_tokens, r.tokens_per_update) for r in c.batch.ramp] == [(0, 4096), (at, k * 4096)]
        assert c.train.stop_at_tokens == at + 16384 and c.train.total_tokens == 131072
        (_, second) = derived.batch_segments(c)[:2]
        assert second.lr_factor == pytest.approx(k**0.5)
    base = search_space.resolve(sweep, branch_study.base_values(sweep.branch, config.load(TINY, sweep.base_overrides)))
    assert base.name.startswith("base B=4Ki") and base.cfg.train.checkpoint_at_tokens == [16384, 65536]
    assert base.cfg.train.keep_checkpoints >= 2 + 131072 // base.cfg.train.checkpoint_every_tokens


def test_an_absolute_tolerance_is_a_loss_difference_and_merrills_rule_an_option(tmp_path):
    branch = {"at_tokens": [16384], "tokens": 16384, "tolerance": 1.5, "tolerance_kind": "absolute"}
    sweep = kinds.load(write(tmp_path, base=BRANCH_BASE, branch={**branch, "compare": "every_smaller"}))
    assert (sweep.branch.tolerance, sweep.branch.tolerance_kind, sweep.branch.compare) == (
        1.5,
        "absolute",
        "every_smaller",
    )
    assert kinds.load(write(tmp_path, base=BRANCH_BASE, branch=branch)).branch.compare == "reference"


@pytest.mark.parametrize(
    "branch, base, key, says",
    [
        ({"at_tokens": [10000]}, {}, "branch.at_tokens", "not a whole number of the base's updates of 4,096 tokens"),
        ({"tokens": 12288}, {}, "branch.tokens", "use a multiple of 16,384"),
        ({"at_tokens": [122880]}, {}, "branch.tokens", "raise it to at least 139,264"),
        ({"factors": [2, 4]}, {}, "branch.factors", "needs 1"),
        ({"at_tokens": []}, {}, "branch.at_tokens", "missing"),
        ({"tolerance": 1.5}, {}, "branch.tolerance", "(0, 1)"),
        ({"tolerance": 0.0, "tolerance_kind": "absolute"}, {}, "branch.tolerance", "> 0"),
        ({"tolerance_kind": "percent"}, {}, "branch.tolerance_kind", "relative, absolute"),
        ({"compare": "all"}, {}, "branch.compare", "reference, every_smaller"),
        ({"lr_scaling": "cubic"}, {}, "branch.lr_scaling", "'sqrt'"),
        ({"every": 2}, {}, "branch.every", "unknown key"),
        ({}, {"space": {"optim.lr": {"grid": [1e-3, 2e-3]}}}, "space", "not optim.lr"),
        ({}, {"scheduler": {"type": "asha", "grace_period_tokens": 4096}}, "branch", "no scheduler"),
    ],
)
def test_a_branch_study_that_cannot_run_names_its_key(tmp_path, branch, base, key, says):
    good = {"at_tokens": [16384], "factors": [1, 2, 4], "tokens": 16384}
    with pytest.raises(ConfigError) as info:
        kinds.expand(kinds.load(write(tmp_path, base=BRANCH_BASE, branch={**good, **branch}, **base)))
    assert info.value.key == key and says in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "optim, tokens, refused",
    [
        ({}, 16384 * 19, "19 updates at factor 4 (16,384 tokens each), fewer than the 20"),
        ({}, 16384 * 20, None),
        ({"optim.beta2": 0.9}, 16384 * 10, None),  # 1 / (1 - 0.9) = 10 updates
        ({"optim.beta2": 0.9}, 16384 * 9, "use at least 163,840"),
        # the half-life form holds in tokens, so the branch at factor 4 trains at beta2 =
        # 0.5 ** (16,384 / 28,385) = 0.670: 3.03 updates -> 4 (at the base's 0.905 it would be 11)
        ({"optim.beta2_half_life_tokens": 28385}, 16384 * 3, "fewer than the 4"),
        ({"optim.beta2_half_life_tokens": 28385}, 16384 * 4, None),
        ({"optim.name": "sgd"}, 16384, None),  # no second moment: any whole number of updates
    ],
)
def test_an_adamw_branch_is_long_enough_for_its_second_moment_to_settle(tmp_path, optim, tokens, refused):
    """AdamW's second moment forgets the base's batch over 1 / (1 - beta2) updates (beta2 0.95:
    20) of the largest factor's beta2; a branch shorter than that at its largest factor measures the
    change, and is refused."""
    from orchestrator.studies.branch_study import settling_updates

    assert [settling_updates(b) for b in (0.95, 0.9, 0.5 ** (4096 / 28385), 0.5)] == [20, 10, 11, 2]
    base = {"config": TINY, "overrides": {"train.total_tokens": 524288, "batch.tokens_per_update": 4096, **optim}}
    branch = {"at_tokens": [16384], "factors": [1, 2, 4], "tokens": tokens}
    expand = lambda: kinds.expand(kinds.load(write(tmp_path, base=base, branch=branch)))  # noqa: E731
    if refused is None:
        assert len(expand()) == 3
        return
    with pytest.raises(ConfigError) as info:
        expand()
    assert info.value.key == "branch.tokens" and refused in str(info.value), str(info.value)


def test_a_trial_name_states_its_warmup_as_it_is(tmp_path):
    """8,192 of 327,680 tokens is 2.5 %, which the name said as 2 %."""
    base = {"config": TINY, "overrides": {"train.total_tokens": 327680, "schedule.warmup_tokens": 8192}}
    sweep = kinds.load(write(tmp_path, base=base, space={"optim.lr": {"grid": [1e-3]}}))
    assert kinds.expand(sweep)[0].name.endswith("wu=2.5%")
