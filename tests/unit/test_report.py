"""`orchestrator report` on a synthetic sweep logged to a temporary MLflow store.

The synthetic loss curves follow the empirical model exactly: a trial with batch B and learning
rate lr at optimizer step s has loss g(x) with progress x = s * q(lr / lr_opt(B)) / (1 + B_CRIT / B),
g decreasing. At the best lr (q = 1) the steps to reach any loss L are
S = g^-1(L) (1 + B_CRIT / B) = S_min + E_min / B with E_min / S_min = B_CRIT, for every L.
Other learning rates progress more slowly (q < 1), so they are worse at every point.
"""

from __future__ import annotations

import json
import math
import time

import matplotlib.image as mpimg
import pytest

from orchestrator import report, tracking
from orchestrator.errors import ConfigError

B_CRIT = 5000.0  # tokens
ALPHA, LR_AT_4096 = 0.5, 3e-3  # lr_opt(B) = LR_AT_4096 * (B / 4096)^ALPHA
BATCHES = [2**k for k in range(10, 16)]
LR_FACTORS = [2**-0.5, 1.0, 2**0.5]  # on the same sqrt(2) grid as lr_opt, so lrs share heatmap rows
TOTAL_TOKENS = 2**22
L_INF, AMP, X0, POWER = 2.0, 8.0, 5.0, 0.7
EXPERIMENT = "report-test"
SWEEP = "synthetic-bcrit"
FIGURES = ["loss_vs_tokens.png", "loss_vs_steps.png", "eval_heatmap.png", "critical_batch.png", "lr_vs_batch.png"]
FILES = FIGURES + ["summary.md", "summary.html", "report.json"]


def g(x):
    return L_INF + AMP / (1 + x / X0) ** POWER


def g_inverse(loss):
    return X0 * ((AMP / (loss - L_INF)) ** (1 / POWER) - 1)


def lr_opt(b):
    return LR_AT_4096 * (b / 4096) ** ALPHA


