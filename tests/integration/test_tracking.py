"""MetricLogger on the embedded SQLite store: four trial processes logging at once, a locked
database, the resume watermark after a killed process, MLflow's system metrics.

The trainer-level resume (Ray Train restarting a worker group from its checkpoint) is
tests/integration/test_trainer.py::test_resume_after_fault_matches_unbroken_run; here the
same logic is driven directly, one step at a time, so each case is explicit.
"""

import json
import logging
import multiprocessing
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from orchestrator.tracking import metric_logger, run_tags
from orchestrator.tracking.store import Store
from orchestrator.tracking.system_metrics import start_system_metrics

pytestmark = pytest.mark.slow
EXPERIMENT = "tracking-tests"
KEYS = ("train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s")
TOKENS = 512  # tokens per report: `step` is tokens seen, as in the trainer
SPAWN = multiprocessing.get_context("spawn")  # fresh interpreters: no state shared with pytest


def point(i, attempt=1):
    """The values logged at report i: distinct per key, report and attempt."""
    return {key: attempt * 1000 + i + j / 10 for j, key in enumerate(KEYS)}


def history(uri, run_id, key):
    return Store(uri).metric_history(run_id, key)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("tracking") / "mlflow.db"
    uri = f"sqlite:///{path}"
    Store(uri, EXPERIMENT).ensure_experiment()  # creates the schema once for the module
    return uri, path


# ---------------------------------------------------------------- four processes at once


