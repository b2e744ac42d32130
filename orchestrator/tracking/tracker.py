"""The tracker behind two small interfaces (as Levanter's `Tracker`, torchtitan's `BaseLogger`):
what a run writes goes to a `RunSink`, what is asked of the runs already written to a `RunIndex`.

MLflow is both, and the one the project reads back: store.py's `Store` answers every `RunIndex`
question and, with metric_logger.py's `MetricLogger` (a worker's metrics), makes every write and
hands the same values to the config's extra sinks (`tracking.sinks`, built by sinks.py) right after
MLflow took them. A sink of your own is any class with these methods (nothing to inherit);
subclassing `RunSink` gives the ones it does not need as no-ops (then define `__init__(self,
context)`: a Protocol's own takes no argument).

Every value a sink gets is what MLflow got: text redacted by the config's one rule (no URI's
password), params as the text MLflow stores, metrics as floats at their step (tokens seen), each
point once (a resumed run's replayed steps are dropped before either sees them).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Protocol, Sequence, runtime_checkable

from orchestrator.tracking.records import RunRecord


@runtime_checkable
class RunSink(Protocol):
    """What a run writes, each call naming the run by the id MLflow gave it. A sink needs no state
    of its own between calls: one object per process takes the writes of every run there (a
    sweep's driver writes its parent run and closes its trials; a trial's process opens its child
    run; a worker sends its metrics and tags)."""

    def start_run(self, run_id: str, name: str, tags: Mapping[str, str]) -> None:
        """A new run (RUNNING), its name and first tags (a trial's `mlflow.parentRunId` names its
        sweep's run)."""

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        """Params, each once per run: a resumed run sends none that the run has already."""

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int) -> None:
        """Values of several metrics at one step (tokens seen)."""

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        """Tags set or overwritten."""

    def delete_tags(self, run_id: str, keys: Sequence[str]) -> None:
        """Tags removed: a retried run's failure reason, its stale curves tag."""

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        """A text artifact (the run's config.yaml, plan.txt, deepspeed.json, a sweep's file). Files
        and figures (curves.parquet, the plots, a report's files) stay MLflow's."""

    def set_status(self, run_id: str, status: str) -> None:
        """The run's status changed: FINISHED, FAILED or KILLED as it ends, RUNNING again when a
        retry or `--resume` trains into it."""


@runtime_checkable
class RunIndex(Protocol):
    """What is asked of the runs already written, answered in the project's records (records.py),
    never in a tracker's own objects."""

    def get_run(self, run_id: str) -> RunRecord:
        """One run: its name, status, times, params, tags and latest metrics."""

    def child_runs(self, parent_run_id: str) -> List[RunRecord]:
        """A sweep's trials: the runs whose parent is this one."""

    def reused_runs(self, parent_run_id: str) -> List[RunRecord]:
        """Finished runs of earlier sweeps that this sweep stands on instead of training them again."""

    def find_sweep_run(self, sweep_name: str) -> Optional[str]:
        """The id of a sweep's newest parent run, by the sweep's name."""

    def find_run(self, tags: Dict[str, str]) -> Optional[str]:
        """The id of the oldest run carrying all these tags (a retried trial finds its own run)."""

    def find_finished(self, tags: Dict[str, str]) -> Optional[RunRecord]:
        """The oldest finished run carrying all these tags (a trial's config digest: a run to reuse)."""
