"""Extra sinks beside MLflow (`tracking.sinks`, orchestrator/tracking/sinks.py): a path that does not
import is refused in one line before anything starts; a sink gets each write MLflow takes through
the door, with MLflow's values; one that fails is reported once and MLflow keeps every write. The
whole sweep, mirrored: tests/integration/test_extensions.py."""

from __future__ import annotations

import logging
import os
from collections import defaultdict

import pytest

from orchestrator.cli import main
from orchestrator.tracking import metric_logger, sinks
from orchestrator.tracking.store import Store
from orchestrator.tracking.tracker import RunIndex, RunSink
from tests.conftest import TINY, sqlite_store, write_sweep

HERE = "tests.unit.test_tracking_sinks"
WRITES = defaultdict(list)
"""What the Recording sinks of this process got, by the store's URI: [(method, run id, *args)]."""


class Recording:
    """Every call, by the store it was built for: a sink by its methods alone (nothing inherited)."""

    def __init__(self, context: sinks.SinkContext):
        self.writes = WRITES[context.uri]

    def start_run(self, *args):
        self.writes.append(("start_run", *args))

    def log_params(self, *args):
        self.writes.append(("log_params", *args))

    def log_metrics(self, *args):
        self.writes.append(("log_metrics", *args))

    def set_tags(self, *args):
        self.writes.append(("set_tags", *args))

    def delete_tags(self, *args):
        self.writes.append(("delete_tags", *args))

    def log_text(self, *args):
        self.writes.append(("log_text", *args))

    def set_status(self, *args):
        self.writes.append(("set_status", *args))


class Broken(RunSink):
    """Fails on metrics; subclassing RunSink makes its other methods no-ops."""

    def __init__(self, context: sinks.SinkContext):
        pass

    def log_metrics(self, run_id, metrics, step):
        raise OSError("the sink's disk is full")


@pytest.mark.parametrize(
    "sink",
    ["tests.nowhere:Sink", "tests.fixtures.raises_at_import:Sink", f"{HERE}:Missing", "not a path", f"{HERE}:HERE"],
)
@pytest.mark.parametrize("verb", ["train", "sweep"])
def test_a_sink_that_does_not_import_is_refused_in_one_line_before_anything_starts(sink, verb, nothing_starts, capsys):
    target = TINY if verb == "train" else write_sweep(nothing_starts.parent)
    assert main([verb, str(target), f"tracking.sinks=['{sink}']"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tracking.sinks" in err[0] and sink in err[0], err
    assert os.listdir(nothing_starts) == [], "no MLflow store, no run folder"


def test_a_sink_gets_each_write_mlflow_takes_with_the_same_values(tmp_path):
    uri = sqlite_store(tmp_path)
    store = Store(uri, "exp", sinks=[f"{HERE}:Recording"])
    assert isinstance(store, RunIndex) and isinstance(store.sinks, RunSink)
    run_id = store.create_run("r", {"t": "https://u:secret@host/x"})
    store.log_params(run_id, {"a": 1, "b": "https://u:secret@host/y"})
    store.log_params(run_id, {"a": 1})  # held already: neither gets it again
    store.log_metrics(run_id, {"m": 2}, step=10)
    store.set_tags(run_id, {"orchestrator.failure_reason": "x"})
    store.finish_run(run_id, "FAILED")
    store.reopen_run(run_id)  # a retry: the failure reason goes, RUNNING again
    logger = metric_logger.MetricLogger(store.uri, run_id, flush_every_s=60, sinks=store.sinks)
    logger.log({"m": 3, "n": 4}, 20)
    logger.log({"m": 5}, 30)
    logger.close()
    store.finish_run(run_id)

    assert WRITES[store.uri] == [
        ("start_run", run_id, "r", {"t": "https://u:***@host/x"}),
        ("log_params", run_id, {"a": "1", "b": "https://u:***@host/y"}),
        ("log_metrics", run_id, {"m": 2.0}, 10),
        ("set_tags", run_id, {"orchestrator.failure_reason": "x"}),
        ("set_status", run_id, "FAILED"),
        ("delete_tags", run_id, ["orchestrator.failure_reason"]),
        ("set_status", run_id, "RUNNING"),
        ("log_metrics", run_id, {"m": 3.0, "n": 4.0}, 20),
        ("log_metrics", run_id, {"m": 5.0}, 30),
        ("set_status", run_id, "FINISHED"),
    ]
    run = store.get_run(run_id)
    assert run.params == {"a": "1", "b": "https://u:***@host/y"} and "orchestrator.failure_reason" not in run.tags
    assert store.metric_history(run_id, "m") == [(10, 2.0), (20, 3.0), (30, 5.0)]


def test_a_failing_sink_is_reported_once_and_mlflow_keeps_every_write(tmp_path, caplog):
    store = Store(sqlite_store(tmp_path), "exp", sinks=[f"{HERE}:Broken"])
    run_id = store.create_run("r")
    with caplog.at_level(logging.WARNING, logger=sinks.__name__):
        for step in (1, 2):
            store.log_metrics(run_id, {"m": step}, step)
    reports = [r.getMessage() for r in caplog.records if r.name == sinks.__name__]
    assert len(reports) == 1 and f"{HERE}:Broken" in reports[0] and "disk is full" in reports[0], reports
    assert store.metric_history(run_id, "m") == [(1, 1.0), (2, 2.0)]
