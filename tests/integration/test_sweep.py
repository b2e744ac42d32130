"""Sweeps end to end through the command line: MLflow parent/children, retries from checkpoints,
ASHA at equal tokens, --resume after the driver is killed, bad sweep files. The commands run in
this process on the tests' Ray, but the killed driver's: a real `orchestrator sweep` process with
the local Ray it starts, killed together, then resumed by a command in this process."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.tracking import run_tags
from orchestrator.tracking.store import Store
from tests.conftest import ROOT, run_main, sqlite_store

pytestmark = pytest.mark.slow
SMOKE = ROOT / "conf" / "sweep" / "smoke.yaml"


def children(uri, sweep_name):
    parent = Store(uri, "orchestrator").find_sweep_run(sweep_name)
    assert parent, "no parent run"
    return parent, Store(uri).child_runs(parent)


def variant(tmp_path, name, **changes):
    """The smoke sweep with some keys changed, written into tmp_path."""
    body = yaml.safe_load(SMOKE.read_text())
    body["base"]["config"] = str(ROOT / "conf" / "train" / "tiny.yaml")
    body["name"] = name
    for key, value in changes.items():
        if key == "overrides":
            body["base"]["overrides"].update(value)
        else:
            body[key] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def assert_tune_keeps_no_copy_of_the_results(tune_folder, trials):
    """MLflow holds a sweep's results: Tune writes no result files of its own per trial, and its
    state keeps no running statistics of an ended trial's metrics (what grew with the trial count)."""
    copies = [
        p.name
        for pattern in ("result.json", "progress.csv", "events.out.tfevents*")
        for p in tune_folder.rglob(pattern)
    ]
    assert copies == []
    (state,) = tune_folder.glob("experiment_state-*.json")
    ended = [json.loads(metadata) for _, metadata in json.loads(state.read_text())["trial_data"]]
    assert len(ended) == trials and all(m["last_result"]["done"] for m in ended)
    assert [(m["metric_analysis"], m["metric_n_steps"]) for m in ended] == [({}, {})] * trials


