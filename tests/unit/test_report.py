"""`orchestrator report` read back from MLflow: which runs count, where steps may be read, the
files it writes and logs, and what it says when the data cannot answer. The runs are a
known-truth world (tests/known_truth.py) logged into a SQLite store as a sweep would log them;
what the analysis concludes on such worlds is tests/unit/test_known_truth.py's."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import pytest
from mlflow.tracking import MlflowClient

from orchestrator.analysis import sweep_analysis
from orchestrator.core.errors import ConfigError
from orchestrator.reporting import report, report_files, report_inputs, report_render, sweep_tables
from orchestrator.tracking import metric_logger, run_tags
from orchestrator.tracking import store as store_module
from orchestrator.tracking.store import SWEEP_CURVES, Store
from tests.conftest import run_main, sqlite_store
from tests.known_truth import World, factor_grid

EXPERIMENT = "report-test"
SWEEP = "known-truth"
BATCHES = (256, 512, 1024, 2048)
LRS = factor_grid(0.002, 0.032)
WORLD = World(max_points=300, draw=5)
STOP_RUNG = 2**18
FIGURES = ["loss_vs_tokens.png", "loss_vs_steps.png", "eval_heatmap.png", "critical_batch.png", "lr_vs_batch.png"]
FIGURES += ["loss_vs_tokens_best.png", "critical_batch_vs_loss.png", "b_simple_vs_tokens.png", "loss_vs_lr.png"]
TOKEN_LABEL = re.compile(r"^(\d{1,3}(,\d{3})*|\d+(\.\d+)?M|\d(\.\d+)?)$")
"""report_format.fmt_tokens's one format: 512, 8,192, 16.8M (never 8Ki, 8.19k or 2^13)."""
FILES = FIGURES + ["summary.md", "summary.html", "report.json"]


def duration(run) -> float:
    return WORLD.total_tokens / (1e4 * math.log2(run.batch))  # bigger batches run faster


def _log(uri, parent, run, params, status, stopped=None):
    run_id = Store(uri, EXPERIMENT).create_run(run.name, tags={run_tags.PARENT_TAG: parent} if parent else {})
    Store(uri).log_params(run_id, params)
    logger = metric_logger.MetricLogger(uri, run_id, flush_every_s=60)
    for metric, points in (("train/loss", run.train), ("eval/loss", run.eval), ("gns/b_simple", run.b_simple)):
        for step, value in points:
            logger.log({metric: value}, step=step)
    logger.close()
    if stopped:
        Store(uri).set_tags(run_id, {run_tags.STOPPED_AT_TAG: str(stopped)})
    start = Store(uri).get_run(run_id).start_ms
    MlflowClient(tracking_uri=uri).set_terminated(run_id, status, end_time=start + int(1000 * duration(run)))
    return run_id


