"""A ladder's rungs as a sweep lays them out (orchestrator/studies/ladder_plan.py): N from the
model's own count, budgets from tokens per parameter in whole updates of the largest batch,
smallest compute first, the rung's values in every bracket group; and what each rung holds of the
base (warmup share, AdamW's constants in tokens)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.core import config, derived, sweep_file
from orchestrator.core.errors import ConfigError
from orchestrator.studies import kinds, ladder_plan
from orchestrator.tracking.run_tags import RUNG_TAG
from tests.conftest import ROOT, TINY, write_sweep

MODELS = [{"model.d_model": 64, "model.n_layers": 2}, {"model.d_model": 96, "model.n_layers": 3}]
SPACE = {"batch.tokens_per_update": {"grid": [1024, 2048, 4096]}, "optim.lr": {"grid": [1e-3, 2e-3, 4e-3]}}
SEARCH = {"algorithm": "bracket", "max_concurrent": 2}


def ladder_sweep(tmp_path, **ladder):
    body = {"models": MODELS, "tokens_per_param": [0.5, 2], "target": {"params": 1.0e7, "tokens": 2.0e8}, **ladder}
    return kinds.load(write_sweep(tmp_path, ladder=body, space=SPACE, search=SEARCH))


def n_of(model):
    from orchestrator.driver import run_life

    return run_life.run_params(config.load(TINY, [f"{k}={v}" for k, v in model.items()]))["model.params"]


def test_rungs_are_models_times_budgets_in_whole_largest_batches_smallest_compute_first(tmp_path):
    sweep = ladder_sweep(tmp_path)
    rungs = ladder_plan.rungs(sweep)
    expected = sorted(
        ((n_of(m), max(4096, round(r * n_of(m) / 4096) * 4096)) for m in MODELS for r in (0.5, 2)),
        key=lambda nd: nd[0] * nd[1],
    )
    assert [(r.params, r.tokens) for r in rungs] == expected
    assert all(r.tokens % 4096 == 0 for r in rungs) and len({r.tokens / r.params for r in rungs}) > 1
    groups = kinds.kind_of(sweep).brackets(sweep)
    assert len(groups) == 4 * 3  # rungs x batch sizes, each with the first round's lrs
    assert {g[0]["train.total_tokens"] for g in groups} == {r.tokens for r in rungs}
    first = kinds.expand(sweep)[0]
    assert first.name.startswith("d_model=64 n_layers=2 D=") and first.cfg.train.total_tokens == rungs[0].tokens


def test_a_target_given_by_its_model_is_its_model_params(tmp_path):
    target = {"overrides": {"model.d_model": 192, "model.n_layers": 6}, "tokens": 5.0e8}
    n, d, model = ladder_plan.target(ladder_sweep(tmp_path, target=target))
    assert (n, d, model) == (n_of(target["overrides"]), 5.0e8, target["overrides"])


def test_report_reads_the_ladder_of_a_sweep_file_as_the_sweep_does():
    """`report FILE` and `report NAME` read the sweep file unchecked (sweep_file.load(check=False),
    read_recorded): the ladder's target and tolerance must come through, or the report of a
    ladder named by its file or its name has no target while the end of the sweep has one."""
    path = ROOT / "conf" / "sweep" / "ladder.yaml"
    checked = kinds.load(path)
    assert sweep_file.load(path, check=False).ladder == checked.ladder
    assert sweep_file.read_recorded(path.read_text(), path).ladder == checked.ladder


def test_report_by_name_finds_the_targets_model_params_from_the_runs(tmp_path, monkeypatch):
    """`report NAME` reads the sweep file its parent run recorded, whose base config is a path
    relative to where the sweep ran (conf/sweep/ladder.yaml: ../train/tiny.yaml), not to here: the
    target model's N then comes from a run's logged config, and equals what the file gives."""
    from orchestrator.analysis.trials import Trial
    from orchestrator.driver import run_life
    from orchestrator.reporting import report

    path = ROOT / "conf" / "sweep" / "ladder.yaml"
    expected = ladder_plan.target(kinds.load(path))
    monkeypatch.chdir(tmp_path)
    recorded = sweep_file.read_recorded(path.read_text(), Path(path.name))
    assert not recorded.base_config.exists()
    logged = {k: str(v) for k, v in run_life.run_params(config.load(TINY)).items()}
    run = Trial(run_id="r", name="r", status="FINISHED", params=logged, train=[(1, 1.0)])
    found = report.ladder_request(recorded, trials=[run]).target
    assert (found.params, found.tokens) == expected[:2]


def test_each_rung_holds_the_bases_warmup_share_and_adamws_constants_in_tokens(tmp_path):
    sweep = ladder_sweep(tmp_path)
    base = config.load(sweep.base_config, sweep.base_overrides)
    rung = ladder_plan.rungs(sweep)[-1]
    trial = kinds.kind_of(sweep).resolve(sweep, {**rung.values, "batch.tokens_per_update": 4096, "optim.lr": 3e-3})
    c = trial.cfg
    share = base.schedule.warmup_tokens / base.train.total_tokens
    assert c.schedule.warmup_tokens == round(share * rung.tokens)
    # at the base's own batch size, budget and lr the token forms give back the base's per-step values
    same = config.load(
        sweep.base_config,
        sweep.base_overrides
        + [
            f"optim.beta2_half_life_tokens={c.optim.beta2_half_life_tokens}",
            f"optim.weight_decay_timescale_share={c.optim.weight_decay_timescale_share}",
        ],
    )
    assert derived.adamw_constants(same).beta2 == pytest.approx(derived.adamw_constants(base).beta2)
    assert derived.adamw_constants(same).weight_decay == pytest.approx(derived.adamw_constants(base).weight_decay)
    # the rung's own budget: the weight decay per step scales as B / D (lr x wd x D / B held)
    got = derived.adamw_constants(c).weight_decay
    assert got == pytest.approx(derived.adamw_constants(base).weight_decay * base.train.total_tokens / rung.tokens)
    steps_sweep = ladder_sweep(tmp_path, hold="steps")
    steps = kinds.kind_of(steps_sweep).resolve(steps_sweep, {**rung.values, "optim.lr": 3e-3}).cfg
    assert steps.optim.beta2_half_life_tokens is None and math.isclose(
        derived.adamw_constants(steps).beta2, derived.adamw_constants(base).beta2
    )


@pytest.mark.parametrize(
    "ladder, key",
    [
        ({"rungs": [{"overrides": {"model.d_model": 64}, "total_tokens": 65536}]}, "ladder"),  # both ways
        ({"tokens_per_param": None}, "ladder.tokens_per_param"),
        ({"target": {"params": 1.0e7}}, "ladder.target"),
        ({"target": {"params": 1.0e7, "tokens": 2.0e8, "overrides": {"model.d_model": 64}}}, "ladder.target"),
    ],
)
def test_a_ladder_that_cannot_run_names_its_key(tmp_path, ladder, key):
    with pytest.raises(ConfigError) as info:
        ladder_sweep(tmp_path, **{k: v for k, v in ladder.items()})
    assert info.value.key == key, str(info.value)


def test_a_ladder_is_a_bracket_search(tmp_path):
    body = {"models": MODELS, "tokens_per_param": [1], "target": {"params": 1.0e7, "tokens": 2.0e8}}
    with pytest.raises(ConfigError) as info:
        kinds.load(write_sweep(tmp_path, ladder=body, space=SPACE))
    assert info.value.key == "ladder" and "bracket" in str(info.value)


def test_each_ladder_trial_is_tagged_with_its_rung_and_a_plain_sweeps_are_not(tmp_path):
    sweep = ladder_sweep(tmp_path)
    for rung in ladder_plan.rungs(sweep):
        trial = kinds.kind_of(sweep).resolve(sweep, {**rung.values, "batch.tokens_per_update": 2048, "optim.lr": 3e-3})
        assert ladder_plan.rung_tags(sweep, trial.cfg) == {RUNG_TAG: rung.label}
    assert rung.label == f"N={rung.params / 1e3:.3g}k D={rung.tokens / 1e3:.3g}k"  # the tiny models' sizes
    plain = kinds.load(write_sweep(tmp_path, space=SPACE, search=SEARCH))
    assert ladder_plan.rung_tags(plain, config.load(TINY)) == {}


def test_the_shipped_ladder_is_3_sizes_by_3_budgets_with_a_target_4_to_10x_its_largest_rung():
    """conf/sweep/ladder.yaml: the CPU-sized ladder docs/ladders.md runs (its dry run lists it)."""
    sweep = kinds.load(ROOT / "conf" / "sweep" / "ladder.yaml")
    rungs = ladder_plan.rungs(sweep)
    assert len(rungs) == 9 and len({r.params for r in rungs}) == 3
    assert len({round(r.tokens / r.params, 1) for r in rungs}) >= 3  # varied D/N: N and D told apart
    n, d, model = ladder_plan.target(sweep)
    assert 4 <= 6 * n * d / rungs[-1].compute <= 10 and model
    # the tightest trial: the smallest rung's warmup share of its budget at the largest batch size
    tightest = kinds.kind_of(sweep).resolve(
        sweep, {**rungs[0].values, "batch.tokens_per_update": 2048, "optim.lr": 1e-3}
    )
    assert tightest.cfg is not None, tightest.problem


@pytest.mark.parametrize(
    "extra, key, words",
    [
        ({"scheduler": {"type": "asha", "grace_period_tokens": 4096}}, "ladder", "no scheduler"),
        ({"search": {**SEARCH, "algorithm": "grid"}}, "ladder", "search.algorithm bracket"),
        ({"branch": {"at_tokens": [4096], "tokens": 4096}}, "ladder", "no branch"),
        ({"loss_tolerance": 0.01}, "loss_tolerance", "ladder.tolerance"),
    ],
)
def test_a_ladder_refuses_another_search_a_scheduler_a_branch_and_a_single_sweeps_tolerance(
    tmp_path, extra, key, words
):
    body = {"models": MODELS, "tokens_per_param": [0.5, 2], "target": {"params": 1.0e7, "tokens": 2.0e8}}
    sections = {"ladder": body, "space": SPACE, "search": SEARCH, **extra}
    with pytest.raises(ConfigError) as refused:
        kinds.load(write_sweep(tmp_path, **sections))
    assert refused.value.key == key and words in refused.value.message