def _log_trial(uri, parent, b, factor, diverge=False):
    lr = lr_opt(b) * factor
    q = 1.0 / (1.0 + 2.0 * math.log2(factor) ** 2)
    run_id = tracking.create_run(uri, EXPERIMENT, f"B{b}-lr{lr:.3g}", tags={tracking.PARENT_TAG: parent})
    steps = TOTAL_TOKENS // b
    tracking.log_params(uri, run_id, {
        "batch.tokens_per_update": b, "optim.lr": lr, "schedule.warmup_tokens": 8 * b, "schedule.decay": "cosine",
        "schedule.min_lr_ratio": 0.1, "train.total_tokens": TOTAL_TOKENS, "data.seq_len": 128,
        "train.total_steps": steps})
    logger = tracking.MetricLogger(uri, run_id, flush_every_s=60)
    stride = max(1, steps // 200)
    for s in range(stride, steps + 1, stride):
        loss = g(s * q / (1 + B_CRIT / b))
        if diverge and s > steps // 3:
            loss = loss + (s - steps // 3) * 0.5
        metrics = {"train/loss": loss, "gns/b_simple": 1000.0 / (loss - L_INF), "train/optimizer_step": s}
        if not diverge and s % max(stride, steps // 8) < stride:
            metrics["eval/loss"] = loss + 0.05
        logger.log(metrics, step=s * b)
    logger.close()
    start = tracking.get_run(uri, run_id).info.start_time
    duration_ms = int(1000 * TOTAL_TOKENS / (1e4 * math.log2(b)))  # bigger batches run faster
    tracking.client(uri).set_terminated(run_id, "FAILED" if diverge else "FINISHED", end_time=start + duration_ms)
    return run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A sweep parent, 6 batch sizes x 3 learning rates, one diverged run, and a lone run."""
    tmp = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{tmp}/mlflow.db"
    parent = tracking.create_run(uri, EXPERIMENT, SWEEP, tags={"orchestrator.role": "sweep", tracking.SWEEP_TAG: SWEEP})
    tracking.log_params(uri, parent, {"sweep.name": SWEEP})
    for b in BATCHES:
        for factor in LR_FACTORS:
            _log_trial(uri, parent, b, factor)
    _log_trial(uri, parent, 2**13, 2.0, diverge=True)
    tracking.finish_run(uri, parent)
    lone = tracking.create_run(uri, EXPERIMENT, "lone-train-run")
    tracking.log_params(uri, lone, {"batch.tokens_per_update": 4096, "optim.lr": 1e-3})
    logger = tracking.MetricLogger(uri, lone, flush_every_s=60)
    for s in range(1, 101):
        logger.log({"train/loss": g(s / 2.0), "eval/loss": g(s / 2.0) + 0.05}, step=s * 4096)
    logger.close()
    tracking.finish_run(uri, lone)
    return {"uri": uri, "parent": parent, "lone": lone, "tmp": tmp}


@pytest.fixture(scope="module")
def sweep_report(store):
    out = store["tmp"] / "report"
    t0 = time.time()
    overrides = [f"tracking.uri={store['uri']}", f"tracking.experiment={EXPERIMENT}"]
    assert report.run(SWEEP, overrides, out=str(out), target_losses=None) == 0
    return {"out": out, "seconds": time.time() - t0, "json": json.loads((out / "report.json").read_text())}


# ---------------------------------------------------------------- the numbers


@pytest.mark.parametrize("target", [2.95, 3.3, 4.0])
def test_b_crit_recovered_at_given_targets(store, target):
    result = report.analyse(report.read_trials(store["uri"], store["parent"]), [target])
    fit = result["critical_batch"][0]
    assert len(fit["points"]) == len(BATCHES) and not fit["missing"]
    assert fit["b_crit"] == pytest.approx(B_CRIT, rel=0.05)
    assert fit["s_min"] == pytest.approx(g_inverse(target), rel=0.05)
    lo, hi = fit["b_crit_interval"]
    assert lo <= fit["b_crit"] <= hi
    # B_simple was logged as 1000 / (loss - L_inf): at the crossing it is 1000 / (target - L_inf).
    assert fit["b_simple"] == pytest.approx(1000 / (target - L_INF), rel=0.03)
    for p in fit["points"]:  # the fastest trial to any loss is the one at lr_opt
        assert p["lr"] == pytest.approx(lr_opt(p["batch"]))
        assert p["tokens"] == pytest.approx(p["steps"] * p["batch"])


def test_automatic_targets_are_reached_by_every_batch_size(sweep_report):
    result = sweep_report["json"]
    assert result["targets_chosen"] and len(result["critical_batch"]) == 3
    for fit in result["critical_batch"]:
        assert not fit["missing"] and len(fit["points"]) == len(BATCHES)
        assert fit["b_crit"] == pytest.approx(B_CRIT, rel=0.05)
    primary = result["primary"]
    assert primary["target_loss"] == min(f["target_loss"] for f in result["critical_batch"])


def test_best_lr_per_batch_and_alpha(sweep_report):
    scaling = sweep_report["json"]["lr_scaling"]
    assert [p["batch"] for p in scaling["best"]] == BATCHES
    for p in scaling["best"]:
        assert p["lr"] == pytest.approx(lr_opt(p["batch"]))
    assert scaling["alpha"] == pytest.approx(ALPHA, abs=1e-6)
    assert scaling["coef"] == pytest.approx(LR_AT_4096 / 4096**ALPHA, rel=1e-6)


def test_best_config_and_failed_run_excluded(sweep_report):
    result = sweep_report["json"]
    best = result["best"]
    # With a fixed token budget the smallest batch makes the most progress: B = 1024 at lr_opt.
    assert best["batch"] == BATCHES[0] and best["lr"] == pytest.approx(lr_opt(BATCHES[0]))
    assert best["status"] == "FINISHED" and result["loss_metric"] == "eval/loss"
    assert best["warmup_tokens"] == 8 * BATCHES[0] and best["decay"] == "cosine"


def test_wall_time_is_the_run_share_of_duration(sweep_report):
    for p in sweep_report["json"]["primary"]["points"]:
        duration = TOTAL_TOKENS / (1e4 * math.log2(p["batch"]))
        assert p["wall_s"] == pytest.approx(duration * p["tokens"] / TOTAL_TOKENS, rel=0.02)


def test_critical_batch_summary_for_the_sweep_command(store):
    summary = report.critical_batch_summary(store["uri"], store["parent"])
    assert summary["b_crit"] == pytest.approx(B_CRIT, rel=0.05)
    lo, hi = summary["b_crit_interval"]
    assert lo <= summary["b_crit"] <= hi
    assert summary["b_simple"] == pytest.approx(1000 / (summary["target_loss"] - L_INF), rel=0.03)


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
    assert "B_crit" in md and "<table>" in page
    assert sweep_report["seconds"] < 60


def test_single_run_report(store, tmp_path, capsys):
    out = tmp_path / "lone"
    assert report.run(store["lone"], [f"tracking.uri={store['uri']}"], out=str(out), target_losses=None) == 0
    for name in ["loss_vs_tokens.png", "loss_vs_steps.png", "summary.md", "summary.html", "report.json"]:
        assert (out / name).is_file(), name
    result = json.loads((out / "report.json").read_text())
    assert result["source"]["kind"] == "single" and result["primary"]["b_crit"] is None
    notes = " ".join(result["primary"]["notes"])
    assert "at least 2 batch sizes" in notes and "no gns/b_simple" in notes
    assert "No critical batch size" in capsys.readouterr().out
    assert "report/loss_vs_tokens.png" in tracking.list_artifacts(store["uri"], store["lone"], "report")


def test_unknown_sweep_is_a_config_error(store, tmp_path):
    with pytest.raises(ConfigError, match="no-such-sweep"):
        report.run("no-such-sweep", [f"tracking.uri={store['uri']}"], out=str(tmp_path), target_losses=None)
    with pytest.raises(ConfigError, match="tracking.uri"):
        report.run(SWEEP, [f"tracking.uri=sqlite:///{tmp_path}/missing.db"], out=str(tmp_path), target_losses=None)


def test_sweep_file_names_the_sweep(store, tmp_path):
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(f"name: {SWEEP}\nbase:\n  config: conf/train/tiny.yaml\n  overrides:\n"
                          f"    - tracking.uri={store['uri']}\n    - optim.lr=1e-3\n")
    uri, name, run_id = report.resolve(str(sweep_file), [])
    assert (uri, name, run_id) == (store["uri"], SWEEP, store["parent"])


# ---------------------------------------------------------------- the real command line


def test_cli_report_and_unknown_sweep(store, tmp_path, cli):
    out = tmp_path / "cli-report"
    code, stdout, stderr = cli("report", SWEEP, f"tracking.uri={store['uri']}", "--out", out, "--target-loss", "3.0")
    assert code == 0, stderr
    assert "summary.md" in stdout and "B_crit" in stdout
    assert all((out / name).is_file() for name in FILES)
    assert json.loads((out / "report.json").read_text())["critical_batch"][0]["target_loss"] == 3.0
    code, stdout, stderr = cli("report", "no-such-sweep", f"tracking.uri={store['uri']}", "--out", tmp_path / "x")
    assert code == 2
    assert len(stderr.strip().splitlines()) == 1 and "no-such-sweep" in stderr, stderr


# ---------------------------------------------------------------- graceful when the data cannot answer


def test_target_not_reached_by_every_batch_size(store):
    trials = report.read_trials(store["uri"], store["parent"])
    nobody, partly = report.analyse(trials, [2.5, 1.0])["critical_batch"]  # sorted by loss
    assert partly["missing"] == [2**14, 2**15] and len(partly["points"]) == 4
    assert partly["b_crit"] == pytest.approx(B_CRIT, rel=0.05)  # still fitted on the batch sizes that reached it
    assert "not reached by batch sizes 16,384, 32,768" in partly["notes"]
    assert nobody["points"] == [] and nobody["b_crit"] is None and nobody["b_simple"] is None
    assert any("at least 2 batch sizes" in n for n in nobody["notes"])
    summary = report.critical_batch_summary(store["uri"], store["parent"], [1.0])
    assert summary["b_crit"] is None and summary["notes"]


def test_report_without_eval_or_gns_or_reachable_target(store, tmp_path):
    trials = report.read_trials(store["uri"], store["parent"])
    for t in trials:
        t.eval, t.b_simple = [], []
    result = report.analyse(trials, [1.0])
    assert result["loss_metric"] == "train/loss"
    assert result["best"]["batch"] == BATCHES[0] and result["lr_scaling"]["alpha"] == pytest.approx(ALPHA, abs=1e-6)
    assert "No critical batch size at loss 1" in report.answer(result)
    written = {p.name for p in report.write_report(trials, result, "degenerate", tmp_path)}
    assert "critical_batch.png" not in written and {"loss_vs_tokens.png", "summary.md", "report.json"} <= written
    assert "no gns/b_simple" in (tmp_path / "summary.md").read_text()
