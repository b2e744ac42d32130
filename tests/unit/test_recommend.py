"""What to run (orchestrator/analysis/launch_choice.py) and the file that launches it
(orchestrator/reporting/recommended.py): the B_opt rule on hand-computed rows, the lr at that batch
size, and a recommended.yaml that `orchestrator plan` accepts, made from a run's params as MLflow
holds them."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from orchestrator import cli
from orchestrator.analysis import launch_choice
from orchestrator.core import config, derived
from orchestrator.driver import run_life
from orchestrator.reporting import recommended
from tests.conftest import TINY

ROWS = [  # final losses at the best lr per batch size; 1,024 is 0.3 % over the best, 2,048 1 %
    {"batch": 256, "final_loss": 2.000, "lr": 1.0e-3, "run_id": "r256"},
    {"batch": 512, "final_loss": 2.002, "lr": 1.4e-3, "run_id": "r512"},
    {"batch": 1024, "final_loss": 2.006, "lr": 2.0e-3, "run_id": "r1024"},
    {"batch": 2048, "final_loss": 2.020, "lr": 2.8e-3, "run_id": "r2048"},
]


def test_the_batch_is_b_opt_rounded_down_to_whole_sequences_and_its_lr_interpolated():
    rec = launch_choice.for_sweep(ROWS, lr_law=None, unit=64)
    threshold = 2.000 * 1.005  # the crossing of 1.005 x the best, linear in B between 1,024 and 2,048
    b_opt = 1024 + (threshold - 2.006) / (2.020 - 2.006) * 1024
    assert rec.b_opt.batch == pytest.approx(b_opt) and rec.b_opt.status == "resolved"
    assert rec.tokens_per_update == int(b_opt // 64) * 64 == 1280
    share = math.log(1280 / 1024) / math.log(2)
    assert rec.lr == pytest.approx(math.exp(math.log(2.0e-3) + share * math.log(2.8e-3 / 2.0e-3)))
    assert rec.lr_from == "interpolated" and rec.template_run == "r1024"
    assert rec.overrides() == {"batch.tokens_per_update": 1280, "optim.lr": rec.lr}
    law = launch_choice.for_sweep(ROWS, lr_law=(5e-5, 0.5), unit=64)
    assert law.lr == pytest.approx(5e-5 * 1280**0.5) and law.lr_from == "power law"


def test_every_batch_within_the_tolerance_recommends_the_largest_and_says_it_is_a_bound():
    flat = [{**r, "final_loss": 2.0 + 0.001 * i} for i, r in enumerate(ROWS)]
    rec = launch_choice.for_sweep(flat, lr_law=None, unit=64)
    assert rec.b_opt.status == "above" and rec.tokens_per_update == 2048 and rec.lr == 2.8e-3
    assert any("larger batch sizes were not tried" in s for s in rec.rule)
    assert launch_choice.for_sweep([{"batch": 256, "final_loss": None}], None, 64) is None


def params_of(cfg) -> dict:
    """A run's params as MLflow holds them: the resolved config flattened, every value as text."""
    return {k: str(v) for k, v in run_life.run_params(cfg).items()}


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["data.sources=[{name: a, kind: prose, weight: 2}, {name: b, kind: code}]", "schedule.decay=cosine"],
        ["batch.ramp=[{from_tokens: 0, tokens_per_update: 1024}, {from_tokens: 8192, tokens_per_update: 2048}]"],
    ],
)
def test_a_runs_params_read_back_are_its_config(overrides):
    """Every schema key comes back with its type; the derived split b x A is logged resolved."""
    cfg = config.load(TINY, overrides)
    data = config.from_params(params_of(cfg))
    plan = derived.batch_plan(cfg)
    split = dataclasses.replace(
        cfg.batch, micro_batch_size=plan.micro_batch_size, grad_accum_steps=plan.grad_accum_steps
    )
    assert config.from_dict(data) == dataclasses.replace(cfg, batch=split)


def test_recommended_yaml_from_a_runs_params_passes_plan(tmp_path, capsys):
    """A branch run's params (a checkpoint, a stop, its own micro-batch split) with the
    recommendation on top: the file loads as plan loads it, with B and lr set and the rest reset."""
    run = config.load(TINY, ["batch.tokens_per_update=2048", "train.stop_at_tokens=16384"])
    path = recommended.write(
        tmp_path / recommended.FILE, params_of(run), {"batch.tokens_per_update": 1280, "optim.lr": 1.7e-3}, ["why"]
    )
    assert cli.main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1,280" in out
    cfg = config.load(path)
    assert (cfg.batch.tokens_per_update, cfg.optim.lr, cfg.train.stop_at_tokens) == (1280, 1.7e-3, None)
    assert cfg.model == run.model and cfg.data == run.data and cfg.schedule == run.schedule
    assert path.read_text().startswith("# Written by `orchestrator report`")
    assert yaml.safe_load(path.read_text())["batch"]["micro_batch_size"] == "auto"


