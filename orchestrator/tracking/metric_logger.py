"""Batched, asynchronous metric logging to MLflow: the training loop's side of the tracking door
(the rest of it, runs, tags, artifacts and reading back, is store.py's `Store`).

`MetricLogger` batches points and sends them from a background thread (`log_batch`), so
tracking costs the training loop almost nothing; points that cannot be sent (tracking server
down) stay buffered up to a bound and are retried. A resume watermark (the last step MLflow
already holds, per metric) drops the points a resumed run replays, so each step appears once.
What MLflow takes goes on to the config's extra sinks (`tracking.sinks`: sinks.py), point for point.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from typing import Dict, Iterable, List, Optional, Tuple

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from orchestrator.core.config import redact_uri
from orchestrator.tracking.refusals import refuses_for_good, why_not
from orchestrator.tracking.sinks import NO_SINKS
from orchestrator.tracking.tracker import RunSink

MAX_BATCH = 1000  # MLflow's limit on metrics per log_batch call
# MLflow's REST client retries a failed request 7 times with exponential backoff (about 4 min)
# before it raises. MetricLogger keeps unsent points and retries them itself, so such a long
# in-call backoff would only stall flush() at checkpoints and close(): a process that runs a
# MetricLogger against a server gets these defaults (an explicit environment setting wins).
HTTP_RETRY_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}


REPORT_FLUSH_S = 10.0
"""How long a report to Ray (an evaluation, a checkpoint) waits for MLflow to take what was logged
before it, best effort: a scheduler decides on that report, and what stays unsent is kept."""
FINAL_FLUSH_S = 60.0
"""The longest a run that ends well waits for an unreachable store to take its last points; then
it fails (TrackingError), and the driver closes its MLflow run as FAILED with that reason."""


class TrackingError(RuntimeError):
    """Tracking cannot keep its promise (e.g. the buffer bound was passed): the run must fail."""


def is_local(uri: str) -> bool:
    """A store this process opens itself (SQLite, files), not a tracking server."""
    return uri.startswith(("sqlite:", "file:", "/"))


class MetricLogger:
    """Buffers metric points and sends them in batches from a background thread.

    - `log()` never blocks on the network; non-finite values are never sent.
    - Points at or below the per-metric watermark (what MLflow already holds) are dropped, so
      a run that resumes from a checkpoint and replays steps logs each step once.
    - When the store is unreachable or busy (server down, SQLite "database is locked"), points
      wait in the buffer and are retried; past `max_buffered_points` the next `log()` raises
      TrackingError. Nothing is dropped silently. A batch sent twice (reply lost, then retried)
      is stored once: MLflow's metric key includes the timestamp taken here at `log()`.
    - `sinks` (the run's extra sinks: Store.sinks) get each batch once MLflow has taken it, so
      they hold what MLflow holds, each point once.
    """

    def __init__(
        self,
        uri: str,
        run_id: str,
        flush_every_s: float = 5.0,
        max_buffered_points: int = 100_000,
        watermarks: Optional[Dict[str, int]] = None,
        sinks: RunSink = NO_SINKS,
    ):
        self.uri, self.run_id, self.sinks = uri, run_id, sinks
        self.flush_every_s = flush_every_s
        self.max_buffered_points = max_buffered_points
        self._client = MlflowClient(tracking_uri=uri)
        self._watermarks: Dict[str, int] = dict(watermarks or {})
        self._pending: List[Metric] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self.last_error: Optional[str] = None
        self.refused: Optional[str] = None
        """Why the store refused a batch for good (refuses_for_good); then the next log() fails the run."""
        self.sent_points = 0
        self.failed_sends = 0  # batches that failed and were kept for a retry
        if not is_local(uri):
            for key, value in HTTP_RETRY_DEFAULTS.items():
                os.environ.setdefault(key, value)
        self._thread = threading.Thread(target=self._loop, name="mlflow-logger", daemon=True)
        self._thread.start()

    # -- producer side

    def log(self, metrics: Dict[str, float], step: int) -> None:
        timestamp = int(time.time() * 1000)
        with self._lock:
            if self.refused:  # buffering would only postpone the failure to the run's end
                raise TrackingError(f"MLflow at {redact_uri(self.uri)} refuses writes: {self.refused}")
            if len(self._pending) >= self.max_buffered_points:
                raise TrackingError(
                    f"MLflow at {redact_uri(self.uri)} unreachable and {len(self._pending):,} points buffered "
                    f"(tracking.max_buffered_points={self.max_buffered_points:,}); last error: {self.last_error}"
                )
            for key, value in metrics.items():
                if value is None or not math.isfinite(value) or step <= self._watermarks.get(key, -1):
                    continue
                self._pending.append(Metric(key, float(value), timestamp, int(step)))
                self._watermarks[key] = int(step)

    @property
    def watermarks(self) -> Dict[str, int]:
        """Per metric, the last step accepted (sent or buffered)."""
        with self._lock:
            return dict(self._watermarks)

    @property
    def buffered(self) -> int:
        with self._lock:
            return len(self._pending)

    def pending_state(self) -> List[Tuple[str, float, int, int]]:
        """Unsent points, for a checkpoint's client state (so a crash cannot lose them)."""
        with self._lock:
            return [(m.key, m.value, m.timestamp, m.step) for m in self._pending]

    def restore_pending(self, points: Iterable[Tuple[str, float, int, int]], sent_watermarks: Dict[str, int]) -> None:
        """Re-queue a checkpoint's unsent points that MLflow does not already hold (they keep
        their timestamps, and the watermark rises past them so a replay cannot add them twice)."""
        with self._lock:
            for key, value, timestamp, step in points:
                if step > sent_watermarks.get(key, -1):
                    self._pending.append(Metric(key, value, timestamp, step))
                    self._watermarks[key] = max(self._watermarks.get(key, -1), int(step))

    # -- sending

    def _send_some(self) -> bool:
        """Send up to one batch; True when something was sent."""
        with self._send_lock:
            with self._lock:
                batch = self._pending[:MAX_BATCH]
            if not batch:
                return False
            try:
                self._client.log_batch(self.run_id, metrics=batch, synchronous=True)
            except Exception as exc:  # server down, SQLite busy, ...: keep the points, retry later
                self.last_error = why_not(exc)
                self.failed_sends += 1
                if refuses_for_good(exc):
                    self.refused = self.last_error
                return False
            with self._lock:
                del self._pending[: len(batch)]
            self.sent_points += len(batch)
            self.last_error = None
            # A log() call's points share their step and stay together: one sink call each.
            for step, points in itertools.groupby(batch, key=lambda m: m.step):
                self.sinks.log_metrics(self.run_id, {m.key: m.value for m in points}, step)
            return True

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_every_s)
            self._wake.clear()
            while self._send_some():
                pass

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Send everything now; True when the buffer is empty, False if the store stayed down."""
        deadline = time.monotonic() + timeout_s
        while self.buffered:
            if not self._send_some():
                if time.monotonic() > deadline or self.refused:
                    return False
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        return True

    def close(self, timeout_s: Optional[float] = None) -> None:
        """Flush (waiting up to timeout_s, FINAL_FLUSH_S by default, for an unreachable store) and
        stop the thread."""
        timeout_s = FINAL_FLUSH_S if timeout_s is None else timeout_s
        ok = self.flush(timeout_s)
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=5)
        if not ok:
            where = redact_uri(self.uri)
            unsent = f"could not send {self.buffered:,} points to MLflow at {where}"
            raise TrackingError(f"{unsent} within {timeout_s:.0f} s: {self.last_error}")
