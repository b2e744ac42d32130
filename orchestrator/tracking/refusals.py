"""When a tracking store refuses writes for good (read-only, full, its disk failing), as opposed to
a server that is down or a database that is locked, which waiting mends: the one-line reason the
command prints, and the error that stops a sweep. No MLflow: store.py, metric_logger.py and the
driver read it."""

from __future__ import annotations

from orchestrator.core.config import redact_uri

REFUSED_FOR_GOOD = (
    "readonly database",
    "read-only file system",
    "database or disk is full",
    "no space left on device",
    "permission denied",
    "disk i/o error",
)
"""What a store says when it will not take a write however long the run waits (SQLite, a file
store, a server's database behind it; SQLite's "disk I/O error" is what a connection open when its
file turned read-only meets), unlike a server that is down or a database that is locked."""


def refuses_for_good(exc: BaseException) -> bool:
    """The store's failure is one that waiting does not mend (REFUSED_FOR_GOOD)."""
    text = str(exc).lower()
    return any(reason in text for reason in REFUSED_FOR_GOOD)


class StoreRefusedWrites(RuntimeError):
    """The tracking store takes no writes (read-only, full, its disk failing): every trial of a sweep
    would fail the same way, so the sweep stops at the first (driver/store_watch.py)."""


def why_not(exc: BaseException) -> str:
    """An exception of the store's in one line: the line that names the cause (a SQL error's, not
    the statement MLflow quotes), without a password."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    told = [line for line in lines if not line.startswith(("(raised as", "[SQL", "[parameters", "(Background"))]
    return redact_uri(f"{type(exc).__name__}: {(told or lines or [''])[0]}")