def stopped_at(run, rung: int):
    """The run as the scheduler would have left it: its history up to the rung."""
    cut = [(t, v) for t, v in run.train if t < rung]
    return dataclasses.replace(run, train=cut, eval=[p for p in run.eval if p[0] <= rung], name=run.name + " stopped")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A sweep parent: 4 batch sizes x 5 lrs x 2 seeds (the highest lrs fail at the smaller
    batch sizes); two poor runs stopped early at a rung; and a lone run outside any sweep."""
    tmp = tmp_path_factory.mktemp("mlflow")
    uri = sqlite_store(tmp)
    parent = Store(uri, EXPERIMENT).create_run(SWEEP, tags={"orchestrator.role": "sweep", run_tags.SWEEP_TAG: SWEEP})
    runs = WORLD.grid(batches=BATCHES, lrs=LRS, seeds=2)
    for run in runs:
        _log(uri, parent, run, WORLD.params(run), run.status)
    poor = [stopped_at(r, STOP_RUNG) for r in WORLD.simulate([(1024, 0.001, 0), (1024, 0.001, 1)])]
    for run in poor:
        _log(uri, parent, run, WORLD.params(run), "KILLED", stopped=STOP_RUNG)
    Store(uri).finish_run(parent)
    (lone,) = WORLD.simulate([(1024, 0.01, 0)])
    lone_id = _log(uri, None, lone, {"batch.tokens_per_update": 1024, "optim.lr": 0.01}, "FINISHED")
    return {"uri": uri, "parent": parent, "lone": lone_id, "tmp": tmp, "runs": runs, "poor": poor}


@pytest.fixture(scope="module")
def sweep_report(store):
    out = store["tmp"] / "report"
    overrides = [f"tracking.uri={store['uri']}", f"tracking.experiment={EXPERIMENT}"]
    assert report.run(SWEEP, overrides, out=str(out), target_losses=None) == 0
    return {"out": out, "json": json.loads((out / "report.json").read_text())}


@pytest.fixture(scope="module")
def trials(store):
    return report_inputs.read_trials(store["uri"], store["parent"])


# ---------------------------------------------------------------- what counts


def test_mlflow_gives_the_analysis_what_the_tables_give(store, trials):
    """The runs read back from MLflow are the runs of the world: same answer as its tables."""
    from_mlflow = sweep_analysis.analyse(trials).to_json()
    from_tables = sweep_analysis.analyse(WORLD.trials(store["runs"] + store["poor"])).to_json()
    for a, b in zip(from_mlflow["critical_batch"], from_tables["critical_batch"]):
        assert a["target_loss"] == pytest.approx(b["target_loss"], rel=1e-12)
        assert a["b_crit"] == pytest.approx(b["b_crit"], rel=1e-12) and a["status"] == b["status"]


def test_a_train_loss_point_is_the_update_that_starts_there(trials):
    """The last train/loss point is at budget - B (the update from there), the last eval at the
    budget: a run that logged both saw its whole budget."""
    done = [t for t in trials if t.status == "FINISHED"]
    assert done and all(t.train[-1][0] == WORLD.total_tokens - t.batch for t in done)
    assert all(t.tokens_seen == WORLD.total_tokens and t.outcome == "finished" for t in done)


def test_best_configuration_counts_only_finished_trials(sweep_report, store, trials):
    result = sweep_report["json"]
    failed = sum(r.status == "FAILED" for r in store["runs"])
    assert failed and result["failed"] == failed
    assert result["stopped"] == {"count": 2, "rungs": {str(STOP_RUNG): 2}}  # JSON keys are text
    assert result["finished"] == len(store["runs"]) - failed
    for row in result["best_per_batch"]:
        assert row["lr"] != 0.001, "a stopped configuration is never the best"
    answer = report_render.answer(sweep_analysis.analyse(trials))  # what report printed
    assert result["best"]["batch"] == min(BATCHES)  # at equal tokens, as expected: the answer says so
    assert "That is the smallest batch tried: on these runs the loss keeps falling towards smaller batches" in answer
    assert "the batch size to act on" not in answer  # B_crit says what it is for instead (issue 52)
    assert "B_crit is what more data-parallel hardware buys" in answer
    assert f"{result['finished']} of {result['finished'] + failed + 2} trials reached the budget" in answer
    assert f"2 stopped early (2 at the {STOP_RUNG:,}-token rung)" in answer


def test_automatic_targets_lie_below_the_start_level_and_every_batch_size_reaches_them(sweep_report):
    result = sweep_report["json"]
    assert result["targets_chosen"] and len(result["critical_batch"]) == 3
    for fit in result["critical_batch"]:
        assert fit["target_loss"] < result["start_level"]
        assert not fit["missing"] and [p["batch"] for p in fit["points"]] == list(BATCHES)
        assert fit["status"] == "resolved" and fit["b_crit_interval"], fit["notes"]


def test_wall_time_is_the_run_share_of_its_duration(sweep_report):
    for p in sweep_report["json"]["primary"]["points"]:
        total = WORLD.total_tokens / (1e4 * math.log2(p["batch"]))
        assert p["wall_s"] == pytest.approx(total * p["tokens_to_target"] / WORLD.total_tokens, rel=0.02)


def test_steps_come_only_from_the_part_the_schedule_cannot_fake(trials):
    """A wsd run whose loss falls to a target only during its final decay does not count as
    reaching it; a cosine sweep is read over the first half of its budget, with a warning."""
    end = 0.8 * WORLD.total_tokens
    annealed = [  # the anneal: a sharp extra drop in the last 20% of the budget
        dataclasses.replace(t, train=[(tok, v - (0.8 if tok > end else 0.0)) for tok, v in t.train], _fits={})
        for t in trials
    ]
    largest = [t for t in annealed if t.batch == BATCHES[-1] and t.outcome == "finished"]
    end_of_stable = min(t.curve().__getitem__(1)[-1] for t in largest)
    fit = sweep_analysis.analyse(annealed, [end_of_stable - 0.3]).to_json()["critical_batch"][0]
    assert BATCHES[-1] in fit["missing"], "reached only in the decay, so not reached"
    cosine = [dataclasses.replace(t, params={**t.params, "schedule.decay": "cosine"}, _fits={}) for t in trials]
    notes = sweep_analysis.analyse(cosine).primary.notes
    assert any("the fit depends on the schedule" in n for n in notes)


def test_fewer_than_three_batch_sizes_is_not_resolved(trials):
    result = sweep_analysis.analyse([t for t in trials if t.batch in BATCHES[:2]])
    fit = result.primary
    assert fit.status == "not resolved" and fit.b_crit is None and fit.b_crit_interval is None
    assert "not resolved (B_crit needs 3 batch sizes that reach this loss; 2 did)" in report_render.answer(result)


def test_target_not_reached_by_every_batch_size(trials):
    largest = [t for t in trials if t.batch == BATCHES[-1] and t.outcome == "finished"]
    below_largest = min(t.curve()[1][-1] for t in largest) - 0.05  # past where the largest batch gets
    nobody, partly = sweep_analysis.analyse(trials, [1.0, below_largest]).to_json()["critical_batch"]  # by loss
    assert BATCHES[-1] in partly["missing"] and len(partly["points"]) == 3
    assert f"not reached by batch sizes {BATCHES[-1]:,}" in partly["notes"]
    assert nobody["points"] == [] and nobody["b_crit"] is None and nobody["b_simple"] is None
    assert any("needs 3 batch sizes" in n for n in nobody["notes"])


def test_report_without_eval_or_gns_or_reachable_target(trials, tmp_path):
    bare = [dataclasses.replace(t, eval=[], b_simple=[], _fits={}) for t in trials]
    result = sweep_analysis.analyse(bare, [1.0])
    assert result.loss_metric == "train/loss"
    assert result.best.batch == BATCHES[0]
    assert "Critical batch size at loss 1: not resolved" in report_render.answer(result)
    written = {p.name for p in report_files.write_report(bare, result, "degenerate", tmp_path)}
    assert "critical_batch.png" not in written and {"loss_vs_tokens.png", "summary.md", "report.json"} <= written
    assert "no gns/b_simple" in (tmp_path / "summary.md").read_text()


# ---------------------------------------------------------------- the files


def test_every_file_written_and_logged(store, sweep_report):
    out = sweep_report["out"]
    for name in FILES + ["trials.csv", "curves.csv"]:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    for name in FIGURES:
        assert (out / name).stat().st_size > 10_000, name
        image = mpimg.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 400 and image.std() > 0.01, name
    logged = set(Store(store["uri"]).list_artifacts(store["parent"], "report"))
    assert {f"report/{name}" for name in FILES} <= logged
    md, page = (out / "summary.md").read_text(), (out / "summary.html").read_text()
    for name in FIGURES:
        assert f"({name})" in md and f"src='{name}'" in page
    assert "B_crit" in md and "Best configuration per batch size" in md and "<table>" in page
    assert "best lr (final loss)" in md and "L_a" in md


def test_a_run_ends_with_its_figure_logged_and_closed(tmp_path):
    """A run's end (run_life.close_run) logs its loss-versus-tokens figure; pyplot holds a figure
    until it is closed, and a trial process that Tune reuses ends a run per trial."""
    from orchestrator.driver import run_life

    uri = sqlite_store(tmp_path)
    (run,) = WORLD.simulate([(1024, 0.01, 0)])
    run_id = _log(uri, None, run, {}, "RUNNING")
    open_before = plt.get_fignums()
    run_life.close_run(Store(uri), run_id, "FINISHED", title=run.name)
    assert plt.get_fignums() == open_before
    assert "loss_vs_tokens.png" in Store(uri).list_artifacts(run_id)
    assert Store(uri).get_run(run_id).status == "FINISHED"


def test_where_a_run_keeps_its_checkpoints_is_in_its_record_and_table(store):
    from orchestrator.reporting import sweep_tables

    uri, run_id = store["uri"], store["lone"]
    Store(uri).set_tags(run_id, {run_tags.CHECKPOINTS_TAG: "s3://bucket/runs/lone"})
    (t,) = report_inputs.trials_of(uri, [Store(uri).get_run(run_id)])
    assert t.checkpoints == "s3://bucket/runs/lone"
    assert list(sweep_tables.trials_frame([t])["checkpoints"]) == ["s3://bucket/runs/lone"]


def test_curves_are_smoothed_in_a_window_of_constant_width_on_the_log_axis():
    """comparison_plots.smooth against a brute force: each point's mean over the points within a
    factor 1.15 of its x; a straight line in log x stays where it is."""
    import numpy as np

    from orchestrator.reporting.comparison_plots import smooth

    rng = np.random.default_rng(0)
    xs = np.sort(rng.uniform(1, 1e6, 500))
    ys = rng.normal(size=500)
    brute = [ys[(xs >= x / 1.15) & (xs <= x * 1.15)].mean() for x in xs]
    assert np.allclose(smooth(xs, ys), brute)
    grid = np.geomspace(1, 1e6, 400)
    line = 3 - 0.1 * np.log(grid)
    assert np.allclose(smooth(grid, line)[5:-5], line[5:-5], atol=1e-3)


def test_token_counts_have_one_format_on_every_figure(trials):
    """Every axis and colour bar that counts tokens labels its ticks as report_format.fmt_tokens does; the
    batch-size comparisons colour by B on one ordered scale with a colour bar."""
    result = sweep_analysis.analyse(trials)
    figs = dict(report_files.figures(trials, result, "known-truth"))
    assert set(FIGURES) <= set(figs)
    checked = 0
    for name, fig in figs.items():
        fig.canvas.draw()
        for ax in fig.axes:
            for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
                if "token" not in label or "loss" in label:
                    continue
                texts = [t.get_text() for t in axis.get_ticklabels() + axis.get_ticklabels(minor=True)]
                texts = [t for t in texts if t]
                assert texts, (name, label)
                assert all(TOKEN_LABEL.match(t) for t in texts), (name, label, texts)
                checked += 1
    assert checked >= 8  # the token axes of every figure above and the batch-size colour bars
    for name in ("loss_vs_tokens_best.png", "b_simple_vs_tokens.png", "loss_vs_lr.png"):
        bars = [ax for ax in figs[name].axes if ax.get_ylabel() == "batch size (tokens per update)"]
        assert len(bars) == 1, name  # the colour bar
        ticks = [t.get_text() for t in bars[0].yaxis.get_ticklabels()]
        assert ticks == [f"{b:,}" for b in BATCHES], (name, ticks)


def test_report_json_keeps_its_contract(sweep_report):
    """critical_batch (target_loss, b_crit, b_crit_interval, status, b_simple, notes), primary, trend."""
    result = sweep_report["json"]
    for fit in result["critical_batch"]:
        assert {"target_loss", "b_crit", "b_crit_interval", "status", "b_simple", "notes"} <= set(fit)
        assert fit["status"] in ("resolved", "below", "above", "not resolved")
    assert result["primary"]["target_loss"] == result["critical_batch"][0]["target_loss"]
    assert {"b_crit_slope", "b_crit_slope_interval", "b_simple_slope", "targets"} <= set(result["trend"])
    assert len(result["best_lr"]) == len(BATCHES) and result["lr_criterion"] == "final_loss"


def test_single_run_report(store, tmp_path, capsys):
    out = tmp_path / "lone"
    assert report.run(store["lone"], [f"tracking.uri={store['uri']}"], out=str(out), target_losses=None) == 0
    for name in ["loss_vs_tokens.png", "loss_vs_steps.png", "summary.md", "summary.html", "report.json"]:
        assert (out / name).is_file(), name
    result = json.loads((out / "report.json").read_text())
    assert result["source"]["kind"] == "single" and result["primary"]["b_crit"] is None
    notes = " ".join(result["primary"]["notes"])
    assert "needs 3 batch sizes" in notes
    assert "not resolved" in capsys.readouterr().out
    assert "report/loss_vs_tokens.png" in Store(store["uri"]).list_artifacts(store["lone"], "report")


def test_unknown_sweep_is_a_config_error(store, tmp_path):
    with pytest.raises(ConfigError, match="no-such-sweep"):
        report.run("no-such-sweep", [f"tracking.uri={store['uri']}"], out=str(tmp_path), target_losses=None)
    with pytest.raises(ConfigError, match="tracking.uri"):
        report.run(SWEEP, [f"tracking.uri=sqlite:///{tmp_path}/missing.db"], out=str(tmp_path), target_losses=None)


def test_sweep_file_names_the_sweep(store, tmp_path):
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        f"name: {SWEEP}\nbase:\n  config: conf/train/tiny.yaml\n  overrides:\n"
        f"    - tracking.uri={store['uri']}\n    - optim.lr=1e-3\n"
    )
    uri, name, run_id = report_inputs.resolve(str(sweep_file), [])
    assert (uri, name, run_id) == (store["uri"], SWEEP, store["parent"])


def test_report_of_a_sweep_file_reads_it_once_and_makes_the_report_of_its_runs(store, tmp_path, monkeypatch):
    """`report SWEEP_FILE` parses the file once (its name, store, search and branch options all come
    from that one reading) and hands the pipeline the sweep's runs (its report is tested above)."""
    from orchestrator.core import sweep_file
    from orchestrator.reporting import pipeline

    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"name: {SWEEP}\nbase:\n  config: conf/train/tiny.yaml\n  overrides:\n"
        f"    - tracking.uri={store['uri']}\n    - tracking.experiment={EXPERIMENT}\n"
        "search:\n  criterion: steps\n"
    )
    parsed, made = [], []
    load = sweep_file.load
    monkeypatch.setattr(sweep_file, "load", lambda *a, **k: parsed.append(a) or load(*a, **k))
    monkeypatch.setattr(
        pipeline,
        "make",
        lambda inputs, settings, out, target_losses, ui_port, **options: made.append((inputs, settings, options)),
    )
    assert report.run(str(path), [], out=str(tmp_path / "out"), target_losses=None) == 0
    assert len(parsed) == 1
    ((inputs, settings, options),) = made
    assert inputs.name == SWEEP and inputs.source.run_id == store["parent"] and inputs.source.kind == "sweep"
    assert len(inputs.trials) == len(store["runs"]) + len(store["poor"])
    ladder = options.pop("ladder")  # no ladder section: no target, the default tolerance
    assert ladder.target is None
    # search.criterion steps is how the search scored lrs; the lr the report names is by final loss
    # unless the command line asks otherwise (one criterion for the whole answer, issue 52).
    assert settings.options == {"lr_criterion": "final_loss", "primary_target": None, "loss_tolerance": 0.005}
    assert options.pop("store").uri == store["uri"] and options == {"compare_with": None}
    assert settings.origin == {"lr_criterion": "default", "primary_target": "default", "loss_tolerance": "default"}


