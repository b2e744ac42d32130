"""A worker's warnings are collected once each, bounded, and published in order."""

import logging
import warnings

from workloads.train import worker_warnings
from workloads.train.worker_warnings import MAX_WARNINGS, WarningCollector


def test_warnings_and_log_records_are_published_once_each_in_order():
    published = {}
    collector = WarningCollector(published.update)
    uninstall = worker_warnings.install(collector)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            for _ in range(3):
                warnings.warn("the thing is deprecated", stacklevel=2)
        logging.getLogger("workloads.test").warning("gns: %s", "not measured")
        logging.getLogger("workloads.test").info("not a warning")
        collector.flush()
    finally:
        uninstall()
    assert list(published) == [0, 1]
    assert "UserWarning: the thing is deprecated" in published[0] and "\n" not in published[0]
    assert published[1] == "WARNING workloads.test: gns: not measured"


def test_a_resumed_run_continues_the_numbering_and_the_bound_holds():
    published = {}
    collector = WarningCollector(published.update, already=["WARNING x: old"])
    logger = logging.getLogger("workloads.test.bound")
    logger.addHandler(collector)
    try:
        logger.warning("old")
        for i in range(2 * MAX_WARNINGS):
            logger.warning("new %d", i)
    finally:
        logger.removeHandler(collector)
    collector.flush()
    assert min(published) == 1 and len(published) == MAX_WARNINGS - 1


def test_a_failed_publish_is_retried_at_the_next_flush():
    published, calls = {}, []

    def flaky(messages):
        calls.append(messages)
        if len(calls) == 1:
            raise ConnectionError("store away")
        published.update(messages)

    collector = WarningCollector(flaky)
    record = {"levelno": logging.ERROR, "levelname": "ERROR", "name": "w", "msg": "boom"}
    collector.handle(logging.makeLogRecord(record))
    collector.flush()
    collector.flush()
    assert list(published.values()) == ["ERROR w: boom"]


def test_a_run_in_a_reused_process_records_the_warnings_an_earlier_run_saw():
    """A sweep trial's process runs the next trial: Python shows a warning once per place, so
    without a reset the second run's MLflow tags would miss what the first one already raised."""

    def deprecated_call():
        warnings.warn("the reused thing is deprecated", stacklevel=1)

    for run in ("first", "second"):
        published = {}
        collector = WarningCollector(published.update)
        uninstall = worker_warnings.install(collector)
        try:
            deprecated_call()
            collector.flush()
        finally:
            uninstall()
        assert any("the reused thing is deprecated" in m for m in published.values()), run
