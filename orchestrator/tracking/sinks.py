"""The extra sinks a config names (`tracking.sinks`: import paths "package.module:Attribute"), built
once per process that writes runs and fed beside MLflow: store.py's `Store` and metric_logger.py's
`MetricLogger` hand each write to `Sinks` right after MLflow took it, with the values MLflow got.

A Store is only a URI and these paths (it is pickled to trials and workers), so each process
builds its own sinks on first use, one object per path and store however many Stores it makes.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Set, Tuple

from orchestrator.core import workload_paths
from orchestrator.tracking.tracker import RunSink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SinkContext:
    """What a sink is built with (`Attribute(context)`): the MLflow store whose runs it mirrors."""

    uri: str
    """The store's URI, absolute, its password redacted (a sink may keep its files beside a
    local store)."""
    experiment: Optional[str]
    """The MLflow experiment the runs are made in (None where the store writes by run id only)."""


class Sinks:
    """The built sinks of one store, each fed every write in turn; itself a RunSink. They get
    copies of the mappings: a sink that changes one cannot change what the caller goes on with.

    A sink that raises is reported once per process (a worker's report becomes a run tag, as its
    other warnings do) and the write goes on: MLflow has taken it already and is what every report
    reads, so a mirror that fails must not fail a run of hours."""

    def __init__(self, sinks: Sequence[Tuple[str, RunSink]] = ()):
        self._sinks = tuple(sinks)

    def __bool__(self) -> bool:
        return bool(self._sinks)

    def start_run(self, run_id: str, name: str, tags: Mapping[str, str]) -> None:
        self._each("start_run", run_id, name, dict(tags))

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        self._each("log_params", run_id, dict(params))

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int) -> None:
        self._each("log_metrics", run_id, dict(metrics), step)

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self._each("set_tags", run_id, dict(tags))

    def delete_tags(self, run_id: str, keys: Sequence[str]) -> None:
        self._each("delete_tags", run_id, list(keys))

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self._each("log_text", run_id, text, artifact_file)

    def set_status(self, run_id: str, status: str) -> None:
        self._each("set_status", run_id, status)

    def _each(self, method: str, *args) -> None:
        for path, sink in self._sinks:
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # whatever the sink raises: MLflow has the write
                _report_once(path, f"{method} failed", exc)


NO_SINKS = Sinks()

_reported: Set[str] = set()


def _report_once(path: str, what: str, exc: Exception) -> None:
    if path in _reported:
        return
    _reported.add(path)  # first: the report may come back through the sinks (a worker's warning tag)
    log.warning(
        "tracking sink %s: %s (%s: %s); MLflow has every write, later failures of this sink are not reported",
        path,
        what,
        type(exc).__name__,
        exc,
    )


def built(paths: Sequence[str], context: SinkContext) -> Sinks:
    """The sinks at `paths` for the store `context` names, built in this process on first use."""
    if not paths:
        return NO_SINKS
    made = [(path, _build(path, context)) for path in paths]
    return Sinks([(path, sink) for path, sink in made if sink is not None])


@functools.lru_cache(maxsize=None)
def _build(path: str, context: SinkContext) -> Optional[RunSink]:
    """One object per path and store in a process; None (reported once) when it cannot be built
    here: validation imported it where the command ran, not on this worker."""
    try:
        return workload_paths.load(path)(context)
    except Exception as exc:
        _report_once(path, "cannot be built in this process", exc)
        return None
