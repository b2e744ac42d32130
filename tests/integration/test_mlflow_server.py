"""Tracking through a real `mlflow server` on PostgreSQL (the deploy/mlflow set-up, without
Docker): a real `orchestrator train` run read back in full, the server stopped for 20 s in the
middle of logging, the buffer bound while it is down.

PostgreSQL is Debian's package (tests/setup_services.sh installs it): `initdb` in a temporary
folder, the server on a free port of 127.0.0.1 with its socket in that folder. As root it runs
as the `postgres` user (PostgreSQL refuses to run as root). Every process started here is
ended by its process group; nothing else is touched.
"""

import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from orchestrator.driver import launch
from orchestrator.tracking import metric_logger
from orchestrator.tracking.store import Store
from tests.conftest import TINY, free_ports, run_main

pytestmark = pytest.mark.slow
EXPERIMENT = "server-tests"
KEYS = ("train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s")
TOKENS = 512
OUTAGE_S = 20
# The server without its background job runner (not used here; it costs two more processes).
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def answers(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status == 200
    except OSError:
        return False


def _signal_group(pid, sig):
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _exited(pid):
    """True once the process has exited (without reaping it, unless poll() already did)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class Service:
    """A command in a process group of its own, output to a log file; stop() ends the group."""

    def __init__(self, cmd, log, env=None, health=None):
        self.cmd, self.log, self.env, self.health = cmd, Path(log), env, health
        self.proc = None

    def start(self, timeout=180):
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(self.env or {})},
        )
        out.close()
        deadline = time.monotonic() + timeout
        while self.health and not answers(self.health):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"{self.cmd[:4]} did not come up:\n{self.tail()}")
            time.sleep(0.3)
        return self

    def stop(self, sig=signal.SIGTERM, grace=15):
        """`sig` to the group, then SIGKILL to whatever is left of it. The leader is reaped
        only at the end, so the group id cannot have been reused by then."""
        if self.proc is None:
            return
        pid, deadline = self.proc.pid, time.monotonic() + grace
        _signal_group(pid, sig)
        while time.monotonic() < deadline and not _exited(pid):
            time.sleep(0.1)
        _signal_group(pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def tail(self, n=3000):
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


# ---------------------------------------------------------------- PostgreSQL + MLflow server


def postgres_bin():
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL cluster; yields its libpq URI (database `mlflow`)."""
    bin_dir = postgres_bin()
    root = os.geteuid() == 0
    if bin_dir is None:
        if not root:
            pytest.skip(
                "PostgreSQL binaries missing (Debian package `postgresql`); run tests/setup_services.sh as root"
            )
        pytest.fail("PostgreSQL binaries missing although running as root: run `bash tests/setup_services.sh`")
    folder = Path(tempfile.mkdtemp(prefix="orch-pg-"))  # not under pytest's 0700 tmp: the postgres user needs it
    as_user = []
    if root:  # PostgreSQL refuses to run as root
        user = pwd.getpwnam("postgres")  # created by Debian's postgresql package
        os.chown(folder, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, (port,) = folder / "data", free_ports(1)

    def pg(*args, **kw):
        return subprocess.run([*as_user, *map(str, args)], capture_output=True, text=True, timeout=120, **kw)

    try:
        done = pg(bin_dir / "initdb", "-D", data, "-U", "mlflow", "-A", "trust", "-E", "UTF8", "--no-sync")
        assert done.returncode == 0, done.stderr
        done = pg(
            bin_dir / "pg_ctl",
            "-D",
            data,
            "-l",
            folder / "postgres.log",
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )
        assert done.returncode == 0, done.stderr + (folder / "postgres.log").read_text()
        done = pg(bin_dir / "createdb", "-h", "127.0.0.1", "-p", port, "-U", "mlflow", "mlflow")
        assert done.returncode == 0, done.stderr
        yield f"postgresql://mlflow@127.0.0.1:{port}/mlflow"
    finally:
        if (data / "postmaster.pid").exists():
            pg(bin_dir / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    """`mlflow server` over PostgreSQL (SQLite where PostgreSQL is unavailable) on a free port."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    try:
        # The driver is named: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, while the
        # dev extra installs psycopg2 (deploy/mlflow's image installs both).
        service_db = request.getfixturevalue("postgres")
        store = service_db.replace("postgresql://", "postgresql+psycopg2://", 1)
    except pytest.skip.Exception:
        service_db, store = None, f"sqlite:///{folder}/mlflow.db"
    (port,) = free_ports(1)
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        store,
        "--artifacts-destination",
        str(folder / "artifacts"),
        "--serve-artifacts",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    service = Service(cmd, folder / "server.log", env=SERVER_ENV, health=f"http://127.0.0.1:{port}/health")
    service.uri, service.store, service.db = f"http://127.0.0.1:{port}", store, service_db
    started = time.monotonic()
    service.start()
    print(f"mlflow server on {store.split(':')[0]} up in {time.monotonic() - started:.0f} s")
    yield service
    service.stop()


@pytest.fixture(autouse=True)
def bounded_http_retries(monkeypatch):
    """What MetricLogger sets for its process, undone after each test."""
    for key, value in metric_logger.HTTP_RETRY_DEFAULTS.items():
        monkeypatch.setenv(key, os.environ.get(key, value))


def point(i):
    return {key: i + j / 10 for j, key in enumerate(KEYS)}


# ---------------------------------------------------------------- the tests


def test_buffer_bound_while_the_server_is_down(monkeypatch):
    """Nothing listens on the port: log() raises TrackingError once the bound is reached,
    naming the store, the bound and the error; close() refuses to pretend it sent them."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail at once: the test is about the bound
    uri = f"http://127.0.0.1:{free_ports(1)[0]}"
    logger = metric_logger.MetricLogger(uri, "0" * 32, flush_every_s=0.1, max_buffered_points=20)
    logger.log(point(1), TOKENS)
    deadline = time.monotonic() + 60
    while logger.last_error is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert logger.last_error, "the sender never reported a failure"
    with pytest.raises(metric_logger.TrackingError) as err:
        for i in range(2, 100):
            logger.log(point(i), i * TOKENS)
    message = str(err.value)
    assert uri in message and "unreachable" in message and "max_buffered_points=20" in message, message
    assert "Connection refused" in message or "Max retries" in message, message
    assert logger.buffered <= 20 + len(KEYS)  # bounded: at most one report past the bound
    with pytest.raises(metric_logger.TrackingError, match="could not send"):
        logger.close(timeout_s=1)


def test_a_real_training_run_on_the_postgres_server(server, ray_session, tmp_path, monkeypatch, capsys):
    """`orchestrator train` in this process, on the tests' Ray, logging to the server."""
    if server.db is None:
        pytest.skip("PostgreSQL unavailable (not root and no postgresql binaries)")
    for key in metric_logger.HTTP_RETRY_DEFAULTS:  # the command's driver runs with MLflow's own defaults
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(
        capsys,
        "train",
        TINY,
        "model.n_layers=1",
        "model.d_model=32",
        "data.seq_len=32",
        "model.max_seq_len=32",
        "batch.tokens_per_update=512",
        "train.total_tokens=8192",
        "train.report_every_tokens=512",
        "train.eval_every_tokens=4096",
        "train.checkpoint_every_tokens=4096",
        "data.max_documents_per_source=300",
        "schedule.warmup_tokens=1024",
        "tracking.system_metrics=true",
        "tracking.system_metrics_interval_s=1",
        f"tracking.uri={server.uri}",
        f"tracking.experiment={EXPERIMENT}",
        f"train.storage_path={tmp_path}/runs",
        "train.run_name=pg",
    )
    assert code == 0, out[-3000:] + err[-3000:]
    run_id = launch.recorded_run_id(tmp_path / "runs", "pg")
    uri = server.uri
    run = Store(uri).get_run(run_id)
    assert run.status == "FINISHED" and run.name == "pg"

    reports = [TOKENS * i for i in range(1, 17)]
    for key in ("train/tokens", "perf/tokens_per_s"):
        assert [s for s, _ in Store(uri).metric_history(run_id, key)] == reports, key
    for key in ("train/loss", "train/lr", "train/optimizer_step"):  # at the tokens the update started from
        assert [s for s, _ in Store(uri).metric_history(run_id, key)] == [r - TOKENS for r in reports], key
    assert [s for s, _ in Store(uri).metric_history(run_id, "eval/loss")] == [0, 4096, 8192]
    assert [v for _, v in Store(uri).metric_history(run_id, "train/tokens")] == reports
    params = run.params
    assert params["batch.tokens_per_update"] == "512" and params["train.total_steps"] == "16"
    assert params["model.d_model"] == "32" and params["tracking.uri"] == uri
    assert {"config.yaml", "deepspeed.json", "plan.txt", "loss_vs_tokens.png"} <= set(Store(uri).list_artifacts(run_id))
    # System metrics are checked in test_tracking.py: MLflow's sampler gives up after one failed
    # request and this run is often shorter than its first sample over HTTP.

    # ... and it all lives in PostgreSQL, not in some local file
    import psycopg2

    with psycopg2.connect(server.db) as db, db.cursor() as cur:
        cur.execute(
            "select count(*), count(distinct step) from metrics where run_uuid = %s and key = 'train/loss'", (run_id,)
        )
        assert cur.fetchone() == (16, 16)
    db.close()


def test_server_stopped_for_20_s_loses_no_point(server):
    """A trainer-like loop logs every 50 ms for the whole test; the server is killed, stays
    down 20 s, and is started again on the same port and store. log() never blocks on the
    network; after close() every step is there exactly once."""
    uri = server.uri
    run_id = Store(uri, EXPERIMENT).create_run("outage")
    logger = metric_logger.MetricLogger(uri, run_id, flush_every_s=0.5)
    stop, logged, slowest = threading.Event(), [0], [0.0]

    def trainer():
        while not stop.is_set():
            i = logged[0] + 1
            started = time.perf_counter()
            logger.log(point(i), i * TOKENS)
            slowest[0] = max(slowest[0], time.perf_counter() - started)
            logged[0] = i
            time.sleep(0.05)

    loop = threading.Thread(target=trainer, daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + 30
        while logger.sent_points < 10 * len(KEYS) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert logger.sent_points >= 10 * len(KEYS) and logger.last_error is None, logger.last_error
        server.stop(signal.SIGKILL)  # a crash: no graceful shutdown
        down_at, sent_before = time.monotonic(), logger.sent_points
        time.sleep(OUTAGE_S)
        assert logger.failed_sends >= 1 and logger.last_error, "no send failed while the server was down"
        assert logger.sent_points == sent_before and logger.buffered > 0
        server.start()  # same command: same port, same store
        print(f"server down {time.monotonic() - down_at:.0f} s (20 s + restart); {logger.buffered:,} points buffered")
        deadline = time.monotonic() + 60
        while logger.buffered > 4 * len(KEYS) and time.monotonic() < deadline:
            time.sleep(0.2)  # the backlog drains by itself, while the loop keeps logging
        assert logger.buffered <= 4 * len(KEYS), f"backlog not drained: {logger.buffered}, {logger.last_error}"
        time.sleep(1)
    finally:
        stop.set()
        loop.join(10)
    logger.close(timeout_s=60)
    assert slowest[0] < 0.2, f"log() blocked for {slowest[0]:.2f} s"
    expected = [i * TOKENS for i in range(1, logged[0] + 1)]
    for key in KEYS:
        points = Store(uri).metric_history(run_id, key)
        assert [s for s, _ in points] == expected, f"{key}: {len(points)} points for {len(expected)} steps"
    assert Store(uri).metric_history(run_id, KEYS[0])[-1][1] == pytest.approx(logged[0])


def test_stopping_orchestrator_ui_stops_its_server(tmp_path):
    """SIGTERM to `orchestrator ui` (not to its group: a user's `kill PID`) stops the MLflow
    server and its uvicorn workers: within 5 s nothing listens on the port and the command
    has exited 0."""
    import socket

    (port,) = free_ports(1)
    log = (tmp_path / "ui.log").open("wb")
    store = f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"
    ui = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "ui", store, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while not answers(f"http://127.0.0.1:{port}/health"):
            assert ui.poll() is None and time.monotonic() < deadline, (tmp_path / "ui.log").read_text()[-3000:]
            time.sleep(0.3)
        ui.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        assert ui.wait(10) == 0
        while time.monotonic() - stopped < 5:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) != 0:
                    break
            time.sleep(0.1)
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, "something still listens on the UI's port"
        assert time.monotonic() - stopped < 5
    finally:
        if ui.poll() is None:
            ui.kill()
        log.close()