def test_cli_report_and_unknown_sweep(store, tmp_path, capsys):
    out = tmp_path / "cli-report"
    code, stdout, stderr = run_main(
        capsys,
        "report",
        SWEEP,
        f"tracking.uri={store['uri']}",
        "--out",
        out,
        "--target-loss",
        "4.0",
        "--lr-criterion",
        "steps",
    )
    assert code == 0, stderr
    assert "summary.md" in stdout and "B_crit" in stdout and "best lr (fewest steps to the primary target)" in stdout
    assert all((out / name).is_file() for name in FILES)
    written = json.loads((out / "report.json").read_text())
    assert written["critical_batch"][0]["target_loss"] == 4.0 and written["lr_criterion"] == "steps"
    assert [r["lr"] for r in written["best_lr"]] == [p["lr"] for p in written["primary"]["points"]]
    code, stdout, stderr = run_main(
        capsys, "report", "no-such-sweep", f"tracking.uri={store['uri']}", "--out", tmp_path / "x"
    )
    assert code == 2
    assert len(stderr.strip().splitlines()) == 1 and "no-such-sweep" in stderr, stderr


# ---------------------------------------------------------------- one answer per sweep


def test_a_sweep_named_by_its_file_its_name_or_its_parent_run_gets_one_answer(store, tmp_path):
    """The sweep file's analysis settings (search.target_loss; search.criterion is the search's own,
    not the report's lr criterion) are recorded on the parent run (the file as an artifact, as
    `sweep` logs it) and read back when the file is not given: report by file, by name, by parent
    run id and load_sweep agree, and say where the settings came from; the command line's lr
    criterion wins over the default."""
    from orchestrator.reporting import sweep_tables

    name, uri = "settings-recorded", store["uri"]
    text = (
        f"name: {name}\nbase:\n  config: conf/train/tiny.yaml\n  overrides:\n"
        f"    - tracking.uri={uri}\n    - tracking.experiment={EXPERIMENT}\n"
        "search:\n  criterion: steps\n  target_loss: 3.6\n"
    )
    parent = Store(uri, EXPERIMENT).create_run(
        name, tags={run_tags.ROLE_TAG: run_tags.SWEEP_ROLE, run_tags.SWEEP_TAG: name}
    )
    Store(uri).log_text(parent, text, "sweep.yaml")
    for run in WORLD.grid(batches=BATCHES[:3], lrs=LRS[1:4], seeds=1):
        _log(uri, parent, run, WORLD.params(run), run.status)
    Store(uri).finish_run(parent)
    path = tmp_path / "sweep.yaml"
    path.write_text(text)

    written = {}
    for way, target in (("file", str(path)), ("name", name), ("run id", parent)):
        out = tmp_path / way.replace(" ", "_")
        assert report.run(target, [f"tracking.uri={uri}", f"tracking.experiment={EXPERIMENT}"], out=str(out)) == 0
        written[way] = json.loads((out / "report.json").read_text())
    answers = {way: {k: v for k, v in j.items() if k not in ("name", "source")} for way, j in written.items()}
    assert answers["file"] == answers["name"] == answers["run id"]
    assert answers["file"]["lr_criterion"] == "final_loss" and answers["file"]["primary_target"] == 3.6
    assert written["file"]["source"]["settings"]["primary_target"] == f"the sweep file {path}"
    assert written["name"]["source"]["settings"] == {
        "lr_criterion": "default",
        "primary_target": f"the sweep file recorded on run {parent}",
        "loss_tolerance": "default",
    }
    loaded = sweep_tables.load_sweep(name, tracking_uri=uri, experiment=EXPERIMENT)
    assert loaded.fit.raw == {k: v for k, v in written["name"].items() if k != "name"}

    out = tmp_path / "cli-wins"
    assert report.run(name, [f"tracking.uri={uri}"], out=str(out), lr_criterion="steps") == 0
    by_cli = json.loads((out / "report.json").read_text())
    assert by_cli["lr_criterion"] == "steps" and by_cli["source"]["settings"]["lr_criterion"] == "command line"
    named = {r["batch"]: r["lr"] for r in by_cli["best_lr"]}  # one criterion: the recommendation's lr too
    assert by_cli["recommendation"]["lr_from"] != "power law" or by_cli["lr_scaling"]["alpha"] is not None
    rec = by_cli["recommendation"]
    if rec["tokens_per_update"] in named and rec["lr_from"] == "tried":
        assert rec["lr"] == named[rec["tokens_per_update"]]
    assert "by fewest steps to the primary target" in " ".join(rec["rule"])
    assert "lr criterion from command line" in (out / "summary.md").read_text()


