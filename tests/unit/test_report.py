"""`orchestrator report` and the analysis behind it, on synthetic sweeps whose answer is known
(tests/synthetic_sweep.py: the empirical model with a known B_crit and seed noise)."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import matplotlib.image as mpimg
import numpy as np
import pytest

from orchestrator import analysis, noise, report, report_render, tracking
from orchestrator.errors import ConfigError
from tests.synthetic_sweep import (
    ALPHA,
    B_CRIT,
    BATCHES,
    L_INF,
    LR_AT_4096,
    LR_FACTORS,
    SEED_NOISE,
    SEEDS,
    TOTAL_TOKENS,
    g,
    in_memory,
    lr_opt,
)
from tests.synthetic_sweep import specs as sweep_trials
from tests.synthetic_sweep import trial as synthetic_trial

EXPERIMENT = "report-test"
SWEEP = "synthetic-bcrit"
STOP_RUNG = 2**20
FIGURES = ["loss_vs_tokens.png", "loss_vs_steps.png", "eval_heatmap.png", "critical_batch.png", "lr_vs_batch.png"]
FILES = FIGURES + ["summary.md", "summary.html", "report.json"]


def _log_trial(uri, parent, b, factor, seed, luck, **kw):
    params, train, evals, b_simple, status, stopped, duration = synthetic_trial(b, factor, seed, luck, **kw)
    run_id = tracking.create_run(uri, EXPERIMENT, params["train.run_name"], tags={tracking.PARENT_TAG: parent})
    tracking.log_params(uri, run_id, params)
    logger = tracking.MetricLogger(uri, run_id, flush_every_s=60)
    for (step, loss), (_, bs) in zip(train, b_simple):
        logger.log({"train/loss": loss, "gns/b_simple": bs}, step=step)
    for step, loss in evals:
        logger.log({"eval/loss": loss}, step=step)
    logger.close()
    if stopped:
        tracking.set_tags(uri, run_id, {tracking.STOPPED_AT_TAG: str(stopped)})
    start = tracking.get_run(uri, run_id).info.start_time
    tracking.client(uri).set_terminated(run_id, status, end_time=start + int(1000 * duration))
    return run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A sweep parent: 6 batch sizes x 3 learning rates x 3 seeds, one diverged run, two runs
    stopped early at a rung; and a lone run."""
    tmp = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{tmp}/mlflow.db"
    parent = tracking.create_run(uri, EXPERIMENT, SWEEP, tags={"orchestrator.role": "sweep", tracking.SWEEP_TAG: SWEEP})
    specs = sweep_trials(np.random.default_rng(7))
    for spec in specs:
        _log_trial(uri, parent, *spec)
    _log_trial(uri, parent, 2**13, 2.0, 0, 1.0, diverge=True)
    for seed in range(2):  # a poor learning rate, stopped early
        _log_trial(uri, parent, 2**12, 4.0, seed, 1.0, stop_at=STOP_RUNG)
    tracking.finish_run(uri, parent)
    lone = tracking.create_run(uri, EXPERIMENT, "lone-train-run")
    tracking.log_params(uri, lone, {"batch.tokens_per_update": 4096, "optim.lr": 1e-3})
    logger = tracking.MetricLogger(uri, lone, flush_every_s=60)
    for s in range(1, 101):
        logger.log({"train/loss": g(s / 2.0), "eval/loss": g(s / 2.0) + 0.05}, step=s * 4096)
    logger.close()
    tracking.finish_run(uri, lone)
    return {"uri": uri, "parent": parent, "lone": lone, "tmp": tmp, "specs": specs}


@pytest.fixture(scope="module")
def sweep_report(store):
    out = store["tmp"] / "report"
    t0 = time.time()
    overrides = [f"tracking.uri={store['uri']}", f"tracking.experiment={EXPERIMENT}"]
    assert report.run(SWEEP, overrides, out=str(out), target_losses=None) == 0
    return {"out": out, "seconds": time.time() - t0, "json": json.loads((out / "report.json").read_text())}


