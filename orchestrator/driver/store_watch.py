"""A sweep stops when its tracking store refuses writes: a trial that fails then raises
StoreRefusedWrites (driver/trial.py), and every other trial would fail the same way, retried.
StoreWatch sees that failure in Tune's log of trial errors (and keeps its traceback out of the
output: the sweep's one line says it) and, as Tune's stopper, ends every trial at Tune's next step.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional

from ray import tune

from orchestrator.tracking.refusals import StoreRefusedWrites

TUNE_ERRORS = "ray.tune.execution.tune_controller"
"""The logger Tune reports a failed trial on, with its exception."""
RAY_UNHANDLED = "ray._private.worker"
"""The logger Ray reports a failure on that nobody waited for (a trial's, once Tune stopped)."""


class StoreWatch(tune.Stopper):
    """Tune's stopper of a sweep, stopping all when a trial failed for the store."""

    def __init__(self) -> None:
        self.refused: Optional[str] = None
        """Why the store refused a trial's write (one line); None while it has not."""

    def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.refused is not None

    def filter(self, record: logging.LogRecord) -> bool:
        """A logging filter on Tune's trial errors: a failure for the store is noted, not printed."""
        error = record.exc_info[1] if record.exc_info else None
        cause = getattr(error, "cause", error)  # Ray's RayTaskError carries the trial's exception
        if isinstance(cause, StoreRefusedWrites):
            self.refused = self.refused or str(cause).strip().splitlines()[-1]
            return False
        return not (record.name == RAY_UNHANDLED and StoreRefusedWrites.__name__ in record.getMessage())


@contextmanager
def watching() -> Iterator[StoreWatch]:
    """A StoreWatch on Tune's trial errors for the block's time."""
    watch, loggers = StoreWatch(), [logging.getLogger(name) for name in (TUNE_ERRORS, RAY_UNHANDLED)]
    for logger in loggers:
        logger.addFilter(watch)
    try:
        yield watch
    finally:
        for logger in loggers:
            logger.removeFilter(watch)
