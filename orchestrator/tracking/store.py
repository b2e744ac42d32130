"""The one door to MLflow: a `Store` is a tracking store (and the experiment this project's runs
are made and searched in) that creates, writes and reads runs and answers in the project's own
types (records.py). With metric_logger.py (the workers' batched asynchronous `MetricLogger`) and
system_metrics.py, the only code that calls MLflow's API (tests/unit/test_import_graph.py holds it).

Runs: one per `orchestrator train`; for a sweep one parent run and one child run per trial
(tag `mlflow.parentRunId`). The x axis of every training curve is tokens: `step` = tokens seen.
Every param, tag and text logged here passes the config's one redaction rule (`redact_uri`):
whatever a config, a sweep file or an error holds, no URI's password reaches the store. A Store is
a tracker.RunIndex, and each write MLflow takes here goes on, with the same values, to the
config's extra sinks (`tracking.sinks`: sinks.py).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple

from orchestrator.core.config import redact_uri
from orchestrator.tracking.records import History, MetricPoint, RunRecord
from orchestrator.tracking.refusals import why_not
from orchestrator.tracking.run_tags import (
    CURVES_TAG,
    FAILURE_TAG,
    PARENT_TAG,
    REUSED_BY_PREFIX,
    ROLE_TAG,
    SWEEP_CURVES_TAG,
    SWEEP_ROLE,
    SWEEP_TAG,
    TRIAL_TAG,
    WRITE_CHECK_TAG,
    warning_tags,
    warnings_in,
)
from orchestrator.tracking.sinks import SinkContext, Sinks, built

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

SWEEP_RUN_FILTER = f"tags.`{ROLE_TAG}` = '{SWEEP_ROLE}'"  # MLflow search filter of sweep parent runs
MAX_PARAMS = 100  # MLflow's limit on params per log_batch call
MAX_METRICS = 1000  # ... and on metrics
CURVES_STORED = (
    "train/loss",
    "eval/loss",
    "gns/b_simple",
    "train/clipped",
    "eval/loss_se",
    "train/lr",
    "perf/tokens_per_s",
)
"""The curves a run's CURVES_ARTIFACT holds: what `report` and `load_sweep` read by default (the
analysis' and curves.csv's; tests/unit/test_report.py holds them equal)."""
CURVES_ARTIFACT = "curves.parquet"
"""A finished run's curves once more, as one columnar artifact (metric, step, value): MLflow has no
bulk history call, and one `get_metric_history` per run and metric dominates reading a study of
hundreds of runs (docs/mlflow.md, docs/benchmarks.md#history_read)."""
SWEEP_CURVES = "sweep_curves.parquet"
"""A sweep's parent run's: every trial's curves in one table (write_sweep_curves), so a report of a
sweep of thousands of trials reads one file (the trials' own runs keep theirs, for the UI)."""


def quoted(value: str) -> str:
    """A string literal of an MLflow search filter: in single quotes, or in double quotes when it
    holds a single quote (the filter language has no escapes; a value with both is refused)."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise ValueError(f"{value!r} holds both quote characters, which an MLflow search filter cannot express")


def _curves_held(run: RunRecord) -> List[str]:
    """The keys a run's curves artifact holds: none unless the run has ended since it was written
    (reopen_run removes the tag when training resumes into it)."""
    held = run.tags.get(CURVES_TAG)
    return held.split(",") if held and run.status != "RUNNING" else []


def resolve_uri(uri: str) -> str:
    """Make a relative SQLite/file store absolute: Ray workers do not share the driver's cwd."""
    if uri.startswith("sqlite:///") and not uri.startswith(("sqlite:////", "sqlite:///file:")):
        return "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    if "://" not in uri:
        return str(Path(uri).resolve())
    return uri


def preload(uri: str) -> None:
    """Import MLflow's client, and its SQL store for a database URI: seconds of imports that a
    caller waiting on something else (the sweep, while Ray starts) can take meanwhile. Opens and
    writes nothing."""
    from mlflow.store.db.db_types import DATABASE_ENGINES
    from mlflow.tracking import MlflowClient  # noqa: F401

    if uri.split(":", 1)[0].split("+", 1)[0] in DATABASE_ENGINES:  # MLflow's own SQL store
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401


def env_for_workers() -> Dict[str, str]:
    """Environment that tracking needs in Ray workers (credentials travel as env, never params)."""
    keys = (
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_TRACKING_TOKEN",
        "MLFLOW_TRACKING_INSECURE_TLS",
        "MLFLOW_TRACKING_SERVER_CERT_PATH",
    )
    return {k: os.environ[k] for k in keys if k in os.environ}


class Store:
    """An MLflow tracking store at `uri` (made absolute: resolve_uri) and the `experiment` runs are
    created and searched in (None for a store that is only read by run id or across experiments),
    with the extra `sinks` its writes also go to (import paths: `tracking.sinks`).

    Each call opens MLflow's client afresh: it is cheap (MLflow caches the store behind it), and a
    Store is then only a URI and paths, safe to hand to threads and to pickle. Nothing is opened
    until a call needs it, so a Store of a SQLite file that does not exist creates none (`exists`)."""

    def __init__(self, uri: str, experiment: Optional[str] = None, sinks: Sequence[str] = ()):
        self.uri = resolve_uri(uri)
        self.experiment = experiment
        self.sink_paths = tuple(sinks)

    @classmethod
    def of(cls, cfg: Any) -> "Store":
        """The store, experiment and extra sinks a train config names (`tracking.uri`,
        `tracking.experiment`, `tracking.sinks`)."""
        return cls(cfg.tracking.uri, cfg.tracking.experiment, cfg.tracking.sinks)

    @property
    def sinks(self) -> Sinks:
        """The extra sinks, built in this process on first use (sinks.built): each write below
        reaches them once MLflow has taken it, with the values MLflow got."""
        return built(self.sink_paths, SinkContext(redact_uri(self.uri), self.experiment))

    def __repr__(self) -> str:
        return f"Store({redact_uri(self.uri)!r}, {self.experiment!r})"

    def _client(self) -> MlflowClient:
        from mlflow.tracking import MlflowClient  # imported on first use: a report of tables never loads MLflow

        return MlflowClient(tracking_uri=self.uri)

    def _experiment(self) -> str:
        if self.experiment is None:
            raise TypeError(f"{self!r} names no experiment to create or find runs in")
        return self.experiment

    # ---------------------------------------------------------------- experiments

    def exists(self) -> bool:
        """False for a local SQLite store whose file is missing (reading must not create one)."""
        if self.uri.startswith("sqlite:///"):
            return Path(self.uri[len("sqlite:///") :]).exists()
        return True

    def experiment_id(self, name: Optional[str] = None) -> Optional[str]:
        """The id of experiment `name` (default: the store's), None when there is none."""
        found = self._client().get_experiment_by_name(self._experiment() if name is None else name)
        return found.experiment_id if found is not None else None

    def ensure_experiment(self) -> str:
        """The experiment's id, creating it (artifacts beside a local store) when missing."""
        c, name = self._client(), self._experiment()
        found = c.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:"):
            location = Path(self.uri.split("sqlite:///")[-1]).resolve().parent.joinpath("mlartifacts").as_uri()
        try:
            return c.create_experiment(name, artifact_location=location)
        except Exception:  # another process created it first
            found = c.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    # ---------------------------------------------------------------- a run's life and what it logs

    def create_run(self, name: str, tags: Optional[Dict[str, str]] = None) -> str:
        """A new run in the experiment (created when missing); its id."""
        exp_id = self.ensure_experiment()
        tags = {k: redact_uri(str(v)) for k, v in (tags or {}).items()}
        run_id = self._client().create_run(exp_id, run_name=name, tags=tags).info.run_id
        self.sinks.start_run(run_id, name, tags)
        return run_id

    def reopen_run(self, run_id: str) -> None:
        """Mark a run RUNNING again when training resumes into it (a re-run `orchestrator train`,
        a retried trial): MLflow's system-metrics sampler stops at once on a run that is not
        RUNNING, and the UI should not show a run in progress as FAILED. The failure reason of the
        earlier attempt goes too: it no longer describes the run, nor does its curves artifact."""
        c = self._client()
        tags = c.get_run(run_id).data.tags
        stale = [key for key in (FAILURE_TAG, CURVES_TAG) if key in tags]  # its curves artifact: the earlier attempt's
        for key in stale:
            c.delete_tag(run_id, key)
        c.update_run(run_id, status="RUNNING")
        if stale:
            self.sinks.delete_tags(run_id, stale)
        self.sinks.set_status(run_id, "RUNNING")

    def finish_run(self, run_id: str, status: str = "FINISHED") -> None:
        self._client().set_terminated(run_id, status=status)
        self.sinks.set_status(run_id, status)

    def log_params(self, run_id: str, params: Dict[str, Any]) -> None:
        """Params once per run; a resumed run re-logging identical values is skipped."""
        c = self._client()
        existing = c.get_run(run_id).data.params
        from mlflow.entities import Param

        todo = [Param(k, redact_uri(str(v))[:6000]) for k, v in sorted(params.items()) if k not in existing]
        for i in range(0, len(todo), MAX_PARAMS):
            c.log_batch(run_id, params=todo[i : i + MAX_PARAMS])
        if todo:
            self.sinks.log_params(run_id, {p.key: p.value for p in todo})

    def set_tags(self, run_id: str, tags: Dict[str, str]) -> None:
        from mlflow.entities import RunTag

        tags = {k: redact_uri(str(v)) for k, v in tags.items()}
        self._client().log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        self.sinks.set_tags(run_id, tags)

    def refuses_writes(self, run_id: str) -> Optional[str]:
        """None when the store takes a write (a tag set on `run_id`, then deleted), else why not,
        in one line."""
        try:
            client = self._client()
            client.set_tag(run_id, WRITE_CHECK_TAG, str(time.time()))
            client.delete_tag(run_id, WRITE_CHECK_TAG)
        except Exception as exc:  # whatever the backend raises: its reason is the answer
            return why_not(exc)
        return None

    def set_experiment_tag(self, experiment_id: str, key: str, value: str) -> None:
        """A tag of the experiment (a shared view of its runs: tracking/compare_view.py)."""
        self._client().set_experiment_tag(experiment_id, key, redact_uri(value))

    def log_warnings(self, run_id: str, messages: Dict[int, str]) -> None:
        """Record a worker's warnings on its run (see workloads/train/worker_warnings.py)."""
        self.set_tags(run_id, warning_tags(messages))

    def log_metrics(self, run_id: str, metrics: Dict[str, float], step: int) -> None:
        """A few values at one step, now (the training loop's own go through MetricLogger)."""
        now = int(time.time() * 1000)
        from mlflow.entities import Metric

        values, step = {k: float(v) for k, v in metrics.items()}, int(step)
        self._client().log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])
        self.sinks.log_metrics(run_id, values, step)

    def log_history(self, run_id: str, curves: Dict[str, History], timestamp_ms: Optional[int] = None) -> None:
        """Whole curves {key: [(step, value)]} in MLflow's largest batches (tables imported into a
        store, benchmarks; a trainer streams its points through metric_logger.MetricLogger)."""
        from mlflow.entities import Metric

        now = timestamp_ms or int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, int(s)) for k, points in curves.items() for s, v in points]
        for start in range(0, len(metrics), MAX_METRICS):
            self._client().log_batch(run_id, metrics=metrics[start : start + MAX_METRICS])
        sinks = self.sinks
        if sinks:  # whole curves: one point a call (a sink's call is one step's values)
            for m in metrics:
                sinks.log_metrics(run_id, {m.key: m.value}, m.step)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        text = redact_uri(text)
        self._client().log_text(run_id, text, artifact_file)
        self.sinks.log_text(run_id, text, artifact_file)

    def log_dict(self, run_id: str, data: Dict[str, Any], artifact_file: str) -> None:
        """A dict as a JSON (or YAML, by its name) artifact; the sinks get it as JSON text."""
        self._client().log_dict(run_id, data, artifact_file)
        sinks = self.sinks
        if sinks:
            sinks.log_text(run_id, json.dumps(data, indent=2, default=str), artifact_file)

    def log_file(self, run_id: str, path: str | Path, artifact_path: Optional[str] = None) -> None:
        self._client().log_artifact(run_id, str(path), artifact_path)

    def log_figure(self, run_id: str, figure: Any, artifact_file: str) -> None:
        """Logs a matplotlib figure and closes it: pyplot holds every figure it made until closed,
        and a trial process that Tune reuses makes one per trial."""
        import matplotlib.pyplot as plt

        try:
            self._client().log_figure(run_id, figure, artifact_file)
        finally:
            plt.close(figure)

    # ---------------------------------------------------------------- a run read back

    def get_run(self, run_id: str) -> RunRecord:
        return RunRecord.of(self._client().get_run(run_id))

    def try_get_run(self, run_id: str) -> Optional[RunRecord]:
        """The run, or None when no run has this id."""
        try:
            return self.get_run(run_id)
        except Exception:
            return None

    def run_warnings(self, run_id: str) -> Dict[str, str]:
        """{tag: message} of what the run's workers warned about, in order."""
        return warnings_in(self.get_run(run_id).tags)

    def metric_history(self, run_id: str, key: str) -> History:
        """[(step, value)] sorted by step."""
        return sorted((m.step, m.value) for m in self._client().get_metric_history(run_id, key))

    def metric_points(self, run_id: str, key: str) -> List[MetricPoint]:
        """Every point of a metric with the time it was logged, in the order of their steps."""
        history = sorted(self._client().get_metric_history(run_id, key), key=lambda m: m.step)
        return [MetricPoint(m.step, m.value, m.timestamp) for m in history]

    def last_steps(self, run_id: str) -> Dict[str, int]:
        """Per metric, the last step MLflow holds: the resume watermark."""
        c = self._client()
        keys = c.get_run(run_id).data.metrics.keys()
        return {k: max(m.step for m in c.get_metric_history(run_id, k)) for k in keys}

    def histories(
        self,
        runs: Sequence[RunRecord],
        keys: Iterable[str],
        workers: Optional[int] = None,
        sweep_run: Optional[str] = None,
    ) -> Dict[str, Dict[str, History]]:
        """{run id: {key: [(step, value)] sorted by step}} of the runs (their latest metrics say
        which keys each has; absent ones map to []). With `sweep_run`, the runs its SWEEP_CURVES
        table holds as they ended are read from it, in one download (write_sweep_curves). A run
        that ended with its curves artifact (write_curves; the tag says which keys it holds) is
        read from it, one download a run; the other keys one `get_metric_history` each. From a
        tracking server 8 run at a time (each is a round trip; 3.5x faster on the demo's runs,
        docs/benchmarks.md), from a store this process opens (SQLite) one at a time, as threads
        only contend there (`workers` overrides)."""
        keys, c = list(keys), self._client()
        found = self._sweep_curves(sweep_run, runs, keys) if sweep_run else {}
        rest = [r for r in runs if r.run_id not in found]
        from orchestrator.tracking.metric_logger import is_local  # it loads MLflow: on first use

        def read(run: RunRecord) -> Dict[str, History]:
            held = [k for k in keys if k in run.metrics and k in _curves_held(run)]
            out = self._read_table(run.run_id, CURVES_ARTIFACT, held, run.artifact_uri)[0].get("", {}) if held else {}
            for key in (k for k in keys if k in run.metrics and k not in held):
                out[key] = sorted((m.step, m.value) for m in c.get_metric_history(run.run_id, key))
            return out

        workers = workers or (1 if is_local(self.uri) else 8)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            found.update(zip([r.run_id for r in rest], pool.map(read, rest)))
        return {r.run_id: {k: found[r.run_id].get(k, []) for k in keys} for r in runs}

    def write_curves(self, run_id: str, curves: Dict[str, History]) -> None:
        """The run's curves as CURVES_ARTIFACT, and the tag that says which keys it holds: written
        once the run has ended, from what MLflow holds then (so a resumed run's points are each in
        it once), and read instead of one history call per key (`histories`)."""
        self._log_table(run_id, CURVES_ARTIFACT, {"": curves})
        self.set_tags(run_id, {CURVES_TAG: ",".join(curves)})

    def write_sweep_curves(
        self, sweep_run: str, runs: Sequence[RunRecord], curves: Dict[str, Dict[str, History]]
    ) -> None:
        """A sweep's curves (`curves`, as `histories` read them for `runs`) as one SWEEP_CURVES
        artifact on its parent run, each run's with the time it ended, and the tag that says which
        keys it holds: a later report of the sweep reads one file instead of one per run. A run that
        ends again (a resumed sweep) is read from its own run, until the sweep's end writes anew."""
        ended = {r.run_id: r.end_ms for r in runs if r.status != "RUNNING" and r.run_id in curves}
        self._log_table(sweep_run, SWEEP_CURVES, {run_id: curves[run_id] for run_id in ended}, {"ended": ended})
        keys = dict.fromkeys(k for by_key in curves.values() for k in by_key)
        self.set_tags(sweep_run, {SWEEP_CURVES_TAG: ",".join(keys)})

    def _sweep_curves(
        self, sweep_run: str, runs: Sequence[RunRecord], keys: Sequence[str]
    ) -> Dict[str, Dict[str, History]]:
        """The runs' curves the sweep's SWEEP_CURVES table holds as each run ended ({} without one,
        or when it lacks a key asked for)."""
        run = self._client().get_run(sweep_run)
        held = run.data.tags.get(SWEEP_CURVES_TAG)
        if held is None or not set(keys) <= set(held.split(",")):
            return {}
        table, meta = self._read_table(sweep_run, SWEEP_CURVES, keys, run.info.artifact_uri)
        ended = json.loads(meta.get("ended", "{}"))
        same = {r.run_id for r in runs if r.status != "RUNNING" and ended.get(r.run_id, -1) == r.end_ms}
        return {run_id: table.get(run_id, {}) for run_id in same}

    def _log_table(
        self, run_id: str, name: str, curves: Dict[str, Dict[str, History]], meta: Optional[Dict[str, Any]] = None
    ) -> None:
        """Curves by run ("" for a run's own) as one parquet artifact of columns (run, metric, step,
        value), `meta` as JSON in its schema's metadata."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [(run, key, points) for run, by_key in curves.items() for key, points in by_key.items()]
        column = {
            "metric": pa.array([k for _, k, points in rows for _ in points], pa.string()).dictionary_encode(),
            "step": pa.array([s for *_, points in rows for s, _ in points], pa.int64()),
            "value": pa.array([v for *_, points in rows for _, v in points], pa.float64()),
        }
        if set(curves) != {""}:
            column = {
                "run": pa.array([r for r, _, points in rows for _ in points], pa.string()).dictionary_encode(),
                **column,
            }
        table = pa.table(column, metadata={k: json.dumps(v) for k, v in (meta or {}).items()})
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / name
            pq.write_table(table, path)
            self._client().log_artifact(run_id, str(path))

    def _read_table(
        self, run_id: str, name: str, keys: Sequence[str], artifact_uri: str = ""
    ) -> Tuple[Dict[str, Dict[str, History]], Dict[str, Any]]:
        """What _log_table wrote: {run ("" for a run's own): {key: History sorted by step}} of
        `keys`, and its metadata (as text). Downloaded from the run's `artifact_uri` where it is
        known: through the run's id, MLflow looks the run up twice more (most of a read, 28 of
        31 ms a run from SQLite)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq
        from mlflow.artifacts import download_artifacts
        from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR as PROGRESS_BAR

        os.environ.setdefault(PROGRESS_BAR.name, "false")  # else a bar for each run's download
        with tempfile.TemporaryDirectory() as folder:
            if artifact_uri:
                path = download_artifacts(f"{artifact_uri.rstrip('/')}/{name}", dst_path=folder, tracking_uri=self.uri)
            else:
                path = self._client().download_artifacts(run_id, name, folder)
            table = pq.read_table(path)

        def codes(column: str):
            if column not in table.column_names:  # a run's own table: every row is the run's
                return np.zeros(len(table), np.int64), [""]
            cells = table[column].combine_chunks()
            cells = cells if pa.types.is_dictionary(cells.type) else cells.dictionary_encode()
            return cells.indices.to_numpy(zero_copy_only=False), cells.dictionary.to_pylist()

        (metric, metrics), (run, run_names) = codes("metric"), codes("run")
        steps, values = table["step"].to_numpy(), table["value"].to_numpy()
        wanted = set(keys)
        order = np.lexsort((steps, metric, run))  # by run, then metric, then step: each curve one slice
        run, metric, steps, values = run[order], metric[order], steps[order], values[order]
        out: Dict[str, Dict[str, History]] = {}
        changes = np.r_[True, (run[1:] != run[:-1]) | (metric[1:] != metric[:-1])] if len(order) else []
        starts = np.flatnonzero(changes)
        for start, end in zip(starts, np.r_[starts[1:], len(order)]):
            key = metrics[metric[start]]
            if key in wanted:
                out.setdefault(run_names[run[start]], {})[key] = list(
                    zip(steps[start:end].tolist(), values[start:end].tolist())
                )
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        return out, meta

    # ---------------------------------------------------------------- finding runs

    def child_runs(self, parent_run_id: str) -> List[RunRecord]:
        """A sweep's trials (and a branch study's base): the runs whose parent is this one."""
        c = self._client()
        exp_id = c.get_run(parent_run_id).info.experiment_id
        query = f"tags.`{PARENT_TAG}` = {quoted(parent_run_id)}"
        return self._every_run(exp_id, query)

    def reused_runs(self, parent_run_id: str) -> List[RunRecord]:
        """Finished runs of earlier sweeps that this sweep reused instead of running them again
        (tagged REUSED_BY_PREFIX + its id)."""
        c = self._client()
        exp_id = c.get_run(parent_run_id).info.experiment_id
        query = f"tags.`{REUSED_BY_PREFIX}{parent_run_id}` != ''"
        return self._every_run(exp_id, query)

    SEARCH_PAGE = 500
    """Runs a search asks MLflow for at once: it builds every run of a page as objects first (from
    SQLite about 100 kB a run of this project's), so a sweep of thousands is read in pages."""

    def _every_run(self, experiment_id: str, query: str) -> List[RunRecord]:
        """Every run of the experiment that `query` finds, page by page, as records."""
        c, found, token = self._client(), [], None
        while True:
            with _cyclic_gc_paused():
                page = c.search_runs(
                    [experiment_id], filter_string=query, max_results=self.SEARCH_PAGE, page_token=token
                )
            found += [RunRecord.of(r) for r in page]
            token = page.token
            if not token:
                return found

    def find_finished(self, tags: Dict[str, str]) -> Optional[RunRecord]:
        """The oldest FINISHED run of the experiment carrying all these tags."""
        c = self._client()
        exp = c.get_experiment_by_name(self._experiment())
        if exp is None:
            return None
        query = " and ".join(
            [*(f"tags.`{k}` = {quoted(v)}" for k, v in tags.items()), "attributes.status = 'FINISHED'"]
        )
        runs = c.search_runs(
            [exp.experiment_id], filter_string=query, max_results=1, order_by=["attributes.start_time ASC"]
        )
        return RunRecord.of(runs[0]) if runs else None

    def find_run(self, tags: Dict[str, str]) -> Optional[str]:
        """The oldest run of the experiment carrying all these tags (e.g. a trial's run, found again
        after --resume)."""
        c = self._client()
        exp = c.get_experiment_by_name(self._experiment())
        if exp is None:
            return None
        query = " and ".join(f"tags.`{k}` = {quoted(v)}" for k, v in tags.items())
        runs = c.search_runs(
            [exp.experiment_id], filter_string=query, max_results=1, order_by=["attributes.start_time ASC"]
        )
        return runs[0].info.run_id if runs else None

    def find_sweep_run(self, sweep_name: str) -> Optional[str]:
        """The newest parent run of a sweep in the experiment, by its name tag."""
        c = self._client()
        exp = c.get_experiment_by_name(self._experiment())
        if exp is None:
            return None
        return self._newest_sweep_run([exp.experiment_id], sweep_name)

    def find_sweep_run_anywhere(self, sweep_name: str) -> Optional[str]:
        """The newest parent run of a sweep: in the experiment first (if the store names one), then
        in every experiment."""
        if self.experiment:
            found = self.find_sweep_run(sweep_name)
            if found:
                return found
        exp_ids = [e.experiment_id for e in self._client().search_experiments(max_results=1000)]
        return self._newest_sweep_run(exp_ids, sweep_name) if exp_ids else None

    def newest_sweep_run(self) -> Optional[RunRecord]:
        """The experiment's newest sweep parent run, whatever its sweep (`orchestrator ui`)."""
        exp_id = self.experiment_id()
        if exp_id is None:
            return None
        runs = self._client().search_runs(
            [exp_id], filter_string=SWEEP_RUN_FILTER, max_results=1, order_by=["attributes.start_time DESC"]
        )
        return RunRecord.of(runs[0]) if runs else None

    def _newest_sweep_run(self, exp_ids: List[str], sweep_name: str) -> Optional[str]:
        query = f"tags.`{SWEEP_TAG}` = {quoted(sweep_name)} and {SWEEP_RUN_FILTER}"
        runs = self._client().search_runs(
            exp_ids, filter_string=query, max_results=1, order_by=["attributes.start_time DESC"]
        )
        return runs[0].info.run_id if runs else None

    def find_runs_named(self, name: str) -> List[RunRecord]:
        """Runs whose name or Tune trial id is `name`, newest first: in the experiment if it has
        any, else in every experiment (`orchestrator export`)."""
        if "'" in name or '"' in name:
            return []
        c = self._client()
        exp = c.get_experiment_by_name(self.experiment) if self.experiment else None
        scopes = [[exp.experiment_id]] if exp else []
        scopes.append([e.experiment_id for e in c.search_experiments(max_results=1000)])
        for exp_ids in scopes:
            runs = []
            for query in (f"attributes.run_name = {quoted(name)}", f"tags.`{TRIAL_TAG}` = {quoted(name)}"):
                runs += c.search_runs(exp_ids, filter_string=query, max_results=100) if exp_ids else []
            if runs:
                unique = {r.info.run_id: RunRecord.of(r) for r in runs}.values()
                return sorted(unique, key=lambda r: r.start_ms or 0, reverse=True)
        return []

    # ---------------------------------------------------------------- artifacts read back

    def list_artifacts(self, run_id: str, path: Optional[str] = None) -> List[str]:
        """Paths of the run's artifact files under `path`, recursively."""
        found: List[str] = []
        for info in self._client().list_artifacts(run_id, path):
            found.extend(self.list_artifacts(run_id, info.path) if info.is_dir else [info.path])
        return found

    def read_text_artifact(self, run_id: str, path: str) -> Optional[str]:
        """The text of one of the run's artifacts, None when it has none at `path`."""
        with tempfile.TemporaryDirectory() as folder:
            try:
                local = self._client().download_artifacts(run_id, path, folder)
            except Exception:  # MLflow raises its own errors (or OSError) for a missing artifact
                return None
            return Path(local).read_text() if Path(local).is_file() else None


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Python's cyclic collector paused while MLflow builds a page of runs: SQLAlchemy makes an
    object per param, tag and metric row (about 80 a run here), and every few hundred of them a
    collection walks all that is alive, so a page of 500 runs cost twice its time in collections
    (docs/benchmarks.md, "sweep_scale"). What the page leaves unreachable is freed at the next
    collection once it runs again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
