"""MLflow: experiments, parent/child runs, params, tags, artifacts, reading runs back. With
metric_logger.py (the workers' batched asynchronous `MetricLogger`) the only place that talks to
MLflow.

Runs: one per `orchestrator train`; for a sweep one parent run and one child run per trial
(tag `mlflow.parentRunId`). The x axis of every training curve is tokens: `step` = tokens seen.
Every param, tag and text logged here passes the config's one redaction rule (`redact_uri`):
whatever a config, a sweep file or an error holds, no URI's password reaches the store.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from orchestrator.core.config import redact_uri
from orchestrator.tracking.metric_logger import is_local

PARENT_TAG = "mlflow.parentRunId"
ROLE_TAG = "orchestrator.role"  # SWEEP_ROLE on a sweep's parent run
SWEEP_ROLE = "sweep"
SEARCH_TAG = "orchestrator.search"  # a sweep's search algorithm
SCHEDULER_TAG = "orchestrator.scheduler"  # ... and its early-stopping scheduler
SWEEP_RUN_FILTER = f"tags.`{ROLE_TAG}` = '{SWEEP_ROLE}'"  # MLflow search filter of sweep parent runs
TRIAL_TAG = "orchestrator.trial_id"
BRANCH_OF_TAG = "orchestrator.branch_of"  # a branch's base run id
BRANCH_AT_TAG = "orchestrator.branch_at_tokens"  # the tokens the branch starts from
SWEEP_TAG = "orchestrator.sweep"
FAILURE_TAG = "orchestrator.failure_reason"
STOPPED_AT_TAG = "orchestrator.stopped_at_tokens"  # the early-stopping rung a trial was stopped at
WARNING_TAG_PREFIX = "orchestrator.warning."  # + a 3-digit index: what a worker warned about, in order
CHECKPOINTS_TAG = "orchestrator.checkpoints"  # where a run's checkpoint_* folders live (path or URI)
MAX_PARAMS = 100  # MLflow's limit on params per log_batch call


def quoted(value: str) -> str:
    """A string literal of an MLflow search filter: in single quotes, or in double quotes when it
    holds a single quote (the filter language has no escapes; a value with both is refused)."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise ValueError(f"{value!r} holds both quote characters, which an MLflow search filter cannot express")