def test_the_parent_run_holds_the_answer_as_metrics_and_tags(store, tmp_path):
    """So sweeps compare in MLflow's runs table: the primary's B_crit, its interval and B_simple,
    the best final loss and what to run, as the report.json beside them says (the latest report's)."""
    overrides = [f"tracking.uri={store['uri']}", f"tracking.experiment={EXPERIMENT}"]
    assert report.run(SWEEP, overrides, out=str(tmp_path)) == 0
    answer = json.loads((tmp_path / "report.json").read_text())
    primary, run = answer["primary"], Store(store["uri"]).get_run(store["parent"])
    assert run.metrics["answer/b_crit"] == pytest.approx(primary["b_crit"])
    assert [run.metrics["answer/b_crit_low"], run.metrics["answer/b_crit_high"]] == pytest.approx(
        primary["b_crit_interval"]
    )
    assert run.metrics["answer/b_simple"] == pytest.approx(primary["b_simple"])
    assert run.metrics["answer/best_final_loss"] == pytest.approx(answer["best"]["final_loss"])
    rec = answer["recommendation"]
    assert run.metrics["answer/recommended_tokens_per_update"] == rec["tokens_per_update"]
    assert run.metrics["answer/recommended_lr"] == pytest.approx(rec["lr"])
    assert run.tags["answer.status"] == primary["status"]
    assert float(run.tags["answer.primary_target"]) == pytest.approx(primary["target_loss"], rel=1e-3)


