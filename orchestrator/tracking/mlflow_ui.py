"""The MLflow UI: `orchestrator ui` (mlflow ui over the configured store, bound to 127.0.0.1
unless asked otherwise, stopped with this process) and the links the commands print."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from orchestrator.core.config import redact_uri
from orchestrator.core.errors import ConfigError
from orchestrator.core.validation import loopback
from orchestrator.tracking import compare_view
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


def compare_view_link(
    uri: str, source_run_id: str, run_ids: Sequence[str], port: int = DEFAULT_PORT, host: str = DEFAULT_HOST
) -> str:
    """Write the view that compares `run_ids` (a sweep's trials; `source_run_id` its parent run, or
    the one run reported) into their experiment (compare_view.py) and return the link that opens
    it on the UI at `host`:`port`: the runs' chart view, every trial's train/loss and eval/loss
    against tokens, each in its batch size's colour, the run list by batch size beside them.
    The experiment page's runs route itself: MLflow's redirect from #/experiments/<id> drops the
    share key."""
    if not run_ids:
        return ""
    experiment = Store(uri).get_run(source_run_id).experiment_id
    page = f"http://{browse_host(host)}:{port}/#/experiments/{experiment}"
    try:
        key = compare_view.write(uri, source_run_id, run_ids)
    except Exception as exc:  # a store this user may read but not write: the report stands without its view
        log.warning("the compare view could not be written (%s): the link opens the experiment's runs", exc)
        return f"{page}?workflowType=machine_learning"
    query = urllib.parse.urlencode(
        {"viewStateShareKey": key, "compareRunsMode": "CHART", "workflowType": "machine_learning"}
    )
    return f"{page}/runs?{query}"


def sweep_run_ids(store: Store, parent_run_id: str) -> List[str]:
    """A sweep's trials: its child runs and the finished runs of earlier sweeps it reused (as
    `report` reads them, reporting/report_inputs.trial_runs)."""
    return [r.run_id for r in store.child_runs(parent_run_id) + store.reused_runs(parent_run_id)]


def ui_command(uri: str, port: int = DEFAULT_PORT) -> str:
    return f"orchestrator ui tracking.uri={redact_uri(uri)} --port {port}"


def serve_ui(cfg: Any, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, sweep: Optional[str] = None) -> int:
    """`mlflow ui` over the configured store, bound to 127.0.0.1 unless asked otherwise; first the
    links to it: the experiment's runs, and the view that compares every trial of `sweep` (by
    name; default the newest sweep in the experiment; written first, compare_view.py), both at
    this UI's own host and port."""
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
    compared = sweep_to_compare(store, sweep)  # before anything is written: a wrong --sweep is exit 2
    store.ensure_experiment()
    print(f"MLflow UI on http://{host}:{port} over {redact_uri(uri)}")
    print(f"runs of experiment {cfg.tracking.experiment!r}: {ui_link(uri, cfg.tracking.experiment, port, host=host)}")
    # The view is written here, where `ui` writes to the store anyway (the experiment), rather than
    # only by `report`: a sweep reported before views existed, or still running, compares too.
    line = sweep_link(store, *compared, host, port) if compared else None
    print(line or f"(no sweep in experiment {cfg.tracking.experiment!r} yet)", flush=True)
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


def sweep_to_compare(store: Store, sweep: Optional[str]) -> Optional[Tuple[str, str]]:
    """(parent run id, name) of sweep `sweep` (default: the experiment's newest; None when it has
    none); a sweep named but not in the store is a ConfigError (exit 2). Reads only."""
    if sweep is not None:
        if "'" in sweep and '"' in sweep:  # no MLflow search filter can name it, so no sweep is named so
            raise ConfigError("--sweep", f"got {sweep!r}; a sweep's name holds at most one kind of quote")
        parent = store.find_sweep_run(sweep) if store.exists() else None
        if parent is None:
            raise ConfigError(
                "--sweep", f"no sweep named {sweep!r} in experiment {store.experiment!r} of {redact_uri(store.uri)}"
            )
        return parent, sweep
    newest = store.newest_sweep_run() if store.exists() else None
    return (newest.run_id, newest.tags.get(SWEEP_TAG, newest.name)) if newest is not None else None


def sweep_link(store: Store, parent: str, name: str, host: str, port: int) -> Optional[str]:
    """The line with the link that compares every trial of sweep `name` (its view written first);
    None when it has no trial yet."""
    link = compare_view_link(store.uri, parent, sweep_run_ids(store, parent), port, host=host)
    return f"every trial of sweep {name!r} on one chart: {link}" if link else None


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