def resolve_uri(uri: str) -> str:
    """Make a relative SQLite/file store absolute: Ray workers do not share the driver's cwd."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    if "://" not in uri:
        return str(Path(uri).resolve())
    return uri


def client(uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=uri)


def ensure_experiment(uri: str, name: str) -> str:
    """Experiment id, creating it (artifacts beside a local store) when missing."""
    c = client(uri)
    found = c.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if uri.startswith("sqlite:"):
        location = Path(uri.split("sqlite:///")[-1]).resolve().parent.joinpath("mlartifacts").as_uri()
    try:
        return c.create_experiment(name, artifact_location=location)
    except Exception:  # another process created it first
        found = c.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def create_run(uri: str, experiment: str, name: str, tags: Optional[Dict[str, str]] = None) -> str:
    exp_id = ensure_experiment(uri, experiment)
    tags = {k: redact_uri(str(v)) for k, v in (tags or {}).items()}
    return client(uri).create_run(exp_id, run_name=name, tags=tags).info.run_id


def find_run(uri: str, experiment: str, tags: Dict[str, str]) -> Optional[str]:
    """The run carrying all these tags (e.g. a trial's run, found again after --resume)."""
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return None
    query = " and ".join(f"tags.`{k}` = {quoted(v)}" for k, v in tags.items())
    runs = c.search_runs(
        [exp.experiment_id], filter_string=query, max_results=1, order_by=["attributes.start_time ASC"]
    )
    return runs[0].info.run_id if runs else None


def log_params(uri: str, run_id: str, params: Dict[str, Any]) -> None:
    """Params once per run; a resumed run re-logging identical values is skipped."""
    c = client(uri)
    existing = c.get_run(run_id).data.params
    todo = [Param(k, redact_uri(str(v))[:6000]) for k, v in sorted(params.items()) if k not in existing]
    for i in range(0, len(todo), MAX_PARAMS):
        c.log_batch(run_id, params=todo[i : i + MAX_PARAMS])


def set_tags(uri: str, run_id: str, tags: Dict[str, str]) -> None:
    client(uri).log_batch(run_id, tags=[RunTag(k, redact_uri(str(v))) for k, v in tags.items()])


def warning_tags(messages: Dict[int, str]) -> Dict[str, str]:
    """{index: message} as tags that sort in the order the warnings were raised."""
    return {f"{WARNING_TAG_PREFIX}{i:03d}": m[:5000] for i, m in messages.items()}


def log_warnings(uri: str, run_id: str, messages: Dict[int, str]) -> None:
    """Record a worker's warnings on its run (see workloads/train/worker_warnings.py)."""
    set_tags(uri, run_id, warning_tags(messages))


def warnings_in(tags: Dict[str, str]) -> Dict[str, str]:
    """{tag: message} of the worker warnings among a run's tags, in the order they were raised."""
    return {k: tags[k] for k in sorted(tags) if k.startswith(WARNING_TAG_PREFIX)}


def run_warnings(uri: str, run_id: str) -> Dict[str, str]:
    return warnings_in(client(uri).get_run(run_id).data.tags)


def log_metrics(uri: str, run_id: str, metrics: Dict[str, float], step: int) -> None:
    """A few values at one step, now (the training loop's own go through MetricLogger)."""
    now = int(time.time() * 1000)
    client(uri).log_batch(run_id, metrics=[Metric(k, float(v), now, int(step)) for k, v in metrics.items()])


def finish_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    client(uri).set_terminated(run_id, status=status)


def reopen_run(uri: str, run_id: str) -> None:
    """Mark a run RUNNING again when training resumes into it (a re-run `orchestrator train`,
    a retried trial): MLflow's system-metrics sampler stops at once on a run that is not
    RUNNING, and the UI should not show a run in progress as FAILED. The failure reason of the
    earlier attempt goes too: it no longer describes the run."""
    c = client(uri)
    if FAILURE_TAG in c.get_run(run_id).data.tags:
        c.delete_tag(run_id, FAILURE_TAG)
    c.update_run(run_id, status="RUNNING")


def log_text(uri: str, run_id: str, text: str, artifact_file: str) -> None:
    client(uri).log_text(run_id, redact_uri(text), artifact_file)


def log_dict(uri: str, run_id: str, data: Dict[str, Any], artifact_file: str) -> None:
    client(uri).log_dict(run_id, data, artifact_file)


def log_file(uri: str, run_id: str, path: str | Path, artifact_path: Optional[str] = None) -> None:
    client(uri).log_artifact(run_id, str(path), artifact_path)


def log_figure(uri: str, run_id: str, figure: Any, artifact_file: str) -> None:
    client(uri).log_figure(run_id, figure, artifact_file)


# ---------------------------------------------------------------- reading back


def metric_history(uri: str, run_id: str, key: str) -> List[Tuple[int, float]]:
    """[(step, value)] sorted by step."""
    return sorted((m.step, m.value) for m in client(uri).get_metric_history(run_id, key))


def last_steps(uri: str, run_id: str) -> Dict[str, int]:
    """Per metric, the last step MLflow holds: the resume watermark."""
    c = client(uri)
    keys = c.get_run(run_id).data.metrics.keys()
    return {k: max(m.step for m in c.get_metric_history(run_id, k)) for k in keys}


def get_run(uri: str, run_id: str):
    return client(uri).get_run(run_id)


def child_runs(uri: str, parent_run_id: str) -> list:
    c = client(uri)
    exp_id = c.get_run(parent_run_id).info.experiment_id
    return c.search_runs([exp_id], filter_string=f"tags.`{PARENT_TAG}` = {quoted(parent_run_id)}", max_results=10000)


def find_sweep_run(uri: str, experiment: str, sweep_name: str) -> Optional[str]:
    """The newest parent run of a sweep, by its name tag."""
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = c.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`{SWEEP_TAG}` = {quoted(sweep_name)} and {SWEEP_RUN_FILTER}",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    return runs[0].info.run_id if runs else None


# ---------------------------------------------------------------- system metrics


def start_system_metrics(logger, interval_s: float):
    """MLflow's own CPU / memory / GPU sampler on `logger`'s run, its samples sent through
    `logger` (a MetricLogger): buffered while the store is away and replayed, each step once,
    like every other metric (MLflow's own sender drops them and stops). Call .finish() before
    closing the logger."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    class Buffered(SystemMetricsMonitor):
        def publish_metrics(self, metrics):
            logger.log({f"system/{k}": v for k, v in metrics.items()}, self._logging_step)
            self._logging_step += 1
            for monitor in self.monitors:
                monitor.clear_metrics()

    monitor = Buffered(logger.run_id, sampling_interval=interval_s, resume_logging=True, tracking_uri=logger.uri)
    monitor.start()
    return monitor


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


# ---------------------------------------------------------------- read helpers for report.py
# Read-only (apart from log_files): what `orchestrator report` needs to find a sweep or a run
# and read its trials back.


def store_exists(uri: str) -> bool:
    """False for a local SQLite store whose file is missing (reading must not create one)."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :]).exists()
    return True


def try_get_run(uri: str, run_id: str):
    """The run, or None when no run has this id."""
    try:
        return client(uri).get_run(run_id)
    except Exception:
        return None


def find_sweep_run_anywhere(uri: str, sweep_name: str, experiment: Optional[str] = None) -> Optional[str]:
    """The newest parent run of a sweep: in `experiment` first, then in every experiment."""
    if experiment:
        found = find_sweep_run(uri, experiment, sweep_name)
        if found:
            return found
    c = client(uri)
    exp_ids = [e.experiment_id for e in c.search_experiments(max_results=1000)]
    if not exp_ids:
        return None
    query = f"tags.`{SWEEP_TAG}` = {quoted(sweep_name)} and {SWEEP_RUN_FILTER}"
    runs = c.search_runs(exp_ids, filter_string=query, max_results=1, order_by=["attributes.start_time DESC"])
    return runs[0].info.run_id if runs else None


def runs_metrics(
    uri: str, runs: Sequence[Any], keys: Iterable[str], workers: Optional[int] = None
) -> Dict[str, Dict[str, list]]:
    """{run id: {key: [(step, value)] sorted by step}} of MLflow runs as searched (their
    data.metrics say which keys each has; absent ones map to []). MLflow has no bulk history
    call: from a tracking server the histories are fetched 8 at a time (each is a round trip;
    3.5x faster on the demo's runs, docs/benchmarks.md), from a store this process opens
    (SQLite) one at a time, as threads only contend there (`workers` overrides)."""
    keys, c = list(keys), client(uri)
    jobs = [(r.info.run_id, k) for r in runs for k in keys if k in r.data.metrics]
    workers = workers or (1 if is_local(resolve_uri(uri)) else 8)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        histories = list(pool.map(lambda job: c.get_metric_history(*job), jobs))
    out = {r.info.run_id: {k: [] for k in keys} for r in runs}
    for (run_id, key), history in zip(jobs, histories):
        out[run_id][key] = sorted((m.step, m.value) for m in history)
    return out


def list_artifacts(uri: str, run_id: str, path: Optional[str] = None) -> List[str]:
    """Paths of the run's artifact files under `path`, recursively."""
    c = client(uri)
    found: List[str] = []
    for info in c.list_artifacts(run_id, path):
        found.extend(list_artifacts(uri, run_id, info.path) if info.is_dir else [info.path])
    return found


def find_runs_named(uri: str, name: str, experiment: Optional[str] = None) -> list:
    """Runs whose name or Tune trial id is `name`, newest first: in `experiment` if it has
    any, else in every experiment (`orchestrator export`)."""
    if "'" in name or '"' in name:
        return []
    c = client(uri)
    exp = c.get_experiment_by_name(experiment) if experiment else None
    scopes = [[exp.experiment_id]] if exp else []
    scopes.append([e.experiment_id for e in c.search_experiments(max_results=1000)])
    for exp_ids in scopes:
        runs = []
        for query in (f"attributes.run_name = {quoted(name)}", f"tags.`{TRIAL_TAG}` = {quoted(name)}"):
            runs += c.search_runs(exp_ids, filter_string=query, max_results=100) if exp_ids else []
        if runs:
            unique = {r.info.run_id: r for r in runs}.values()
            return sorted(unique, key=lambda r: r.info.start_time or 0, reverse=True)
    return []


def read_text_artifact(uri: str, run_id: str, path: str) -> Optional[str]:
    """The text of one of the run's artifacts, None when it has none at `path`."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        try:
            local = client(uri).download_artifacts(run_id, path, folder)
        except Exception:  # MLflow raises its own errors (or OSError) for a missing artifact
            return None
        return Path(local).read_text() if Path(local).is_file() else None
