"""Warnings and errors raised inside a worker, carried to the run's MLflow tags.

Ray runs the workers with `log_to_driver=False` (their output would drown the driver's progress
lines), so what a worker logs at WARNING or above, and every Python `warnings.warn`, is
collected here instead, published as MLflow tags at each report and at teardown, and printed by
the driver, which polls the run (`orchestrator.driver.launch`). Collecting costs nothing on the hot
path: `emit` only appends, and sending happens where the worker talks to MLflow anyway.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Callable, Dict, Iterable, List

from orchestrator.core.logs import FORMAT

MAX_WARNINGS = 20  # per run: a warning repeated every update must not flood MLflow or the terminal
MAX_CHARS = 1000


class WarningCollector(logging.Handler):
    """A logging handler that keeps each distinct WARNING+ message once, up to MAX_WARNINGS.

    `publish(index -> message)` is called by `flush()` with the messages not yet published; the
    index continues after the `already` messages a resumed run finds in MLflow, which are also
    not collected twice."""

    def __init__(self, publish: Callable[[Dict[int, str]], None], already: Iterable[str] = ()):
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter(FORMAT))
        self._publish = publish
        self._seen = set(already)
        self._published = len(self._seen)
        self._new: List[str] = []
        self._mutex = threading.Lock()  # emit may come from any thread (MLflow's, Ray's)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = _one_line(self.format(record))
        except Exception:  # a record that cannot be formatted must not break training
            return
        with self._mutex:
            if message in self._seen or len(self._seen) >= MAX_WARNINGS:
                return
            self._seen.add(message)
            self._new.append(message)

    def flush(self) -> None:
        """Publish what was collected since the last flush (best effort: kept for the next try)."""
        with self._mutex:
            new, start = list(self._new), self._published
        if not new:
            return
        try:
            self._publish({start + i: m for i, m in enumerate(new)})
        except Exception:  # the store is busy or away: try again at the next report
            return
        with self._mutex:
            del self._new[: len(new)]
            self._published += len(new)


def _one_line(text: str) -> str:
    """A `warnings.warn` record reads "path:line: Category: message" then the source line:
    keep the first line, which says what and where."""
    return text.strip().splitlines()[0][:MAX_CHARS] if text.strip() else ""


def install(collector: WarningCollector) -> Callable[[], None]:
    """Route Python warnings and WARNING+ log records of this process to `collector`; returns the
    function that undoes it (and publishes what is left). The DeepSpeed logger does not
    propagate to the root logger, so it gets the handler too."""
    loggers = [logging.getLogger(), logging.getLogger("DeepSpeed")]
    for logger in loggers:
        logger.addHandler(collector)
    # Python shows a warning once per place and process; a reused trial process (Tune's
    # reuse_actors) must record again what an earlier trial saw. Any change to the filters
    # clears that memory; appending the default action changes nothing else.
    warnings.simplefilter("default", append=True)
    logging.captureWarnings(True)

    def uninstall() -> None:
        logging.captureWarnings(False)
        for logger in loggers:
            logger.removeHandler(collector)
        collector.flush()

    return uninstall