def test_a_text_param_that_looks_like_a_number_is_written_and_read_back_as_text(tmp_path):
    """Trial ids are 8 hex digits and name a sweep trial's run (train.run_name): '73714518' looks
    like an integer and '29e68690' like a float too large for one (inf). trials.csv keeps a column
    of names as names, so `report DIR` reads the folder `report` wrote."""
    from orchestrator.analysis import tables
    from orchestrator.analysis.trials import Trial
    from orchestrator.reporting import sweep_tables

    names = ["73714518", "29e68690", "a1b2c3d4"]
    trials = [
        Trial(
            run_id=f"run{i}",
            name=f"B=256 lr=1e-3 s{i}",
            status="FINISHED",
            params={
                "batch.tokens_per_update": "256",
                "optim.lr": "0.001",
                "train.run_name": name,
                "train.seed": str(i),
            },
            train=[(256, 3.0), (512, 2.5)],
        )
        for i, name in enumerate(names)
    ]
    curves = {t.run_id: {"train/loss": t.train} for t in trials}
    frames = sweep_tables.trials_frame(trials), sweep_tables.curves_frame(trials, curves)
    sweep_tables.SweepResults("names", "parent", *frames, fit=None).to_csv(tmp_path)
    back = tables.read(tmp_path)
    assert [t.params["train.run_name"] for t in back] == names
    assert [t.params["train.seed"] for t in back] == ["0", "1", "2"]


