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
from orchestrator.core.errors import ConfigError
from orchestrator.core.validation import loopback
from orchestrator.tracking.run_tags import SWEEP_TAG
from orchestrator.tracking.store import Store, resolve_uri

log = logging.getLogger(__name__)


DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 5000
"""Where `orchestrator ui` serves unless told otherwise: the links the commands print point there
unless they are told the UI's own (`ui` prints its own; `report --ui-port`)."""


def browse_host(host: str) -> str:
    """The host of a link to a UI bound to `host`: a bind-all address is no place to browse to
    (this machine's loopback is), an IPv6 literal goes in brackets."""
    if host in ("", "0.0.0.0", "::"):
        return DEFAULT_HOST
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def ui_link(
    uri: str, experiment: str, port: int = DEFAULT_PORT, run_id: Optional[str] = None, host: str = DEFAULT_HOST
) -> str:
    """A link that opens MLflow's model-training view (3.x opens the GenAI view otherwise)."""
    exp_id = Store(uri).experiment_id(experiment) or "0"
    base = f"http://{browse_host(host)}:{port}/#/experiments/{exp_id}"
    if run_id:
        base += f"/runs/{run_id}"
    return base + "?workflowType=machine_learning"


COMPARED_METRICS = ("train/loss", "eval/loss")


def compare_link(
    uri: str,
    run_ids: Sequence[str],
    port: int = DEFAULT_PORT,
    metrics: Sequence[str] = COMPARED_METRICS,
    host: str = DEFAULT_HOST,
) -> str:
    """A link to MLflow's metric page, on the UI at `host`:`port`, with every given run's
    `metrics` on one chart against step (= tokens seen): all trials of a sweep compared in one
    view, without the runs table's nesting or its first-10 limit (MLflow 3's #/metric page; its
    query is URL-encoded). That page colours the runs from its own palette, whatever their
    mlflow.runColor (seen in Chromium, MLflow 3.17): their order, by batch size, is what groups them."""
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
    return f"http://{browse_host(host)}:{port}/#/metric?{encoded}"


def sweep_runs_in_order(uri: str, parent_run_id: str) -> List[str]:
    """The ids of a sweep's runs by batch size, then lr, then name: the order `report` compares
    them in, so the chart's legend reads as the report's tables."""

    def number(run, key: str) -> float:
        try:
            return float(run.params.get(key, 0))
        except ValueError:
            return 0.0

    runs = Store(uri).child_runs(parent_run_id)
    ordered = sorted(runs, key=lambda r: (number(r, "batch.tokens_per_update"), number(r, "optim.lr"), r.name))
    return [r.run_id for r in ordered]


def ui_command(uri: str, port: int = DEFAULT_PORT) -> str:
    return f"orchestrator ui tracking.uri={redact_uri(uri)} --port {port}"


def serve_ui(cfg: Any, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, sweep: Optional[str] = None) -> int:
    """`mlflow ui` over the configured store, bound to 127.0.0.1 unless asked otherwise; first the
    links to it: the experiment's runs, and every trial of `sweep` (by name; default the newest
    sweep in the experiment) on one chart, both at this UI's own host and port."""
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
    store = Store(uri, cfg.tracking.experiment)
    compared = sweep_link(store, sweep, host, port)  # before anything is written: a wrong --sweep is exit 2
    store.ensure_experiment()
    print(f"MLflow UI on http://{host}:{port} over {redact_uri(uri)}")
    print(f"runs of experiment {cfg.tracking.experiment!r}: {ui_link(uri, cfg.tracking.experiment, port, host=host)}")
    print(compared or f"(no sweep in experiment {cfg.tracking.experiment!r} yet)", flush=True)
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


def sweep_link(store: Store, sweep: Optional[str], host: str, port: int) -> Optional[str]:
    """The line with the compare link of sweep `sweep` (default: the experiment's newest; None when
    it has none); a sweep named but not in the store is a ConfigError (exit 2)."""
    if sweep is not None:
        parent = store.find_sweep_run(sweep) if store.exists() else None
        if parent is None:
            raise ConfigError(
                "--sweep", f"no sweep named {sweep!r} in experiment {store.experiment!r} of {redact_uri(store.uri)}"
            )
        name = sweep
    else:
        newest = store.newest_sweep_run() if store.exists() else None
        if newest is None:
            return None
        parent, name = newest.run_id, newest.tags.get(SWEEP_TAG, newest.name)
    runs = sweep_runs_in_order(store.uri, parent)
    return (
        f"every trial of sweep {name!r} on one chart: {compare_link(store.uri, runs, port, host=host)}"
        if runs
        else None
    )


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