@pytest.fixture(scope="module")
def trials(store):
    return report.read_trials(store["uri"], store["parent"])


# ---------------------------------------------------------------- the numbers


def test_interval_covers_the_true_b_crit_over_repeated_sweeps():
    """50 synthetic sweeps with 3 seeds per configuration: the 90% interval holds the true B_crit
    in at least 80% of them (0.9 expected; 0.8 leaves room for 50 draws and the smoothing)."""
    covered, widths = 0, []
    for draw in range(50):
        result = analysis.analyse(in_memory(sweep_trials(np.random.default_rng(1000 + draw))), [3.3])
        lo, hi = result["critical_batch"][0]["b_crit_interval"]
        covered += lo <= B_CRIT <= hi
        widths.append(hi / lo)
    print(f"coverage {covered}/50, median interval {np.median(widths):.2f}x")
    assert covered >= 40, covered


@pytest.mark.parametrize("target", [2.95, 3.3, 4.0])
def test_b_crit_recovered_at_given_targets(trials, target):
    fit = analysis.analyse(trials, [target])["critical_batch"][0]
    assert len(fit["points"]) == len(BATCHES) and not fit["missing"]
    assert fit["b_crit"] == pytest.approx(B_CRIT, rel=0.1)
    lo, hi = fit["b_crit_interval"]
    assert lo < fit["b_crit"] < hi and hi / lo < 2.5
    # B_simple was logged as 1000 / (loss - L_inf): at the crossing it is 1000 / (target - L_inf).
    assert fit["b_simple"] == pytest.approx(1000 / (target - L_INF), rel=0.03)
    for p in fit["points"]:  # the fastest configuration to any loss is the one at lr_opt
        assert p["lr"] == pytest.approx(lr_opt(p["batch"])) and p["seeds"] == SEEDS
        assert p["tokens"] == pytest.approx(p["steps"] * p["batch"])


def test_the_report_through_mlflow_matches_the_analysis_in_memory(store, trials):
    """The one draw that goes through MLflow gives what the same runs give in memory."""
    stored = analysis.analyse(trials, [3.3])["critical_batch"][0]
    fresh = [t for t in in_memory(store["specs"])]
    direct = analysis.analyse(fresh, [3.3])["critical_batch"][0]
    assert stored["b_crit"] == pytest.approx(direct["b_crit"], rel=1e-9)
    assert stored["b_crit_interval"] == pytest.approx(direct["b_crit_interval"], rel=1e-9)


def test_automatic_targets_are_reached_by_every_batch_size(sweep_report):
    result = sweep_report["json"]
    assert result["targets_chosen"] and len(result["critical_batch"]) == 3
    for fit in result["critical_batch"]:
        assert not fit["missing"] and len(fit["points"]) == len(BATCHES)
        assert fit["b_crit"] == pytest.approx(B_CRIT, rel=0.1)
    primary = result["primary"]
    assert primary["target_loss"] == min(f["target_loss"] for f in result["critical_batch"])


def test_best_configuration_per_batch_size_over_every_swept_axis(sweep_report):
    result = sweep_report["json"]
    assert result["axes"] == ["batch.tokens_per_update", "optim.lr"]
    best = result["best_per_batch"]
    assert [r["batch"] for r in best] == BATCHES
    for r in best:
        assert float(r["settings"]["optim.lr"]) == pytest.approx(lr_opt(r["batch"])) and r["seeds"] == SEEDS
    assert result["lr_scaling"]["alpha"] == pytest.approx(ALPHA, abs=1e-6)
    assert result["lr_scaling"]["coef"] == pytest.approx(LR_AT_4096 / 4096**ALPHA, rel=1e-6)


