"""MLflow compares at a glance (issues 35, 52): the links `ui` and `report` print open the UI on
the host and port it is served on, at the runs' chart view that compares every trial of the sweep
(the shared view state they write as an experiment tag: every trial visible, by batch size,
train/loss and eval/loss first against step = tokens, smoothed); a trial's run carries its batch
size's colour on the report's scale (mlflow.runColor); a run logs the params of its own workload
only, and a branch the batch it trains at. In memory and on a SQLite store; the browser's view of
the printed link is tests/integration/test_ui_browser.py's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse

import matplotlib
import numpy as np
import pytest

from orchestrator import cli
from orchestrator.core import config
from orchestrator.core.config import flatten, to_dict
from orchestrator.driver import run_life
from orchestrator.reporting.batch_colours import batch_hex
from orchestrator.tracking import compare_view, metric_logger, mlflow_ui, run_tags
from orchestrator.tracking.store import Store
from tests.conftest import ROOT, TINY, free_ports, sqlite_store
from tests.known_truth import World

EXPERIMENT = "orchestrator"
LINK = re.compile(r"http://([^/\s]+)/#/experiments/(\d+)/runs\?(\S+)")
RAMP = "[{from_tokens: 0, tokens_per_update: 256}, {from_tokens: 16384, tokens_per_update: 1024}]"
"""A base run's 256 tokens per update, then 1,024 from 16,384 tokens on: a branch's ramp."""


def _sweep(uri: str, name: str, runs, world=None):
    """A sweep's parent run and one child per (batch, lr), logged in the order given; with a
    world, each child holds that world's curves. Returns (parent, child ids by (batch, lr))."""
    store = Store(uri, EXPERIMENT)
    parent = store.create_run(name, tags={run_tags.ROLE_TAG: run_tags.SWEEP_ROLE, run_tags.SWEEP_TAG: name})
    ids = {}
    for batch, lr in runs:
        run_id = store.create_run(f"B={batch} lr={lr}", tags={run_tags.PARENT_TAG: parent, run_tags.SWEEP_TAG: name})
        store.log_metrics(run_id, {"train/tokens_per_update": batch}, step=0)  # as every update logs it
        if world is None:
            store.log_params(run_id, {"batch.tokens_per_update": batch, "optim.lr": lr})
        else:
            (run,) = world.simulate([(batch, lr, 0)])
            store.log_params(run_id, world.params(run))
            logger = metric_logger.MetricLogger(uri, run_id, flush_every_s=60)
            for metric, points in (("train/loss", run.train), ("eval/loss", run.eval)):
                for step, value in points:
                    logger.log({metric: value}, step=step)
            logger.close()
        store.finish_run(run_id)
        ids[batch, lr] = run_id
    store.finish_run(parent)
    return parent, ids


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two sweeps, the newer second: its runs logged out of order."""
    uri = sqlite_store(tmp_path_factory.mktemp("ui"))
    older = _sweep(uri, "older", [(256, 1e-3)])
    newer = _sweep(uri, "newer", [(1024, 1e-3), (256, 2e-3), (256, 1e-3), (512, 1e-3)])
    return {"uri": uri, "older": older, "newer": newer}


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _printed_view(uri: str, text: str):
    """(host:port, experiment id, share key, the view state) of the one compare link in `text`,
    the state read back as the UI reads it: the experiment's tag that the link's key names."""
    ((where, experiment, query),) = LINK.findall(text)
    fields = dict(urllib.parse.parse_qsl(query))
    assert (fields["compareRunsMode"], fields["workflowType"]) == ("CHART", "machine_learning"), fields
    key = fields["viewStateShareKey"]
    tags = _client(uri).get_experiment(experiment).tags
    return where, experiment, key, json.loads(tags[compare_view.VIEW_TAG_PREFIX + key])


def _listed(uri: str, experiment: str, state) -> list:
    """The runs the view lists, in its order: MLflow's search with the view's filter and sort."""
    order = f"{state['orderByKey']} {'ASC' if state['orderByAsc'] else 'DESC'}"
    runs = _client(uri).search_runs([experiment], filter_string=state["searchFilter"], order_by=[order])
    return [r.info.run_id for r in runs]


def _views(uri: str, experiment: str):
    return {k: v for k, v in _client(uri).get_experiment(experiment).tags.items() if k.startswith("mlflow.shared")}


def test_ui_prints_the_newest_sweeps_link_at_its_own_port(store, monkeypatch, capsys):
    served = []
    monkeypatch.setattr(mlflow_ui, "_serve_until_stopped", lambda cmd, env: served.append(cmd) or 0)
    (port,) = free_ports(1)
    assert port != mlflow_ui.DEFAULT_PORT
    assert cli.main(["ui", f"tracking.uri={store['uri']}", "--port", str(port)]) == 0
    out = capsys.readouterr().out
    where, experiment, _, state = _printed_view(store["uri"], out)
    assert where == f"127.0.0.1:{port}" and served[0][served[0].index("--port") + 1] == str(port)
    parent, ids = store["newer"]
    assert state["searchFilter"] == f"tags.`mlflow.parentRunId` = '{parent}'"  # a trial started later shows too
    batch_of = {run_id: batch for (batch, _), run_id in ids.items()}
    assert [batch_of[r] for r in _listed(store["uri"], experiment, state)] == [256, 256, 512, 1024]  # by batch size
    assert "every trial of sweep 'newer' on one chart" in out
    assert f"http://127.0.0.1:{port}/#/experiments/" in out
    assert cli.main(["ui", f"tracking.uri={store['uri']}", "--port", str(port), "--sweep", "older"]) == 0
    where, experiment, _, state = _printed_view(store["uri"], capsys.readouterr().out)
    assert where == f"127.0.0.1:{port}"
    assert _listed(store["uri"], experiment, state) == list(store["older"][1].values())


def test_the_view_shows_every_trials_losses_against_tokens_smoothed(store, monkeypatch, capsys):
    """What the UI reads from the tag (mlflow/server/js/src/experiment-tracking/components/
    experiment-page/models/ExperimentPageUIState.tsx and runs-charts/runs-charts.types.ts): the
    chart view's first section holds a line chart of train/loss and one of eval/loss against step
    (tokens), smoothed; every run of the list is drawn (not MLflow's first 10); the sections keep
    that order. Written again, the view is the same tag with the same value."""
    monkeypatch.setattr(mlflow_ui, "_serve_until_stopped", lambda cmd, env: 0)
    args = ["ui", f"tracking.uri={store['uri']}", "--port", str(free_ports(1)[0]), "--sweep", "newer"]
    assert cli.main(args) == 0
    _, experiment, key, state = _printed_view(store["uri"], capsys.readouterr().out)
    parent = store["newer"][0]
    assert key == compare_view.view_key(parent) and parent in key
    assert state["runsHiddenMode"] == "SHOW_ALL" and state["runListHidden"] is False
    assert state["orderByKey"] == "metrics.`train/tokens_per_update`" and state["orderByAsc"] is True
    first = state["compareRunSections"][0]
    assert state["isAccordionReordered"] is True and first["display"] is True
    charts = [c for c in state["compareRunCharts"] if c["metricSectionId"] == first["uuid"]]
    assert [c["metricKey"] for c in charts] == ["train/loss", "eval/loss"]
    for chart in charts:
        assert chart["type"] == "LINE" and chart["selectedMetricKeys"] == [chart["metricKey"]] and not chart["deleted"]
        assert chart["useGlobalXaxisKey"]
    assert state["globalLineChartConfig"]["xAxisKey"] == "step"  # the step of every curve is tokens seen
    assert 0 < state["globalLineChartConfig"]["lineSmoothness"] <= 100  # MLflow's slider: 0 is raw
    train, evaluation = charts
    assert train["useGlobalLineSmoothing"]  # train/loss smoothed (per-update batches: noisy) ...
    assert not evaluation["useGlobalLineSmoothing"] and evaluation["lineSmoothness"] == 0  # ... eval/loss raw
    written = _views(store["uri"], experiment)
    assert cli.main(args) == 0
    capsys.readouterr()
    assert _views(store["uri"], experiment) == written  # idempotent: no second tag, no new value


def test_a_sweep_that_reused_runs_lists_them_by_id(tmp_path, monkeypatch, capsys):
    """A sweep that reused a finished run of an earlier sweep compares it too: its view lists its
    runs by id (a search filter has no 'or' to add the reused run to the children)."""
    monkeypatch.setattr(mlflow_ui, "_serve_until_stopped", lambda cmd, env: 0)
    uri = sqlite_store(tmp_path)
    _, earlier = _sweep(uri, "earlier", [(256, 1e-3), (512, 1e-3)])
    parent, later = _sweep(uri, "later", [(1024, 1e-3)])
    Store(uri).set_tags(earlier[512, 1e-3], {f"{run_tags.REUSED_BY_PREFIX}{parent}": parent})
    assert cli.main(["ui", f"tracking.uri={uri}", "--port", str(free_ports(1)[0]), "--sweep", "later"]) == 0
    _, experiment, _, state = _printed_view(uri, capsys.readouterr().out)
    assert state["searchFilter"].startswith("attributes.run_id IN (")
    assert _listed(uri, experiment, state) == [earlier[512, 1e-3], later[1024, 1e-3]]


def test_ui_of_a_sweep_it_does_not_have_is_exit_2_before_anything_starts(store, monkeypatch, capsys):
    served = []
    monkeypatch.setattr(mlflow_ui, "_serve_until_stopped", lambda cmd, env: served.append(cmd) or 0)
    (port,) = free_ports(1)
    experiment = Store(store["uri"], EXPERIMENT).experiment_id()
    views = _views(store["uri"], experiment)
    assert cli.main(["ui", f"tracking.uri={store['uri']}", "--port", str(port), "--sweep", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error: --sweep: no sweep named 'nope'" in err, err
    assert served == [] and _views(store["uri"], experiment) == views  # no view written


def test_a_link_to_a_ui_on_every_interface_browses_to_this_machine():
    assert mlflow_ui.browse_host("0.0.0.0") == "127.0.0.1" and mlflow_ui.browse_host("::") == "127.0.0.1"
    assert mlflow_ui.browse_host("::1") == "[::1]" and mlflow_ui.browse_host("10.0.0.7") == "10.0.0.7"


def test_report_prints_its_links_for_the_ui_port_it_is_given(store, tmp_path, capsys):
    world = World(max_points=60)
    parent, ids = _sweep(store["uri"], "world", [(b, lr) for b in (1024, 256, 512) for lr in (0.008, 0.004)], world)
    args = ["report", "world", f"tracking.uri={store['uri']}", "--out", str(tmp_path / "out"), "--ui-port", "5057"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert f"orchestrator ui tracking.uri={store['uri']} --port 5057" in out
    where, experiment, key, state = _printed_view(store["uri"], out)
    assert where == "127.0.0.1:5057" and key == compare_view.view_key(parent)
    batch_of = {run_id: batch for (batch, _), run_id in ids.items()}
    assert [batch_of[r] for r in _listed(store["uri"], experiment, state)] == [256, 256, 512, 512, 1024, 1024]


def test_a_runs_colour_is_its_batch_sizes_on_the_reports_scale():
    """viridis over log B from the smallest batch size to the largest, as the report's colour bar."""
    batches = [256, 512, 1024, 2048]
    viridis = matplotlib.colormaps["viridis"]
    for b in batches:
        share = (np.log(b) - np.log(256)) / (np.log(2048) - np.log(256))
        assert batch_hex(b, batches) == matplotlib.colors.to_hex(viridis(share)), b
    assert re.fullmatch(r"#[0-9a-f]{6}", batch_hex(256, [256]))


def _ramped_branch(tmp_path):
    """A branch of a 256-token base run at 16,384 tokens, at 1,024 tokens per update."""
    (tmp_path / "checkpoint_000001" / "state").mkdir(parents=True)
    return config.load(
        TINY,
        [
            "data.seq_len=64",
            "model.max_seq_len=64",
            f"batch.ramp={RAMP}",
            f"train.start_from_checkpoint={tmp_path / 'checkpoint_000001'}",
            "train.stop_at_tokens=32768",
        ],
    )


def test_a_run_logs_the_params_of_its_own_workload_and_a_branch_its_own_batch(tmp_path):
    linreg_only, hf_only = {"model.dim", "model.noise_std", "model.w_star_norm"}, "model.hf."
    TEXT_DATA = ("data.tokenizer", "data.eval_fraction", "data.max_documents_per_source", "data.shard_dir")
    text_only = {"model.n_layers", "model.n_heads", "model.d_model", "model.mlp_ratio", "model.max_seq_len"}
    for name, absent, prefixes in (
        ("gpt", linreg_only, (hf_only,)),
        ("linreg", text_only | {"model.vocab_size", *TEXT_DATA}, (hf_only, "data.sources.")),
    ):
        cfg = config.load(TINY, [f"model.name={name}"])
        params, whole = run_life.run_params(cfg), flatten(to_dict(cfg))
        dropped = {k for k in whole if k not in params}
        assert dropped == {k for k in whole if k in absent or k.startswith(prefixes)}, name
        assert set(params) - set(whole) <= {k for k in params if k.endswith(("_effective", "_rounded", "_steps"))} | {
            "model.params"
        }, name
    gpt = run_life.run_params(config.load(TINY))
    assert "model.n_layers" in gpt and "data.sources.0.name" in gpt and "model.hf.architecture" not in gpt
    branch = _ramped_branch(tmp_path)
    assert branch.batch.tokens_per_update == 256  # the config's: the ramp's first, the base's
    assert run_life.own_batch(branch) == 1024 and run_life.run_params(branch)["batch.tokens_per_update"] == 1024
    fresh = config.load(TINY, ["data.seq_len=64", "model.max_seq_len=64", f"batch.ramp={RAMP}"])
    assert run_life.run_params(fresh)["batch.tokens_per_update"] == 256  # a ramp trained from 0 starts at its first


def test_a_trial_colours_its_run_without_the_analysis():
    """A trial's process picks its run's colour as it opens the run: matplotlib's colour scale
    only, not the report's figures with the analysis they import (scipy.stats among it), which
    every trial process would import for nothing."""
    script = (
        "import sys, types\n"
        "from orchestrator.core import config\n"
        "from orchestrator.driver import trial\n"
        "cfg = config.load('conf/train/linreg.yaml', ['batch.tokens_per_update=512'])\n"
        "assert trial._colour(types.SimpleNamespace(batches=[256, 1024]), cfg)\n"
        "heavy = [m for m in ('scipy.stats', 'orchestrator.analysis.trials') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True)


def test_a_view_that_cannot_be_written_leaves_a_link_to_the_experiments_runs(store, monkeypatch, caplog):
    """A store this user may read but not write (a teammate's): the report still prints a link,
    to the experiment's runs, and says why it is not the compare view."""

    def refused(*args, **kwargs):
        raise PermissionError("read-only store")

    monkeypatch.setattr(Store, "set_experiment_tag", refused)
    parent, ids = store["newer"]
    experiment = Store(store["uri"]).get_run(parent).experiment_id
    link = mlflow_ui.compare_view_link(store["uri"], parent, list(ids.values()), 5001)
    assert link == f"http://127.0.0.1:5001/#/experiments/{experiment}?workflowType=machine_learning"
    assert any("read-only store" in r.getMessage() for r in caplog.records)
