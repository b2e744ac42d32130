"""A ladder through the report (orchestrator/reporting/report_ladder.py): `orchestrator report DIR`
on the tables of a known-truth ladder (tests/ladder_truth.py) with a target writes report.json's
`ladder` as the analysis gives it in memory, one figure per law, the ladder's lines in the summary
and a recommended.yaml that `orchestrator plan` accepts; the target from the command line over the
sweep file's (bad targets: test_hostile_inputs.py)."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from orchestrator import cli
from orchestrator.analysis import ladder, tables
from orchestrator.core import config, ladder_target
from orchestrator.core.errors import ConfigError
from orchestrator.reporting import report_ladder
from tests.known_truth import write_tables
from tests.ladder_truth import WORLDS

WORLD = WORLDS["power-law"].with_(max_points=30, evals=4)  # fewer points per curve: the same optima
TARGET = (WORLD.target_params, WORLD.target_tokens)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The world's trials.csv and curves.csv, as a trainer writes them."""
    return write_tables(*WORLD.tables(), tmp_path_factory.mktemp("ladder-tables"))


@pytest.fixture(scope="module")
def report(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "ladder"
    argv = ["report", str(folder), "--out", str(out)]
    code = cli.main(argv + ["--target-params", str(TARGET[0]), "--target-tokens", str(TARGET[1])])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def in_memory(folder):
    """The same tables analysed directly: what the report must have written."""
    return ladder.analyse(tables.read(folder), TARGET)


def test_report_json_holds_the_ladder_the_analysis_gives(report, in_memory):
    got = json.loads((report / "report.json").read_text())["ladder"]
    expected = json.loads(json.dumps(ladder.to_json(in_memory)))
    assert got == expected
    assert [law["name"] for law in got["laws"]] == ["b_opt", "b_crit", "lr_opt"]
    assert len(got["rungs"]) == 9 and {"params", "tokens", "b_opt", "b_crit", "lr_opt", "final_loss"} <= set(
        got["rungs"][0]
    )
    rec = got["recommendation"]
    assert (rec["params"], rec["tokens"]) == TARGET
    for key in ("tokens_per_update", "lr", "warmup_tokens"):
        low, high = rec[key]["interval"]
        assert low <= rec[key]["value"] <= high
    lr_law = next(law for law in got["laws"] if law["name"] == "lr_opt")
    assert set(lr_law["exponents"]) == {"N", "D"} and lr_law["backtest"]["held"] is True


def test_the_summary_prints_the_ladder_and_draws_one_figure_per_law(report, in_memory):
    summary = (report / "summary.md").read_text()
    for line in ladder.lines(in_memory):
        assert line in summary
    for name in ("b_opt", "b_crit", "lr_opt"):
        assert (report / report_ladder.FIGURES[name]).stat().st_size > 10_000
        assert f"![{report_ladder.FIGURES[name]}]" in summary


def test_recommended_yaml_is_the_targets_numbers_and_plan_accepts_it(report, in_memory, capsys):
    path = report / "recommended.yaml"
    cfg = config.load(path)
    rec = in_memory.recommendation
    unit = cfg.data.seq_len * cfg.cluster.num_workers
    assert cfg.batch.tokens_per_update % unit == 0
    assert abs(cfg.batch.tokens_per_update - rec.tokens_per_update.value) <= unit / 2
    assert cfg.optim.lr == pytest.approx(rec.lr.value)  # no B term in this world: the lr as predicted
    assert cfg.train.total_tokens == int(TARGET[1])
    assert cfg.schedule.warmup_tokens == round(rec.warmup_tokens.value)
    # The world's warmup share (3% of each rung's budget), carried to the target's budget.
    assert cfg.schedule.warmup_tokens == pytest.approx(WORLD.warmup_share * TARGET[1], rel=1e-3)
    header = path.read_text().split("\nbatch:")[0]
    assert "cluster.num_workers and batch.micro_batch_size are left for your cluster" in header
    assert yaml.safe_load(path.read_text())["batch"]["micro_batch_size"] == "auto"
    assert cli.main(["plan", str(path)]) == 0
    assert f"{cfg.batch.tokens_per_update:,}" in capsys.readouterr().out


def test_each_laws_line_ends_at_its_prediction_at_the_target(in_memory):
    for law in in_memory.laws:
        line = ladder.along(in_memory, law.name, steps=5)
        first, last = in_memory.rungs[0], line[-1]
        assert (line[0][0], line[0][1]) == pytest.approx((first.params, first.tokens))
        assert (last[0], last[1]) == pytest.approx(TARGET)
        assert last[2].value == pytest.approx(law.prediction.value, rel=1e-9)
        assert last[2].interval == pytest.approx(law.prediction.interval, rel=1e-9)


def test_without_a_target_the_laws_are_fitted_and_nothing_is_recommended(folder, tmp_path, capsys):
    trials = tables.read(folder)
    result = report_ladder.analyse(trials, report_ladder.Request())
    assert result.recommendation is None and all(law.prediction is None for law in result.laws)
    assert all(law.status == "fitted" for law in result.laws)
    assert report_ladder.write_recommended(result, trials, None, tmp_path) is None
    assert "no target" in capsys.readouterr().out and not (tmp_path / "recommended.yaml").exists()
    single = [t for t in trials if (t.number("model.params"), t.number("train.total_tokens")) == WORLD.rungs()[0]]
    assert report_ladder.analyse(single) is None  # one rung: a single sweep, no ladder part


def test_a_target_within_the_rungs_is_refused_in_one_line_before_the_analysis(folder, tmp_path, capsys):
    """--target-params / --target-tokens at or below the largest rung's compute: no extrapolation to
    make, so exit 2 naming the flags, and no folder written (was: a report recommending for it)."""
    (n, d) = max(WORLD.rungs(), key=lambda rung: rung[0] * rung[1])
    out = tmp_path / "out"
    argv = ["report", str(folder), "--out", str(out), "--target-params", str(n), "--target-tokens", str(d / 2)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--target-params" in err[0] and "largest rung" in err[0], err
    assert not out.exists()


def test_the_command_lines_target_is_over_the_sweep_files():
    from_file = ladder_target.Target(2.0e6, 4.0e7, {"model.d_model": 256})
    assert ladder_target.with_options(from_file) == from_file
    tokens_only = ladder_target.with_options(from_file, tokens=8.0e7)
    assert tokens_only == ladder_target.Target(2.0e6, 8.0e7, {"model.d_model": 256})  # the same model
    assert ladder_target.with_options(from_file, params=3.0e6) == ladder_target.Target(3.0e6, 4.0e7, None)
    assert ladder_target.with_options(None, 1e6, 1e7) == ladder_target.Target(1e6, 1e7, None)
    with pytest.raises(ConfigError, match="--target-params"):
        ladder_target.with_options(None, tokens=1e7)
    with pytest.raises(ConfigError, match="--target-params"):
        ladder_target.with_options(None, params=math.inf, tokens=1e7)


def test_a_sweep_files_target_and_tolerance_reach_the_report(tmp_path):
    from orchestrator.reporting import report, report_inputs
    from tests.unit.test_ladder_plan import ladder_sweep, n_of

    model = {"model.d_model": 128, "model.n_layers": 4}
    sweep = ladder_sweep(tmp_path, target={"overrides": model, "tokens": 2.0e8}, tolerance=0.01)
    request = report.ladder_request(sweep)
    assert request.target == ladder_target.Target(float(n_of(model)), 2.0e8, model)
    assert report.ladder_request(sweep, params=5.0e6).target == ladder_target.Target(5.0e6, 2.0e8, None)
    # The tolerance is one of the analysis settings: ladder.tolerance, --loss-tolerance over it.
    settings = report_inputs.settings(sweep, "the file")
    assert settings.options["loss_tolerance"] == 0.01 and settings.origin["loss_tolerance"] == "the file"
    settings = report_inputs.settings(sweep, "the file", loss_tolerance=0.002)
    assert settings.options["loss_tolerance"] == 0.002 and settings.origin["loss_tolerance"] == "command line"


def test_a_later_sweep_reads_the_finished_runs_it_reused_as_its_own(tmp_path):
    """A re-run sweep (a ladder with a rung added) reuses a finished run of an identical config
    (found by its config digest, tagged with the new parent) instead of running it again; the new
    parent's trials are its children and those runs (report_inputs.trial_runs), and the bracket
    search's steps criterion finds them by the same tag."""
    from orchestrator.reporting import report_inputs
    from orchestrator.studies import bracket_search
    from orchestrator.tracking import run_tags
    from orchestrator.tracking.store import Store
    from tests.conftest import sqlite_store

    uri = sqlite_store(tmp_path)
    store = Store(uri, "ladders")
    old_parent, new_parent = (store.create_run(f"sweep {i}", {run_tags.ROLE_TAG: "sweep"}) for i in (1, 2))
    digest = {run_tags.DIGEST_TAG: "0123456789abcdef"}
    finished = store.create_run("d_model=32 D=40Ki B=256", {run_tags.PARENT_TAG: old_parent, **digest})
    store.log_params(finished, {"batch.tokens_per_update": 256, "train.total_tokens": 40960, "schedule.decay": "wsd"})
    for step in range(0, 40960, 2560):  # loss 3 falling to 2: below 2.5 at 20,480 tokens, update 80
        store.log_metrics(finished, {"train/loss": 3.0 - step / 40960}, step=step)
    store.finish_run(finished)
    unfinished = store.create_run("d_model=32 D=40Ki B=512", {run_tags.PARENT_TAG: old_parent, **digest})
    store.finish_run(unfinished, "KILLED")
    own = store.create_run("d_model=64 D=80Ki B=256", {run_tags.PARENT_TAG: new_parent})

    assert store.find_finished(digest).run_id == finished  # not the killed one
    assert store.find_finished({run_tags.DIGEST_TAG: "another"}) is None
    assert (
        report_inputs.trial_runs(uri, new_parent)[0].run_id == own
        and len(report_inputs.trial_runs(uri, new_parent)) == 1
    )
    store.set_tags(finished, {run_tags.REUSED_BY_PREFIX + new_parent: "trial_7"})
    assert {r.run_id for r in report_inputs.trial_runs(uri, new_parent)} == {own, finished}
    assert {r.run_id for r in report_inputs.trial_runs(uri, old_parent)} == {finished, unfinished}
    tags = {run_tags.PARENT_TAG: new_parent, run_tags.TRIAL_TAG: "trial_7"}
    assert bracket_search.steps_to_target(uri, "ladders", tags, 2.5) < math.inf  # read from the reused run


def test_a_template_run_that_is_no_train_config_gives_no_recommended_yaml(folder, in_memory, tmp_path, capsys):
    """A table from another trainer may carry params no train config takes: the report says so
    instead of failing (the end of a long sweep must not)."""
    import dataclasses

    trials = tables.read(folder)
    template = report_ladder.template_run(in_memory, trials)
    assert template is not None and template.name == in_memory.rungs[-1].best_run
    broken = [dataclasses.replace(t, params={**t.params, "optim.name": "lion"}) if t is template else t for t in trials]
    target = ladder_target.Target(*TARGET)
    assert report_ladder.write_recommended(in_memory, broken, target, tmp_path) is None
    assert "no recommended.yaml: optim.name" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- the two points, per rung


@pytest.fixture(scope="module")
def basin_report(tmp_path_factory):
    """`orchestrator report DIR` of a ladder whose loss has an interior minimum in batch size
    (tests/basin_truth.py), with a target and a loss tolerance of its own."""
    from tests.basin_truth import WORLDS as BASINS

    world = BASINS["basin"]
    folder = write_tables(*world.tables(), tmp_path_factory.mktemp("basin-tables"))
    out = tmp_path_factory.mktemp("report") / "basin"
    n, d = world.target
    argv = ["report", str(folder), "--out", str(out), "--target-params", str(n), "--target-tokens", str(d)]
    assert cli.main(argv + ["--loss-tolerance", "0.003"]) == 0
    return world, folder, out


def test_a_ladders_report_gives_both_points_and_the_tradeoff_at_its_tolerance(basin_report):
    world, folder, out = basin_report
    got = json.loads((out / "report.json").read_text())
    expected = ladder.analyse(tables.read(folder), world.target, tolerance=0.003)
    assert got["ladder"] == json.loads(json.dumps(ladder.to_json(expected)))
    rec = got["ladder"]["recommendation"]
    assert rec["tolerance"] == 0.003 and got["source"]["settings"]["loss_tolerance"] == "command line"
    assert rec["predicted_loss_penalty"]["value"] == pytest.approx(0.003, rel=1e-3)
    assert rec["loss_optimal"]["tokens_per_update"]["value"] < rec["tokens_per_update"]["value"]
    assert len(got["ladder"]["tradeoff"]) == 9
    assert (out / "tradeoff.png").stat().st_size > 10_000


def test_a_ladders_summary_is_per_rung_with_no_pooled_best_configuration(basin_report, capsys):
    world, _, out = basin_report
    summary = (out / "summary.md").read_text()
    assert "Best configuration" not in summary and "best configuration per batch size" not in summary.lower()
    assert summary.index("![tradeoff.png]") < summary.index("## The rungs") < summary.index("## All trials")
    rung_rows = summary.split("## The rungs")[1].split("## Laws")[0]
    assert sum(
        line.startswith("| 1e+08") or line.startswith("| 2e+08") or line.startswith("| 4e+08")
        for line in rung_rows.splitlines()
    ) == len(world.rungs())
    assert "Loss-optimal: B* = " in summary and "optimizer steps fewer than at B*" in summary