def test_best_configuration_counts_only_finished_trials(sweep_report):
    result = sweep_report["json"]
    best = result["best"]
    # With a fixed token budget the smallest batch makes the most progress: B = 1024 at lr_opt.
    assert best["batch"] == BATCHES[0] and best["lr"] == pytest.approx(lr_opt(BATCHES[0]))
    assert result["loss_metric"] == "eval/loss"
    assert result["finished"] == len(BATCHES) * len(LR_FACTORS) * SEEDS and result["failed"] == 1
    assert result["stopped"] == {"count": 2, "rungs": {str(STOP_RUNG): 2}}
    outcomes = {t["run_name"]: t["outcome"] for t in result["trials"]}
    assert sum(
        o == "stopped" for o in outcomes.values()
    ) == 2 and "2 stopped early (2 at the 1.05M-token rung)" in report_render.answer(result)


def test_wall_time_is_the_run_share_of_duration(sweep_report):
    for p in sweep_report["json"]["primary"]["points"]:
        duration = TOTAL_TOKENS / (1e4 * math.log2(p["batch"]))
        assert p["wall_s"] == pytest.approx(duration * p["tokens"] / TOTAL_TOKENS, rel=0.06)


def test_steps_come_only_from_the_part_the_schedule_cannot_fake(store):
    """A wsd run whose loss falls to a target only during its final decay does not count as
    reaching it; a cosine sweep is read over the first half of its budget, with a warning."""
    rng = np.random.default_rng(3)
    wsd = in_memory(sweep_trials(rng, seeds=1), decay="wsd")
    for t in wsd:  # the anneal: a sharp extra drop in the last 20% of the budget
        t.train = [(tok, loss - (0.3 if tok > 0.8 * TOTAL_TOKENS else 0.0)) for tok, loss in t.train]
    end_of_stable = min(
        float(np.interp(0.8 * TOTAL_TOKENS, *t.smoothed(2 * BATCHES[-1]))) for t in wsd if t.batch == BATCHES[-1]
    )
    fit = analysis.analyse(wsd, [end_of_stable - 0.2])["critical_batch"][0]
    assert BATCHES[-1] in fit["missing"], "reached only in the decay, so not reached"
    cosine = analysis.analyse(in_memory(sweep_trials(rng, seeds=1), decay="cosine"), [3.3])["critical_batch"][0]
    assert any("the fit depends on the schedule" in n for n in cosine["notes"])
    assert (
        any("no interval: one seed per configuration" in n for n in cosine["notes"])
        and cosine["b_crit_interval"] is None
    )


def test_fewer_than_three_batch_sizes_is_not_resolved():
    specs = [s for s in sweep_trials(np.random.default_rng(5)) if s[0] in BATCHES[:2]]
    result = analysis.analyse(in_memory(specs), [3.3])
    fit = result["primary"]
    assert fit["b_crit"] is None and fit["b_crit_interval"] is None and len(fit["points"]) == 2
    assert "not resolved (B_crit needs 3 batch sizes that reach this loss; 2 did)" in report_render.answer(result)


# ---------------------------------------------------------------- the files


def test_every_file_written_and_logged(store, sweep_report):
    out = sweep_report["out"]
    for name in FILES:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    for name in FIGURES:
        assert (out / name).stat().st_size > 10_000, name
        image = mpimg.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 400 and image.std() > 0.01, name
    logged = set(tracking.list_artifacts(store["uri"], store["parent"], "report"))
    assert {f"report/{name}" for name in FILES} <= logged
    md, page = (out / "summary.md").read_text(), (out / "summary.html").read_text()
    for name in FIGURES:
        assert f"({name})" in md and f"src='{name}'" in page
    assert "B_crit" in md and "Best configuration per batch size" in md and "<table>" in page
    assert sweep_report["seconds"] < 60


def test_single_run_report(store, tmp_path, capsys):
    out = tmp_path / "lone"
    assert report.run(store["lone"], [f"tracking.uri={store['uri']}"], out=str(out), target_losses=None) == 0
    for name in ["loss_vs_tokens.png", "loss_vs_steps.png", "summary.md", "summary.html", "report.json"]:
        assert (out / name).is_file(), name
    result = json.loads((out / "report.json").read_text())
    assert result["source"]["kind"] == "single" and result["primary"]["b_crit"] is None
    notes = " ".join(result["primary"]["notes"])
    assert "needs 3 batch sizes" in notes and "no gns/b_simple" in notes
    assert "not resolved" in capsys.readouterr().out
    assert "report/loss_vs_tokens.png" in tracking.list_artifacts(store["uri"], store["lone"], "report")


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
    uri, name, run_id = report.resolve(str(sweep_file), [])
    assert (uri, name, run_id) == (store["uri"], SWEEP, store["parent"])


