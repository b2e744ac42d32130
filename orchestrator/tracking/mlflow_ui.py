"""The MLflow UI: `orchestrator ui` (mlflow ui over the configured store, bound to 127.0.0.1
unless asked otherwise, stopped with this process) and the links the commands print."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from orchestrator.core.config import redact_uri
from orchestrator.core.validation import loopback
from orchestrator.tracking.store import Store, resolve_uri

log = logging.getLogger(__name__)


def ui_link(uri: str, experiment: str, port: int = 5000, run_id: Optional[str] = None) -> str:
    """A link that opens MLflow's model-training view (3.x opens the GenAI view otherwise)."""
    exp_id = Store(uri).experiment_id(experiment) or "0"
    base = f"http://127.0.0.1:{port}/#/experiments/{exp_id}"
    if run_id:
        base += f"/runs/{run_id}"
    return base + "?workflowType=machine_learning"


COMPARED_METRICS = ("train/loss", "eval/loss")


def compare_link(uri: str, run_ids: Sequence[str], port: int = 5000, metrics: Sequence[str] = COMPARED_METRICS) -> str:
    """A link to MLflow's metric page with every given run's `metrics` on one chart against
    step (= tokens seen): all trials of a sweep compared in one view, without the runs
    table's nesting or its first-10 limit (MLflow 3's #/metric page; its query is URL-encoded)."""
    if not run_ids:
        return ""
    experiment = Store(uri).get_run(run_ids[0]).experiment_id
    query = {  # the page reads most values as JSON, the two axis words as they are
        "runs": json.dumps(list(run_ids), separators=(",", ":")),
        "metric": json.dumps(metrics[0]),
        "experiments": json.dumps([experiment]),
        "plot_metric_keys": json.dumps(list(metrics), separators=(",", ":")),
        "plot_layout": "{}",
        "x_axis": "step",
        "y_axis_scale": "linear",
        "line_smoothness": "1",
        "show_point": "false",
        "deselected_curves": "[]",
        "last_linear_y_axis_range": "[]",
    }
    encoded = "&".join(f"{k}={urllib.parse.quote(v)}" for k, v in query.items())
    return f"http://127.0.0.1:{port}/#/metric?{encoded}"


def ui_command(uri: str, port: int = 5000) -> str:
    return f"orchestrator ui tracking.uri={redact_uri(uri)} --port {port}"


def serve_ui(cfg: Any, host: str = "127.0.0.1", port: int = 5000) -> int:
    """`mlflow ui` over the configured store, bound to 127.0.0.1 unless asked otherwise."""
    if not loopback(host):  # MLflow's UI has no login: whoever reaches it reads, changes and deletes every run
        where = "on every interface" if host in ("0.0.0.0", "::", "") else f"on {host}, beyond this machine"
        log.warning(
            "the MLflow UI has no authentication and --host %s serves it %s: anyone who reaches port %d can read, "
            "change and delete every run; keep --host 127.0.0.1 and tunnel to it (ssh -L %d:127.0.0.1:%d HOST)",
            host,
            where,
            port,
            port,
            port,
        )
    uri = resolve_uri(cfg.tracking.uri)
    Store(uri, cfg.tracking.experiment).ensure_experiment()
    print(f"MLflow UI on http://{host}:{port} over {redact_uri(uri)}")
    print(f"runs of experiment {cfg.tracking.experiment!r}: {ui_link(uri, cfg.tracking.experiment, port)}", flush=True)
    # One worker process and no GenAI job runner: a UI for one person over training runs
    # (MLflow's defaults start four workers plus a job queue of ten).
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    if uri.startswith("sqlite:"):
        cmd += ["--default-artifact-root", Path(uri.split("sqlite:///")[-1]).parent.joinpath("mlartifacts").as_uri()]
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    return _serve_until_stopped(cmd, env)


def _serve_until_stopped(cmd: List[str], env: Dict[str, str], grace_s: float = 5.0) -> int:
    """Run a server (mlflow ui, which starts uvicorn under it) in its own process group and stop
    that whole group when this process is told to stop (SIGTERM, SIGINT, SIGHUP): stopping
    `orchestrator ui` leaves nothing listening. Exit 0 when stopped so, else the server's code."""
    server = subprocess.Popen(cmd, env=env, start_new_session=True)
    stopped = []

    def stop(signum, _frame) -> None:
        stopped.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        code = server.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _stop_group(server.pid, grace_s)  # the workers the server left, if any
    return 0 if stopped else code


def _stop_group(group: int, grace_s: float) -> None:
    """SIGTERM to every process of a group, SIGKILL to what is left after grace_s."""
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(ProcessLookupError):  # raised once the group is empty
        os.killpg(group, signal.SIGTERM)
        while time.monotonic() < deadline:
            os.killpg(group, 0)
            time.sleep(0.1)
        os.killpg(group, signal.SIGKILL)