def test_runs_that_ended_with_their_curves_artifact_are_read_from_it_in_one_call_each(
    store, tmp_path, monkeypatch, capfd
):
    """Store.write_curves (what run_life.close_run writes when a run ends) and Store.histories: a
    run with the artifact is read without one history call per metric, to the same curves; a key
    it does not hold, or a run that training resumed into (reopen_run), is read from MLflow."""
    from mlflow.tracking import MlflowClient as Client

    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    shutil.copyfile(Path(store["uri"].removeprefix("sqlite:///")), tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs = Store(uri).child_runs(store["parent"])
    keys = ["train/loss", "eval/loss", "gns/b_simple"]
    direct = Store(uri).histories(runs, keys)
    for r in runs:
        held = {k: v for k, v in direct[r.run_id].items() if k in r.metrics and k != "gns/b_simple"}
        Store(uri).write_curves(r.run_id, held)
    calls = []
    original = Client.get_metric_history
    monkeypatch.setattr(
        Client, "get_metric_history", lambda self, run_id, key: calls.append(key) or original(self, run_id, key)
    )
    runs = Store(uri).child_runs(store["parent"])
    assert Store(uri).histories(runs, keys) == direct
    assert calls and set(calls) == {"gns/b_simple"}, "only the key the artifacts lack is read one call at a time"
    assert "Downloading artifacts" not in capfd.readouterr().err, "no progress bar per run's download"
    calls.clear()
    reopened = runs[0]
    Store(uri).reopen_run(reopened.run_id)
    runs = Store(uri).child_runs(store["parent"])
    assert Store(uri).histories(runs, keys[:2]) == {r: {k: direct[r][k] for k in keys[:2]} for r in direct}
    assert len(calls) == sum(k in reopened.metrics for k in keys[:2]) > 0, "the reopened run is read from MLflow"


def test_the_cyclic_collector_pauses_while_mlflow_builds_a_page_of_runs(store, monkeypatch):
    """A page of runs is thousands of ORM objects, and collections while they are built cost
    twice the search's own time at 2,000 runs: the collector is off during each page's search and
    on again after it, also when the search fails."""
    import gc

    seen, search = [], MlflowClient.search_runs
    monkeypatch.setattr(Store, "SEARCH_PAGE", 2)
    monkeypatch.setattr(
        MlflowClient, "search_runs", lambda self, *a, **k: seen.append(gc.isenabled()) or search(self, *a, **k)
    )
    runs = Store(store["uri"]).child_runs(store["parent"])
    assert len(seen) >= len(runs) // 2 >= 1 and not any(seen) and gc.isenabled()

    def refused(self, *a, **k):
        raise RuntimeError("the store is gone")

    monkeypatch.setattr(MlflowClient, "search_runs", refused)
    with pytest.raises(RuntimeError):
        Store(store["uri"]).child_runs(store["parent"])
    assert gc.isenabled()


def test_a_sweeps_runs_share_their_config_strings_and_read_as_mlflow_has_them(store):
    """A report of thousands of runs holds every run's params and tags: the records of one search
    share each name and each value they have in common (one string object, not one per run) and
    still read, key for key, what MLflow holds."""
    runs = Store(store["uri"]).child_runs(store["parent"])
    first, *others = runs
    assert len(others) >= 20 and all(r.params.keys() == first.params.keys() for r in others)
    client = MlflowClient(store["uri"])
    assert all(r.params == client.get_run(r.run_id).data.params for r in (first, others[-1]))
    for key, value in first.params.items():
        same = [r.params[key] for r in others if r.params[key] == value]
        assert all(v is first.params[key] for v in same), key
        assert all(k is key for r in others for k in r.params if k == key), key
    parent = run_tags.PARENT_TAG
    assert all(r.tags[parent] is first.tags[parent] for r in others)


def test_a_sweeps_curves_are_read_from_its_one_table_but_a_run_that_ended_again(store, tmp_path, monkeypatch):
    """Store.write_sweep_curves (what a sweep's closing report writes on its parent run) and
    Store.histories(sweep_run=...): every run's curves from the one table, in one download and no
    history call, the same as read run by run; a run that training resumed into and that ended
    again is read from its own run (its new point in), the others still from the table; a key the
    table lacks reads every run as before."""
    from mlflow.tracking import MlflowClient as Client

    shutil.copyfile(Path(store["uri"].removeprefix("sqlite:///")), tmp_path / "mlflow.db")
    uri, parent = f"sqlite:///{tmp_path / 'mlflow.db'}", store["parent"]
    runs = Store(uri).child_runs(parent)
    monkeypatch.setattr(Store, "SEARCH_PAGE", 2)  # the runs searched in pages, every one found
    assert len(runs) > 2 and [r.run_id for r in Store(uri).child_runs(parent)] == [r.run_id for r in runs]
    keys = ["train/loss", "eval/loss"]
    direct = Store(uri).histories(runs, keys)
    Store(uri).write_sweep_curves(parent, runs, direct)
    assert Store(uri).get_run(parent).tags[run_tags.SWEEP_CURVES_TAG] == ",".join(keys)
    import mlflow.artifacts

    calls, downloads = [], []
    history, download = Client.get_metric_history, mlflow.artifacts.download_artifacts
    monkeypatch.setattr(Client, "get_metric_history", lambda self, *a: calls.append(a) or history(self, *a))
    monkeypatch.setattr(
        mlflow.artifacts, "download_artifacts", lambda uri, **k: downloads.append(uri) or download(uri, **k)
    )
    assert Store(uri).histories(runs, keys, sweep_run=parent) == direct
    assert len(downloads) == 1 and downloads[0].endswith(SWEEP_CURVES) and calls == [], "one file, no history call"
    again = runs[0]
    Store(uri).reopen_run(again.run_id)
    Store(uri).log_history(again.run_id, {"train/loss": [(10**9, 0.5)]})
    Store(uri).finish_run(again.run_id)
    calls.clear()
    runs = Store(uri).child_runs(parent)
    read = Store(uri).histories(runs, keys, sweep_run=parent)
    assert read[again.run_id]["train/loss"] == direct[again.run_id]["train/loss"] + [(10**9, 0.5)]
    assert {r: c for r, c in read.items() if r != again.run_id} == {
        r: c for r, c in direct.items() if r != again.run_id
    }
    assert {run_id for run_id, _ in calls} == {again.run_id}
    downloads.clear()
    more = [*keys, "gns/b_simple"]
    assert Store(uri).histories(runs, more, sweep_run=parent) == Store(uri).histories(runs, more)
    assert not any(d.endswith(SWEEP_CURVES) for d in downloads), "a key the table lacks: every run read as before"


def test_whole_curves_logged_in_batches_read_back_as_logged(tmp_path):
    """Store.log_history sends curves in MLflow's largest batches (1,000 metrics a call): 2,500
    points of two keys come back as logged, from MLflow and from the curves artifact."""
    uri = sqlite_store(tmp_path)
    run_id = Store(uri, EXPERIMENT).create_run("bulk")
    curves = {"train/loss": [(64 * i, 1.0 / (i + 1)) for i in range(2000)], "eval/loss": [(0, 9.0), (640, 3.5)] * 1}
    curves["eval/loss"] += [(1280 + 64 * i, 3.0 - i * 1e-3) for i in range(498)]
    Store(uri).log_history(run_id, curves)
    Store(uri).finish_run(run_id)
    assert {k: Store(uri).metric_history(run_id, k) for k in curves} == curves
    Store(uri).write_curves(run_id, curves)
    assert Store(uri).histories([Store(uri).get_run(run_id)], curves) == {run_id: curves}


def test_a_runs_curves_artifact_holds_every_curve_report_and_load_sweep_read_by_default():
    assert set(store_module.CURVES_STORED) == {*report_inputs.METRICS, *sweep_tables.METRICS}


def test_a_heatmap_of_hundreds_of_lrs_stays_a_figure_one_can_open():
    """A sweep of 256 lrs at one batch size made eval_heatmap.png 130 inches tall (and the report's
    memory peak); past plots.HEATMAP_ANNOTATED rows the figure stops growing and the cells go
    unannotated. A small grid keeps a value in every cell."""
    from orchestrator.reporting import plots

    big = plots.lr_batch_heatmap([(0.01 + 0.001 * i, 256, 1.0 + 1e-3 * i) for i in range(256)])
    assert big.get_size_inches()[1] <= 0.5 * plots.HEATMAP_ANNOTATED + 2 and not big.axes[0].texts
    assert len(big.axes[0].get_yticks()) <= plots.HEATMAP_ANNOTATED
    small = plots.lr_batch_heatmap([(lr, b, 1.0 + lr) for lr in (1e-3, 2e-3) for b in (256, 512)])
    assert len(small.axes[0].texts) == 4
    for fig in (big, small):
        plt.close(fig)


def test_the_answer_does_not_depend_on_the_order_the_runs_started_in(trials):
    """Concurrent trials start in no fixed order, and MLflow gives runs oldest first: the same
    runs in another order are the same sweep and must get the same answer, intervals included
    (the demo's B_crit interval had moved between two runs of identical curves)."""

    def answer(order):  # its rows keep the order given; every number must not
        result = sweep_analysis.analyse(order).to_json()
        result["trials"] = sorted(result["trials"], key=lambda row: row["run_id"])
        return json.dumps(result, sort_keys=True, default=str)

    assert answer(trials[::-1]) == answer(trials) == answer(sorted(trials, key=lambda t: t.run_id))


def test_a_report_run_later_logs_its_answer_to_the_sinks_too(store, tmp_path):
    """`report NAME` with tracking.sinks: the answer's metrics and tags it logs on the sweep's
    parent run reach the sinks as they reach MLflow (at the end of `sweep` they always did)."""
    from tests.unit import test_tracking_sinks as recorded

    sink = "tests.unit.test_tracking_sinks:Recording"
    overrides = [f"tracking.uri={store['uri']}", f"tracking.experiment={EXPERIMENT}", f"tracking.sinks=[{sink}]"]
    recorded.WRITES.clear()
    assert report.run(SWEEP, overrides, out=str(tmp_path / "out"), target_losses=None) == 0
    writes = [w for ws in recorded.WRITES.values() for w in ws if w[1] == store["parent"]]
    metrics = {k: v for kind, _, logged, *_ in writes if kind == "log_metrics" for k, v in logged.items()}
    tags = {k: v for kind, _, logged, *_ in writes if kind == "set_tags" for k, v in logged.items()}
    parent = Store(store["uri"]).get_run(store["parent"])
    assert metrics and metrics == {k: parent.metrics[k] for k in metrics}
    assert tags and tags == {k: parent.tags[k] for k in tags}