def test_smoke_sweep_with_a_fault_in_every_trial(ray_session, tmp_path, monkeypatch, capsys):
    """4 trials; each fails once after its second checkpoint and is retried from it. Their
    micro-batch is `auto`: probed once for their one shape, against an artificial 12 MiB device.
    The command runs in this process on the tests' Ray, whose trials do not see this process's
    environment: both test hooks reach them because the command reads them (TrialSetup)."""
    uri = sqlite_store(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHESTRATOR_FAULT_AT_TOKENS", "36864")
    monkeypatch.setenv("ORCHESTRATOR_DEVICE_MEMORY", "12MiB")
    code, sweep_out, err = run_main(capsys, "sweep", SMOKE, f"tracking.uri={uri}", "batch.micro_batch_size=auto")
    assert code == 0, sweep_out[-3000:] + err[-3000:]
    out = sweep_out
    assert "Configuration for experiment" not in out and "TensorBoard" not in out  # the progress table alone
    assert (tmp_path / "reports" / "smoke" / "summary.html").is_file()  # the sweep wrote its report
    assert "Best configuration: B = " in out and "best configuration per batch size (swept: batch size, lr)" in out
    parent, runs = children(uri, "smoke")
    assert len(runs) == 4
    markers = list((tmp_path / "runs").rglob(".fault_injected"))
    assert len(markers) == 4, "every trial should have failed once"
    (probed,) = (tmp_path / "runs" / "micro_batch").glob("*.json")
    answer = json.loads(probed.read_text())
    assert answer["method"] == "probe" and sweep_out.count("batch.micro_batch_size auto:") == 1, "one probe"
    assert 8 < answer["micro_batch_size"] < 32, answer  # not the config's 8: b below follows the probe
    # single-worker trials ran in Ray Train's local mode: their checkpoints are Tune's
    tune_folder = next((tmp_path / "runs" / "sweeps" / "smoke").glob("*/tune"))
    assert len({p.parent for p in tune_folder.glob("*/checkpoint_*")}) == 4
    assert_tune_keeps_no_copy_of_the_results(tune_folder, trials=4)
    for run in runs:
        assert run.tags[run_tags.PARENT_TAG] == parent and run.status == "FINISHED"
        assert run.name.startswith("B=")
        steps = [s for s, _ in Store(uri).metric_history(run.run_id, "train/loss")]
        tpu = int(run.params["batch.tokens_per_update"])
        share = tpu // 64  # sequences of S = 64 per update, one worker
        # the largest b the probe allows that divides the share, at most half of it: B_simple
        # needs two micro-batches, so the update is split in two (derived.min_micro_batches)
        b = max(b for b in range(1, min(answer["micro_batch_size"], share // 2) + 1) if share % b == 0)
        assert (run.params["batch.micro_batch_size"], run.params["batch.grad_accum_steps"]) == (
            str(b),
            str(share // b),
        )
        assert steps == sorted(set(steps)), "steps unique and increasing"
        assert steps == list(range(0, 49152, tpu)), "every update once, none missing (at the tokens before it)"
    # the parent carries the sweep file and the all-trials plot
    names = {a.path for a in MlflowClient(uri).list_artifacts(parent)}
    assert {"smoke.yaml", "loss_vs_tokens.png"} <= names

    # `report` on the finished sweep: every plot and the summary, also logged to the parent
    code, out, err = run_main(capsys, "report", SMOKE, f"tracking.uri={uri}", "--out", tmp_path / "report")
    assert code == 0, out[-2000:] + err[-2000:]
    expected = {
        "loss_vs_tokens.png",
        "loss_vs_steps.png",
        "eval_heatmap.png",
        "critical_batch.png",
        "lr_vs_batch.png",
        "summary.md",
        "summary.html",
        "report.json",
    }
    assert expected <= {p.name for p in (tmp_path / "report").iterdir()}
    logged = {a.path.split("/")[-1] for a in MlflowClient(uri).list_artifacts(parent, "report")}
    assert expected <= logged, logged
    # the sweep's closing summary and `report` give the same answer, word for word
    answers = [line for line in (sweep_out + out).splitlines() if line.startswith("Best configuration:")]
    assert len(answers) == 2 and answers[0] == answers[1], answers

    # the same sweep in Python (orchestrator.results): the trials, and every point MLflow holds, value for value
    import pandas as pd

    from orchestrator.reporting.sweep_tables import load_sweep

    loaded = load_sweep(SMOKE, tracking_uri=uri)
    assert (loaded.name, loaded.run_id) == ("smoke", parent)
    assert len(loaded.trials) == 4 and set(loaded.trials["run_id"]) == {r.run_id for r in runs}
    assert set(loaded.trials["outcome"]) == {"finished"} and loaded.fit.finished == 4
    for run in runs:
        for metric in ("train/loss", "eval/loss"):
            held = Store(uri).metric_history(run.run_id, metric)
            mine = loaded.curves[(loaded.curves["run_id"] == run.run_id) & (loaded.curves["metric"] == metric)]
            assert held and list(zip(mine["tokens"], mine["value"])) == held, (run.name, metric)

    def values(frame):  # CSV changes dtypes (Int64 -> int64, <NA> -> NaN), not values
        return [[None if pd.isna(v) else v for v in row] for row in frame.astype(object).itertuples(index=False)]

    for file, frame in (("trials.csv", loaded.trials), ("curves.csv", loaded.curves)):
        back = pd.read_csv(tmp_path / "report" / file)
        assert list(back.columns) == list(frame.columns), file
        differ = [c for c in frame.columns if values(back[[c]]) != values(frame[[c]])]
        assert not differ, (file, differ, back[differ].head(2).to_dict(), frame[differ].head(2).to_dict())
    assert {"trials.csv", "curves.csv"} <= logged, logged


def test_multi_worker_trial_runs_a_worker_group_that_retries_itself(ray_session, tmp_path, monkeypatch, capsys):
    """D = 2: the trial starts a Ray Train worker group; with no Tune retries (max_failures 0)
    only Ray Train's own restart from its checkpoint can finish the trial after the fault. The
    command runs in this process on the tests' Ray, whose trials do not see this process's
    environment: the fault reaches them because the command reads it (run_life.injected_fault_at)."""
    uri = sqlite_store(tmp_path)
    sweep = variant(
        tmp_path,
        "workers",
        space={"batch.tokens_per_update": {"grid": [4096]}, "optim.lr": {"grid": [3e-3]}},
        overrides={"cluster.num_workers": 2, "train.max_failures": 1},
        max_failures=0,
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHESTRATOR_FAULT_AT_TOKENS", "36864")
    code, out, err = run_main(capsys, "sweep", sweep, f"tracking.uri={uri}")
    assert code == 0, out[-3000:] + err[-3000:]
    _, (run,) = children(uri, "workers")
    assert run.status == "FINISHED" and list((tmp_path / "runs").rglob(".fault_injected"))
    steps = [s for s, _ in Store(uri).metric_history(run.run_id, "train/loss")]
    assert steps == list(range(0, 49152, 4096)), "each update once, none missing"


def test_asha_stops_a_diverging_trial_at_its_first_rung(ray_session, tmp_path, monkeypatch, capsys):
    uri = sqlite_store(tmp_path)
    sweep = variant(
        tmp_path,
        "asha",
        space={"batch.tokens_per_update": {"grid": [4096]}, "optim.lr": {"grid": [3e-3, 2e-3, 1e-3, 30.0]}},
        overrides={"optim.grad_clip": 0, "train.total_tokens": 65536},
        scheduler={"type": "asha", "grace_period_tokens": 16384, "reduction_factor": 2},
        search={"algorithm": "grid", "max_concurrent": 1},
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(capsys, "sweep", sweep, f"tracking.uri={uri}")
    assert code == 0, out[-3000:] + err[-3000:]
    _, runs = children(uri, "asha")
    by_lr = {float(r.params["optim.lr"]): r for r in runs}
    bad = by_lr[30.0]
    evals = Store(uri).metric_history(bad.run_id, "eval/loss")
    # ASHA decides on the first rung's report (16,384 tokens); the stop reaches the running
    # trial asynchronously, so at most one more evaluation period may be logged.
    assert bad.status == "KILLED" and max(s for s, _ in evals) <= 32768, evals
    assert bad.tags[run_tags.STOPPED_AT_TAG] == "16384"  # the rung that decided, as the scheduler saw it
    killed = [r for r in runs if r.status == "KILLED"]
    assert f"{len(killed)} stopped early (" in out and all(run_tags.STOPPED_AT_TAG in r.tags for r in killed)
    # every decision at that rung saw each trial's eval loss after exactly 16,384 tokens
    for run in runs:
        assert 16384 in {s for s, _ in Store(uri).metric_history(run.run_id, "eval/loss")}
    assert by_lr[3e-3].status == "FINISHED"
    # one trial at a time: after the first, trials ran in the process of the one before (Tune's
    # reuse_actors; a fresh process logs startup/process_s), each start-up logged once
    fresh = [r for r in runs if "startup/process_s" in r.metrics]
    assert 1 <= len(fresh) <= 2, [r.name for r in fresh]
    for run in runs:
        assert [s for s, _ in Store(uri).metric_history(run.run_id, "startup/total_s")] == [0]


def test_resume_after_the_driver_is_killed(ray_session, tmp_path, monkeypatch, capsys):
    """The killed driver is a real `orchestrator sweep` process with the local Ray it starts; the
    resume is a new command, in this process on the tests' Ray."""
    uri = sqlite_store(tmp_path)
    sweep = variant(tmp_path, "resumable", search={"algorithm": "grid", "max_concurrent": 1})
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "sweep", str(sweep), f"tracking.uri={uri}"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    finished, deadline = [], time.monotonic() + 400
    while not finished and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(3)
        # the record appears once the driver has created the store and the parent run
        ready = list((tmp_path / "runs" / "sweeps" / "resumable").glob("*/sweep_run.json"))
        parent = Store(uri, "orchestrator").find_sweep_run("resumable") if ready else None
        finished = [r for r in Store(uri).child_runs(parent) if r.status == "FINISHED"] if parent else []
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started
    proc.wait()
    assert finished, "no trial finished before the kill"
    done_before = {r.run_id: r.end_ms for r in finished}
    time.sleep(3)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(capsys, "sweep", sweep, f"tracking.uri={uri}", "--resume")
    assert code == 0, out[-3000:] + err[-3000:]
    assert "resuming sweep" in out
    _, runs = children(uri, "resumable")
    assert len(runs) == 4, [r.name for r in runs]
    for run in runs:
        assert run.status == "FINISHED"
        if run.run_id in done_before:
            assert run.end_ms == done_before[run.run_id], "a finished trial was run again"
        steps = [s for s, _ in Store(uri).metric_history(run.run_id, "train/loss")]
        assert steps == sorted(set(steps))
        # its curves artifact, written when it ended, holds what MLflow holds: each step once
        bulk = Store(uri).histories([run], ["train/loss", "eval/loss"])[run.run_id]
        assert run.tags[run_tags.CURVES_TAG] and bulk == {
            k: Store(uri).metric_history(run.run_id, k) for k in ("train/loss", "eval/loss")
        }


@pytest.mark.parametrize(
    "change,key",
    [
        ({"space": {"optim.lrr": {"grid": [1e-3]}}}, "optim.lrr"),
        ({"space": {"optim.lr": {"grid": []}}}, "optim.lr"),
        ({"space": {"optim.lr": {"uniform": [0.1, 0.01]}}, "search": {"algorithm": "random"}}, "optim.lr"),
        ({"constraints": [{"key": "batch.tokens_per_update", "max": 1, "of": "train.tokenz"}]}, "train.tokenz"),
        ({"search": {"algorithm": "bayes"}}, "search.algorithm"),
    ],
)
def test_bad_sweep_files_create_no_run(tmp_path, nothing_starts, capsys, change, key):
    sweep = variant(tmp_path, "bad", **change)
    code, out, err = run_main(capsys, "sweep", sweep, f"tracking.uri=sqlite:///{tmp_path}/mlflow.db")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and key in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "mlflow.db").exists(), "no MLflow run for a bad sweep"