# ---------------------------------------------------------------- the real command line


def test_cli_report_and_unknown_sweep(store, tmp_path, cli):
    out = tmp_path / "cli-report"
    code, stdout, stderr = cli("report", SWEEP, f"tracking.uri={store['uri']}", "--out", out, "--target-loss", "3.0")
    assert code == 0, stderr
    assert "summary.md" in stdout and "B_crit" in stdout and "best configuration per batch size" in stdout
    assert all((out / name).is_file() for name in FILES)
    assert json.loads((out / "report.json").read_text())["critical_batch"][0]["target_loss"] == 3.0
    code, stdout, stderr = cli("report", "no-such-sweep", f"tracking.uri={store['uri']}", "--out", tmp_path / "x")
    assert code == 2
    assert len(stderr.strip().splitlines()) == 1 and "no-such-sweep" in stderr, stderr


# ---------------------------------------------------------------- graceful when the data cannot answer


def test_target_not_reached_by_every_batch_size(trials):
    nobody, partly = analysis.analyse(trials, [2.5, 1.0])["critical_batch"]  # sorted by loss
    assert partly["missing"] == [2**14, 2**15] and len(partly["points"]) == 4
    assert partly["b_crit"] == pytest.approx(B_CRIT, rel=0.1)  # still fitted on the batch sizes that reached it
    assert "not reached by batch sizes 16,384, 32,768" in partly["notes"]
    assert nobody["points"] == [] and nobody["b_crit"] is None and nobody["b_simple"] is None
    assert any("needs 3 batch sizes" in n for n in nobody["notes"])


def test_report_without_eval_or_gns_or_reachable_target(trials, tmp_path):
    trials = [dataclasses.replace(t, eval=[], b_simple=[]) for t in trials]
    result = analysis.analyse(trials, [1.0])
    assert result["loss_metric"] == "train/loss"
    assert result["best"]["batch"] == BATCHES[0] and result["lr_scaling"]["alpha"] == pytest.approx(ALPHA, abs=1e-6)
    assert "Critical batch size at loss 1: not resolved" in report_render.answer(result)
    written = {p.name for p in report.write_report(trials, result, "degenerate", tmp_path)}
    assert "critical_batch.png" not in written and {"loss_vs_tokens.png", "summary.md", "report.json"} <= written
    assert "no gns/b_simple" in (tmp_path / "summary.md").read_text()


def test_noise_fit_and_bootstrap_are_what_the_analysis_uses(trials):
    """The analysis's B_crit is noise.fit_critical_batch of its points (no second formula)."""
    fit = analysis.analyse(trials, [3.3])["critical_batch"][0]
    assert fit["b_crit"] == pytest.approx(
        noise.fit_critical_batch([p["batch"] for p in fit["points"]], [p["steps"] for p in fit["points"]])[2]
    )


def test_a_best_value_at_the_edge_of_the_swept_range_is_called_out(sweep_report):
    assert all(r["edges"] == {} for r in sweep_report["json"]["best_per_batch"])  # lr_opt is inside the grid
    rng = np.random.default_rng(9)
    specs = [(b, f, 0, float(np.exp(SEED_NOISE * rng.standard_normal()))) for b in BATCHES for f in (1.0, 2**0.5, 2.0)]
    result = analysis.analyse(in_memory(specs), [3.3])
    assert all(r["edges"] == {"optim.lr": "lowest"} for r in result["best_per_batch"])
    assert (
        "The best lr is the lowest tried at 6 of 6 batch sizes: the optimum may lie below the swept range."
        in report_render.answer(result)
    )