def _log_trial(uri, run_id, reports, barrier, out):
    """One trial's rank 0 in a process of its own: logs `reports` reports as fast as it can."""
    logger = metric_logger.MetricLogger(uri, run_id, flush_every_s=0.05)
    barrier.wait(timeout=120)  # all four start logging at the same moment
    started, errors = time.monotonic(), set()
    for i in range(1, reports + 1):
        logger.log(point(i), i * TOKENS)
        if logger.last_error:
            errors.add(logger.last_error)
        time.sleep(0.001)
    logger.close(timeout_s=120)
    Path(out).write_text(
        json.dumps(
            {
                "sent": logger.sent_points,
                "failed_sends": logger.failed_sends,
                "errors": sorted(errors),
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )


def test_four_trials_logging_at_once_each_hold_every_step_once(store, tmp_path):
    uri, _ = store
    reports = 300
    parent = Store(uri, EXPERIMENT).create_run("sweep concurrent", {"orchestrator.role": "sweep"})
    runs = [Store(uri, EXPERIMENT).create_run(f"trial {i}", {run_tags.PARENT_TAG: parent}) for i in range(4)]
    barrier = SPAWN.Barrier(len(runs))
    procs = [
        SPAWN.Process(target=_log_trial, args=(uri, run_id, reports, barrier, str(tmp_path / f"{i}.json")))
        for i, run_id in enumerate(runs)
    ]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=150)
            assert p.exitcode == 0, f"logging process exited with {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    stats = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(len(runs))]
    print("per process: sent points, failed (retried) sends, errors:", stats)

    assert {r.run_id for r in Store(uri).child_runs(parent)} == set(runs)
    expected = [i * TOKENS for i in range(1, reports + 1)]
    for run_id, st in zip(runs, stats):
        assert st["sent"] == reports * len(KEYS)
        for j, key in enumerate(KEYS):
            points = history(uri, run_id, key)
            assert [s for s, _ in points] == expected, f"{key} of {run_id}: steps missing or twice"
            assert all(v == pytest.approx(1000 + s // TOKENS + j / 10) for s, v in points)


# ---------------------------------------------------------------- a locked database


def test_a_locked_sqlite_store_is_retried_not_lost(store):
    """Another writer holds the database past the busy timeout (MLflow sets 20 s): the sends
    fail with "database is locked"; the points stay buffered and arrive once the lock goes."""
    uri, path = store
    run_id = Store(uri, EXPERIMENT).create_run("locked")
    logger = metric_logger.MetricLogger(uri, run_id, flush_every_s=0.2)
    blocker = sqlite3.connect(path, timeout=60, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        for i in range(1, 51):
            logger.log(point(i), i * TOKENS)
        deadline = time.monotonic() + 60
        while not logger.failed_sends and time.monotonic() < deadline:
            time.sleep(0.2)
        assert logger.failed_sends >= 1, "no send failed while the database was locked"
        assert "locked" in (logger.last_error or ""), logger.last_error
        assert logger.buffered == 50 * len(KEYS), "points were dropped or half-sent while locked"
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    logger.close(timeout_s=60)
    assert logger.last_error is None and logger.buffered == 0
    for key in KEYS:
        assert [s for s, _ in history(uri, run_id, key)] == [i * TOKENS for i in range(1, 51)]


def read_only(uri: str) -> str:
    """The same SQLite store opened read-only (a store turned read-only; root ignores file modes)."""
    return f"sqlite:///file:{uri[len('sqlite:///') :]}?mode=ro&uri=true"


def test_a_store_that_refuses_writes_for_good_fails_the_run_at_its_next_point(store, caplog):
    """A read-only store is not a server that is down: waiting does not mend it. The refusal is
    seen at the first send and the next point fails the run (TrackingError, one line), and the
    final flush gives up at once instead of waiting FINAL_FLUSH_S; a store that takes writes
    answers the write check with None and keeps no tag of it."""
    uri, _ = store
    caplog.set_level(logging.CRITICAL, logger="mlflow.store.db.utils")  # its tracebacks of each refusal
    run_id = Store(uri, EXPERIMENT).create_run("read-only")
    logger = metric_logger.MetricLogger(read_only(uri), run_id, flush_every_s=0.1)
    logger.log(point(1), TOKENS)
    deadline = time.monotonic() + 30
    while not logger.refused and time.monotonic() < deadline:
        time.sleep(0.1)
    assert logger.refused and "readonly database" in logger.refused, logger.refused
    with pytest.raises(metric_logger.TrackingError, match="refuses writes") as raised:
        logger.log(point(2), 2 * TOKENS)
    assert len(str(raised.value).splitlines()) == 1
    started = time.monotonic()
    assert not logger.flush(timeout_s=60) and time.monotonic() - started < 5
    with pytest.raises(metric_logger.TrackingError):  # and the run's end fails too, its sender stopped
        logger.close(timeout_s=0)
    refused = Store(read_only(uri)).refuses_writes(run_id)
    assert refused and "readonly database" in refused and len(refused.splitlines()) == 1
    assert Store(uri).refuses_writes(run_id) is None
    assert run_tags.WRITE_CHECK_TAG not in Store(uri).get_run(run_id).tags


# ---------------------------------------------------------------- resume watermark


def _first_attempt(uri, run_resent, run_lost, out):
    """A trainer's rank 0 in miniature, then killed. Reports 1-4 are sent; the checkpoint at
    report 6 records reports 5-6 as unsent. `run_resent`: reports 5-8 still reach MLflow
    before the kill (steps past the checkpoint that the resumed run replays). `run_lost`: the
    process dies right after the checkpoint, so 5-6 exist only in the checkpoint."""
    checkpoints = {}
    for run_id in (run_resent, run_lost):
        logger = metric_logger.MetricLogger(uri, run_id, flush_every_s=3600)  # sends only on flush()
        for i in range(1, 5):
            logger.log(point(i), i * TOKENS)
        assert logger.flush(timeout_s=60)
        for i in (5, 6):
            logger.log(point(i), i * TOKENS)
        checkpoints[run_id] = {"pending": logger.pending_state(), "watermarks": logger.watermarks}
        if run_id == run_resent:
            for i in (7, 8):
                logger.log(point(i), i * TOKENS)
            assert logger.flush(timeout_s=60)
    Path(out).write_text(json.dumps(checkpoints))
    os._exit(0)  # killed: no close(), nothing else is sent


def test_resume_logs_each_step_once(store, tmp_path):
    uri, _ = store
    run_resent = Store(uri, EXPERIMENT).create_run("resume: replayed steps already sent")
    run_lost = Store(uri, EXPERIMENT).create_run("resume: unsent points only in the checkpoint")
    out = tmp_path / "checkpoints.json"
    proc = SPAWN.Process(target=_first_attempt, args=(uri, run_resent, run_lost, str(out)))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0 and out.exists()
    checkpoints = json.loads(out.read_text())
    assert [s for s, _ in history(uri, run_resent, KEYS[0])] == [i * TOKENS for i in range(1, 9)]
    assert [s for s, _ in history(uri, run_lost, KEYS[0])] == [i * TOKENS for i in range(1, 5)]

    for run_id in (run_resent, run_lost):
        # What train_loop.py does on resume: MLflow's watermark wins over the checkpoint's.
        ckpt, held = checkpoints[run_id], Store(uri).last_steps(run_id)
        assert held == {k: (8 if run_id == run_resent else 4) * TOKENS for k in KEYS}
        logger = metric_logger.MetricLogger(uri, run_id, flush_every_s=0.1, watermarks={**ckpt["watermarks"], **held})
        logger.restore_pending(ckpt["pending"], held)
        assert logger.buffered == (0 if run_id == run_resent else 2 * len(KEYS)), "re-sent only what MLflow lacks"
        logger.log(point(6, attempt=2), 6 * TOKENS)  # at or below the watermark: dropped
        assert logger.buffered == (0 if run_id == run_resent else 2 * len(KEYS))
        for i in range(7, 11):  # the resumed run replays everything after its checkpoint
            logger.log(point(i, attempt=2), i * TOKENS)
        logger.close(timeout_s=60)

    for run_id in (run_resent, run_lost):
        for key in KEYS:
            points = history(uri, run_id, key)
            assert [s for s, _ in points] == [i * TOKENS for i in range(1, 11)], (run_id, key, points)
            # First attempt's values up to what MLflow held (8 resp. the checkpoint's 6), the
            # resumed attempt's after.
            first = 8 if run_id == run_resent else 6
            assert [v for _, v in points] == pytest.approx(
                [point(i, attempt=1 if i <= first else 2)[key] for i in range(1, 11)]
            )


# ---------------------------------------------------------------- system metrics


def test_system_metrics_reach_a_resumed_run_and_survive_an_outage(store, monkeypatch):
    """MLflow's sampler writes CPU and memory into the run. The run is one that a failed
    attempt left FAILED and that training resumes into: reopened, or the sampler stops at once.
    While the store refuses every send, the samples wait in the run's MetricLogger and arrive
    after it: every step once, none lost (MLflow's own sender drops them and stops sampling)."""
    uri, _ = store
    run_id = Store(uri, EXPERIMENT).create_run("system metrics")
    Store(uri).finish_run(run_id, "FAILED")
    Store(uri).reopen_run(run_id)
    assert Store(uri).get_run(run_id).status == "RUNNING"
    logger = metric_logger.MetricLogger(uri, run_id, flush_every_s=0.2)
    send = logger._client.log_batch
    down = threading.Event()

    def log_batch(*args, **kwargs):
        if down.is_set():
            raise ConnectionError("tracking server down")
        return send(*args, **kwargs)

    monkeypatch.setattr(logger._client, "log_batch", log_batch)
    monitor = start_system_metrics(logger, interval_s=0.5)
    time.sleep(1.5)
    down.set()
    time.sleep(2)
    assert logger.failed_sends >= 1 and logger.buffered > 0, "nothing waited for the store"
    down.clear()
    time.sleep(1)
    monitor.finish()
    logger.close(timeout_s=30)
    metrics = Store(uri).get_run(run_id).metrics
    assert "system/cpu_utilization_percentage" in metrics, sorted(metrics)
    assert "system/system_memory_usage_megabytes" in metrics, sorted(metrics)
    steps = [s for s, _ in history(uri, run_id, "system/cpu_utilization_percentage")]
    assert len(steps) >= 6 and steps == list(range(len(steps))), steps
