"""A sweep whose store refuses writes ends in one line (orchestrator/driver/store_watch.py,
sweep_summary.py): the trial that failed for the store stops every trial at Tune's next step, its
traceback is not printed (another failure's is), and the sweep's open runs are marked FAILED
where the store takes that, else the line says they stay open. The store's own refusal is
tests/integration/test_tracking.py's; docs/security.md has what a whole sweep measured."""

from __future__ import annotations

import logging

from ray.exceptions import RayTaskError

from orchestrator.core import config
from orchestrator.driver import store_watch, sweep_summary
from orchestrator.studies import kinds
from orchestrator.tracking.refusals import StoreRefusedWrites
from orchestrator.tracking.store import Store
from tests.conftest import TINY, sqlite_store, write_sweep

REASON = "MlflowException: (sqlite3.OperationalError) attempt to write a readonly database"


def failed(cause: Exception) -> Exception:
    """A trial's exception as Tune holds it: Ray's RayTaskError, an instance of its cause's class too."""
    where = f"{type(cause).__module__}.{type(cause).__name__}"
    traceback = f'Traceback (most recent call last):\n  File "trial.py", line 1, in run_trial\n{where}: {cause}'
    return RayTaskError("ImplicitFunc.train", traceback, cause).as_instanceof_cause()


def test_a_trial_failed_for_the_store_stops_the_sweep_and_prints_no_traceback(caplog):
    tune_log, ray_log = logging.getLogger(store_watch.TUNE_ERRORS), logging.getLogger(store_watch.RAY_UNHANDLED)
    with caplog.at_level(logging.ERROR), store_watch.watching() as watch:
        tune_log.error("Trial task failed for trial bug", exc_info=failed(ValueError("a bug in the trial")))
        assert not watch.stop_all(), "a trial's own failure is retried, not the sweep's end"
        tune_log.error("Trial task failed for trial store", exc_info=failed(StoreRefusedWrites(REASON)))
        ray_log.error(
            f"Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): {failed(StoreRefusedWrites(REASON))}"
        )
    assert watch.stop_all() and watch.refused == REASON
    printed = [r.getMessage() for r in caplog.records]
    assert printed == ["Trial task failed for trial bug"], printed
    tune_log.error("after the sweep", exc_info=failed(StoreRefusedWrites(REASON)))  # the filter left with it
    assert caplog.records[-1].getMessage() == "after the sweep"


def test_a_sweep_stopped_by_its_store_ends_in_one_line_with_its_runs_closed_where_it_can(tmp_path, capsys):
    uri = sqlite_store(tmp_path)
    sweep = kinds.load(write_sweep(tmp_path))
    base = config.load(TINY, [f"tracking.uri={uri}"])
    store = Store(uri, base.tracking.experiment)
    store.ensure_experiment()
    parent = store.create_run("sweep")
    child = store.create_run("trial", {"mlflow.parentRunId": parent})
    read_only = Store(f"sqlite:///file:{uri[len('sqlite:///') :]}?mode=ro&uri=true").uri
    still = config.load(TINY, [f"tracking.uri={read_only}"])
    capsys.readouterr()  # MLflow's lines as it opened the store
    assert sweep_summary.finish(sweep, still, parent, StoreRefusedWrites(REASON)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and REASON in err[0] and "stay RUNNING" in err[0] and "--resume" in err[0], err
    assert store.get_run(child).status == "RUNNING"  # the store took nothing
    assert sweep_summary.finish(sweep, base, parent, StoreRefusedWrites(REASON)) == 1  # it takes writes again
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "marked FAILED" in err[0], err
    assert store.get_run(child).status == "FAILED" and store.get_run(parent).status == "FAILED"
