"""What the door to MLflow (store.py) answers with: the project's own frozen records of a run and
of its metric points, so that no module outside tracking/ reads MLflow's objects. No MLflow
import: only the door builds them (`RunRecord.of` an MLflow run)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

History = List[Tuple[int, float]]
"""One metric of one run as [(step, value)] sorted by step; the step of a training curve is the
tokens seen (docs/mlflow.md)."""


@dataclass(frozen=True)
class RunRecord:
    """One MLflow run as it was read (its dicts are copies: changing them changes nothing stored)."""

    run_id: str
    name: str
    """The run's name ("" when it has none): a trial's is its config (`B=4Ki lr=3e-3 wu=5%`)."""
    experiment_id: str
    status: str
    """MLflow's: RUNNING, FINISHED, FAILED, KILLED or SCHEDULED."""
    start_ms: Optional[int]
    """When the run was created, in milliseconds since the epoch (MLflow's clock)."""
    end_ms: Optional[int]
    """When it was last closed (None while it never was)."""
    params: Dict[str, str]
    tags: Dict[str, str]
    metrics: Dict[str, float]
    """Each metric's latest value (its whole history: Store.metric_history)."""
    artifact_uri: str = ""
    """Where its artifacts are (the store reads one from there without looking the run up again)."""

    @classmethod
    def of(cls, run: Any) -> "RunRecord":
        """The record of an `mlflow.entities.Run`. Its params' and tags' names and values are
        interned: the runs of a sweep share their config's strings instead of each holding copies
        (about 9.5 kB a run of 69 params, which a report of thousands of runs holds at once)."""
        info, data = run.info, run.data
        return cls(
            run_id=info.run_id,
            name=info.run_name or "",
            experiment_id=info.experiment_id,
            status=info.status,
            start_ms=info.start_time,
            end_ms=info.end_time,
            params=_interned(data.params),
            tags=_interned(data.tags),
            metrics=dict(data.metrics),
            artifact_uri=info.artifact_uri or "",
        )


def _interned(strings: Dict[str, str]) -> Dict[str, str]:
    return {sys.intern(k): sys.intern(v) if isinstance(v, str) else v for k, v in strings.items()}


@dataclass(frozen=True)
class MetricPoint:
    """One logged value of a metric, with the wall-clock time it was logged at (where a run's
    time went: benchmarks/trial_startup.py)."""

    step: int
    value: float
    timestamp_ms: int