def test_a_report_on_a_demo_shaped_sweep_writes_a_recommended_yaml_that_plan_accepts(tmp_path, capsys):
    """A known-truth sweep whose runs logged the tiny config's params (as a demo's do): the report's
    answer names a batch size and lr, recommended.yaml holds them and `orchestrator plan` takes it;
    the batch size is B_opt rounded down to whole sequences, its lr between the best lrs of the
    batch sizes tried around it."""
    from orchestrator.analysis import sweep_analysis
    from orchestrator.reporting import report_files
    from tests.known_truth import World, factor_grid

    world = World(max_points=200, draw=4)
    trials = world.trials(world.grid(batches=(256, 512, 1024, 2048), lrs=factor_grid(0.002, 0.032), seeds=2))
    for t in trials:
        cfg = config.load(TINY, [f"{k}={v}" for k, v in t.params.items()])
        t.params = {**params_of(cfg), **t.params}
    answer = sweep_analysis.analyse(trials)
    rec = answer.recommendation
    unit = 128  # tiny: seq_len 128, one worker
    assert rec.tokens_per_update == max(unit, int(rec.b_opt.batch // unit) * unit)
    lrs = {r.batch: r.lr for r in answer.best_lr}
    below = max(b for b in lrs if b <= rec.tokens_per_update)
    above = min((b for b in lrs if b >= rec.tokens_per_update), default=below)
    assert min(lrs[below], lrs[above]) <= rec.lr * (1 + 1e-9) and rec.lr <= max(lrs[below], lrs[above]) * (1 + 1e-9)

    written = report_files.write_report(trials, answer, "demo-shaped", tmp_path)
    path = tmp_path / recommended.FILE
    assert path in written
    assert cli.main(["plan", str(path)]) == 0
    cfg = config.load(path)
    assert (cfg.batch.tokens_per_update, cfg.optim.lr) == (rec.tokens_per_update, rec.lr)
    assert f"{rec.tokens_per_update:,}" in capsys.readouterr().out


def test_a_sweep_whose_loss_rises_on_both_sides_recommends_its_tolerance_point_and_shows_the_tradeoff(tmp_path):
    """One rung of tests/basin_truth.py as a single sweep: B* from its own loss surface, the largest
    batch within the tolerance (rounded down), both with their lr from the sweep's one lr law, and
    the trade-off near the top of the summary; the truth's penalty there is near the tolerance."""
    from orchestrator.analysis import sweep_analysis
    from orchestrator.reporting import report_files
    from tests.basin_truth import BasinWorld

    world = BasinWorld()
    n, d = world.rungs()[4]
    trials = world.trials([(n, d)])
    answer = sweep_analysis.analyse(trials, loss_tolerance=0.004)
    rec = answer.recommendation
    found = rec.found
    assert rec.tolerance == 0.004 and "largest batch whose predicted penalty" in rec.point
    b_star = found.loss_optimal.tokens_per_update
    assert b_star.value == pytest.approx(world.b_star(n, d), rel=0.1)
    assert b_star.interval[0] < b_star.value < b_star.interval[1]
    point = found.tolerance_point.tokens_per_update.value
    assert rec.tokens_per_update == int(point) and rec.tokens_per_update < point + 1
    assert float(world.penalty(n, d, rec.tokens_per_update)) == pytest.approx(0.004, abs=0.001)
    rows = [
        {"batch": r.batch, "final_loss": r.final_loss, "lr": r.lr, "run_id": r.run_id} for r in answer.best_per_batch
    ]
    assert rec.lr == launch_choice.lr_at(rec.tokens_per_update, rows, None)[0]  # one lr law for every point
    assert found.loss_optimal.lr.value == launch_choice.lr_at(b_star.value, rows, None)[0]
    j = rec.to_json()
    assert j["tolerance"] == 0.004 and len(j["tradeoff"]) == 9
    assert set(j["loss_optimal"]) == {"tokens_per_update", "lr", "predicted_loss"}
    for key in ("predicted_loss_penalty", "steps_saved", "tolerance_point"):
        assert set(j[key]) == {"value", "interval"}

    report_files.write_report(trials, answer, "one-rung", tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert (tmp_path / "tradeoff.png").stat().st_size > 10_000
    assert summary.index("## What to run") < summary.index("![tradeoff.png]") < summary.index("## Critical batch size")
    assert summary.count("![tradeoff.png]") == 1


def test_recommended_yaml_names_no_path_of_the_machine_that_wrote_it_and_trains_into_its_own_folder(
    tmp_path, monkeypatch
):
    """A sweep's run logs its store and storage as absolute paths of the machine that ran it (and
    its data's, where it had files): the file takes the default store and storage, which resolve in
    whatever folder it is trained from, and its header names what to set for a cluster and the
    keys that still point at the writer's files."""
    sweep_folder = tmp_path / "sweep-machine"
    sweep_folder.mkdir()
    monkeypatch.chdir(sweep_folder)
    (sweep_folder / "shards").mkdir()
    run = config.load(TINY, ["data.shard_dir=shards"])
    run_life.resolve_paths(run)  # as the sweep's trial did: absolute paths on that machine
    assert str(sweep_folder) in run.tracking.uri and str(sweep_folder) in run.train.storage_path
    path = recommended.write(tmp_path / recommended.FILE, params_of(run), {"optim.lr": 1e-3}, ["why"])
    text = path.read_text()
    body = text.split("\n", 1)[1].split("\nbatch:")[1]
    assert str(sweep_folder / "mlflow.db") not in text and str(sweep_folder / "runs") not in text
    assert "tracking.uri and train.storage_path are the defaults" in text
    assert "point them at yours: data.shard_dir" in text and str(sweep_folder / "shards") in body

    elsewhere = tmp_path / "another-folder"
    elsewhere.mkdir()
    copied = elsewhere / recommended.FILE
    copied.write_text(text)
    monkeypatch.chdir(elsewhere)
    cfg = config.load(copied)
    run_life.resolve_paths(cfg)
    assert cfg.tracking.uri == f"sqlite:///{elsewhere / 'mlflow.db'}"
    assert cfg.train.storage_path == str(elsewhere / "runs")
