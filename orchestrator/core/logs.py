"""One format for diagnostics, in the driver and in the workers (`logging` on stderr).

The tables, progress lines and summaries a user reads stay on stdout (print); what goes through
here is what explains or warns: `WARNING orchestrator.driver.sweep: skipping infeasible trial ...`.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(levelname)s %(name)s: %(message)s"
PROJECT_LOGGERS = ("orchestrator", "workloads")


def setup(level: int = logging.INFO) -> None:
    """Send the project's loggers to stderr in FORMAT (once per process). They still propagate,
    so handlers further up (a worker's warning collector, pytest's capture) see the records."""
    for name in PROJECT_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(getattr(h, "orchestrator_handler", False) for h in logger.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(FORMAT))
            handler.orchestrator_handler = True
            logger.addHandler(handler)
