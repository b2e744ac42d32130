"""A Ray cluster of two nodes on this machine, checkpoints in an S3-compatible object store.

The head and a second node are separate `ray start` processes on 127.0.0.1 with token
authentication and resources of their own (head 2 CPUs, second node 1). The second node runs
in its own mount namespace with an empty tmpfs over HIDDEN, so a path there is node-local:
the head sees files the second node does not. The object store is moto's S3 server on
127.0.0.1 (`object_store`), reached by every node and driver through AWS_ENDPOINT_URL_S3.

Trials have D = 2 workers placed STRICT_SPREAD, one per node. Killing the second node's raylet
mid-trial takes its worker down; Ray Train restarts the worker group when the node rejoins,
from the last checkpoint in the object store.

Teardown never runs `ray stop` (it would kill other sessions' clusters): it ends the processes
it started and whatever runs in this cluster's temp dir, by pid.
"""

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.tracking.store import Store
from tests.conftest import BUCKET, ROOT, free_ports, run_cli, run_main, sqlite_store

pytestmark = pytest.mark.slow
RAY = Path(sys.executable).with_name("ray")
SCRUB = ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "MLFLOW_TRACKING_URI")
CAN_HIDE = os.geteuid() == 0 and shutil.which("unshare") is not None  # mount namespaces need root here


class TwoNodes:
    def __init__(self, temp: Path, env: dict, gcs_port: int):
        self.temp, self.env, self.address = temp, env, f"127.0.0.1:{gcs_port}"
        self.hidden = temp / "node-local"
        self.procs = []
        self.second_raylet_port = None

    def start_head(self, gcs_port: int) -> None:
        self._start(
            "head",
            [
                "--head",
                f"--port={gcs_port}",
                "--include-dashboard=false",
                "--num-cpus=2",
                f"--temp-dir={self.temp}/ray",
            ],
        )

    def start_second(self) -> None:
        """The second node; on each (re)start its raylet gets a fresh port, so it can be found."""
        self.second_raylet_port, *ports = free_ports(5)
        args = [
            f"--address={self.address}",
            "--num-cpus=1",
            f"--node-manager-port={self.second_raylet_port}",
            f"--dashboard-agent-listen-port={ports[0]}",
            f"--dashboard-agent-grpc-port={ports[1]}",
            f"--metrics-export-port={ports[2]}",
            f"--runtime-env-agent-port={ports[3]}",
        ]
        hide = (
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                'mount -t tmpfs -o size=1m tmpfs "$0" && exec "$@"',
                str(self.hidden),
            ]
            if CAN_HIDE
            else []
        )
        self._start("second", args, prefix=hide)

    def _start(self, name, args, prefix=()):
        cmd = [
            *prefix,
            str(RAY),
            "start",
            "--block",
            "--node-ip-address=127.0.0.1",
            "--object-store-memory=150000000",
            "--disable-usage-stats",
            *args,
        ]
        log = open(self.temp / f"{name}-{len(self.procs)}.log", "w")
        self.procs.append(
            subprocess.Popen(
                cmd, cwd=self.temp, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def wait_for_nodes(self, n: int, timeout_s: float = 120) -> None:
        """Until n nodes are alive: one driver joins the cluster (retrying while its head starts)
        and watches the node table, so Ray is imported and joined once, not once per look."""
        script = (
            "import sys, time, ray\n"
            "deadline = time.monotonic() + %f\n"
            "while True:\n"
            "    try:\n"
            "        ray.init(address=%r, logging_level='ERROR')\n"
            "        break\n"
            "    except Exception:\n"
            "        if time.monotonic() > deadline: sys.exit(1)\n"
            "        time.sleep(1)\n"
            "while sum(node['Alive'] for node in ray.nodes()) != %d:\n"
            "    if time.monotonic() > deadline: sys.exit(1)\n"
            "    time.sleep(0.5)\n"
        ) % (timeout_s, self.address, n)
        proc = subprocess.run([sys.executable, "-c", script], env=self.env, capture_output=True, text=True)
        if proc.returncode != 0:
            logs = "\n".join(p.read_text()[-1500:] for p in sorted(self.temp.glob("*.log")))
            raise RuntimeError(
                f"the cluster did not reach {n} alive nodes in {timeout_s} s:\n{proc.stderr[-1500:]}\n{logs}"
            )

    def kill_second_raylet(self) -> None:
        import psutil

        for proc in psutil.process_iter(["cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if "raylet" in cmd and f"--node_manager_port={self.second_raylet_port}" in cmd:
                proc.send_signal(signal.SIGKILL)
                return
        raise AssertionError("the second node's raylet was not found")

    def ray_logs(self, lines: int = 30) -> str:
        """The last lines of the GCS's and of every raylet's log (their periodic state dumps left
        out), for a failure's message: teardown deletes them."""
        folder = self.temp / "ray" / "session_latest" / "logs"
        tails = []
        for path in [*folder.glob("gcs_server.out"), *sorted(folder.glob("raylet*.out"))]:
            kept = [line for line in path.read_text(errors="replace").splitlines() if "[state-dump]" not in line]
            tails.append(f"--- {path.name}\n" + "\n".join(kept[-lines:]))
        return "\n".join(tails)

    def worker_output(self) -> str:
        logs = self.temp.glob("ray/session_latest/logs/worker-*.*")
        return "".join(p.read_text(errors="replace") for p in logs if p.suffix in (".out", ".err"))

    def stop(self) -> None:
        import psutil

        for proc in self.procs:
            proc.terminate()  # `ray start --block` stops what it started on SIGTERM
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib_suppress():
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in psutil.process_iter(["cmdline"]):  # anything left in this cluster's temp dir
            with contextlib_suppress():
                if any(str(self.temp) in part for part in proc.info["cmdline"] or []):
                    proc.kill()


def contextlib_suppress():
    import contextlib

    import psutil

    return contextlib.suppress(ProcessLookupError, psutil.Error, OSError)


@pytest.fixture(scope="module")
def cluster(object_store):
    temp = Path(tempfile.mkdtemp(prefix="orm-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    (temp / "node-local").mkdir()
    token = temp / "auth_token"
    token.write_text(secrets.token_hex(16))
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    env.update(
        object_store,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token),
        RAY_USAGE_STATS_ENABLED="0",
        PATH=f"{RAY.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    (gcs_port,) = free_ports(1)
    nodes = TwoNodes(temp, env, gcs_port)
    try:
        nodes.start_head(gcs_port)
        nodes.wait_for_nodes(1)
        nodes.start_second()
        nodes.wait_for_nodes(2)
        yield nodes
    finally:
        nodes.stop()
        shutil.rmtree(temp, ignore_errors=True)


UPDATES = 16  # about 4 s of training after the first checkpoint: the node is killed within it


def sweep_file(folder: Path) -> Path:
    """One trial of the tiny GPT with D = 2 workers, one per node, checkpointing often."""
    body = {
        "name": "multinode",
        "base": {
            "config": str(ROOT / "conf" / "train" / "tiny.yaml"),
            "overrides": {
                "model.n_layers": 1,
                "model.d_model": 64,
                "model.max_seq_len": 64,
                "data.seq_len": 64,
                "data.max_documents_per_source": 600,
                "batch.tokens_per_update": 4096,
                "cluster.num_workers": 2,
                "cluster.cpus_per_worker": 1,
                "cluster.placement_strategy": "STRICT_SPREAD",
                "deepspeed.zero_stage": 1,
                "schedule.warmup_tokens": 8192,
                "train.total_tokens": UPDATES * 4096,
                "train.report_every_tokens": 4096,
                "train.eval_every_tokens": 16384,
                "train.eval_tokens": 4096,
                "train.checkpoint_every_tokens": 8192,
                "train.max_failures": 3,
            },
        },
        "space": {"optim.lr": {"grid": [3.0e-3]}},
        "search": {"algorithm": "grid"},
        "max_failures": 2,
    }
    path = folder / "multinode.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def s3_keys(env, prefix):
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL_S3"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


@pytest.mark.skipif(not CAN_HIDE, reason="needs root and unshare to give the second node its own mounts")
def test_a_path_the_second_node_cannot_see_is_refused_before_anything_starts(cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code, out, err = run_cli(
        "sweep",
        sweep_file(tmp_path),
        f"cluster.address={cluster.address}",
        f"train.storage_path={cluster.hidden}/runs",
        f"tracking.uri={uri}",
        cwd=tmp_path,
        env=cluster.env,
        timeout=300,
    )
    lines = [line for line in err.splitlines() if line.startswith("orchestrator")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, out[-2000:] + err[-3000:]
    assert "train.storage_path" in lines[0] and "not visible from 1 of 2 nodes" in lines[0], lines[0]
    assert not (tmp_path / "mlflow.db").exists(), "an MLflow run was created for a sweep that never started"
    assert not list((cluster.hidden / "runs").iterdir()), "the probe left its marker behind"


def test_a_killed_node_s_trial_resumes_from_the_object_store(cluster, object_store, tmp_path, monkeypatch, capsys):
    """The sweep runs with storage on S3; once the first checkpoint is there, the second node's
    raylet is killed and the node started again. The trial finishes from that checkpoint, and
    MLflow holds every update's step once. Then `sweep --resume` and `report` find the sweep
    through its records in the object store, and `train` keeps its run record there."""
    prefix = f"t-{secrets.token_hex(4)}"
    storage, uri = f"s3://{BUCKET}/{prefix}", sqlite_store(tmp_path)
    sweep = sweep_file(tmp_path)
    args = [
        sys.executable,
        "-m",
        "orchestrator",
        "sweep",
        str(sweep),
        f"cluster.address={cluster.address}",
        f"train.storage_path={storage}",
        f"tracking.uri={uri}",
    ]
    log = open(tmp_path / "sweep.log", "w")
    driver = subprocess.Popen(
        args, cwd=tmp_path, env={**cluster.env, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 300
        # Ray Train writes its snapshot once a checkpoint is registered (uploaded and reported).
        while not any(k.endswith("/checkpoint_manager_snapshot.json") for k in s3_keys(cluster.env, prefix)):
            assert driver.poll() is None, (tmp_path / "sweep.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "no checkpoint reached the object store"
            time.sleep(0.2)
        cluster.kill_second_raylet()
        time.sleep(3)
        cluster.start_second()  # the node rejoins; the worker group is placed again
        try:
            code = driver.wait(timeout=300)  # about a minute once the node is back
        except subprocess.TimeoutExpired:
            code = "still running after 300 s"
        sweep_log = (tmp_path / "sweep.log").read_text()[-4000:]
        assert code == 0, f"the sweep after the node's restart: {code}\n{sweep_log}\n{cluster.ray_logs()}"
    finally:
        if driver.poll() is None:
            driver.kill()
        log.close()
    out = (tmp_path / "sweep.log").read_text()
    assert f"results in {storage}/sweeps/multinode/" in out, out[-3000:]
    resumed = [int(n.replace(",", "")) for n in re.findall(r"resuming at update (\d+)", cluster.worker_output())]
    assert resumed and min(resumed) >= 1, (
        "the restarted workers did not start from a checkpoint:\n" + cluster.worker_output()[-3000:]
    )

    parent = Store(uri, "orchestrator").find_sweep_run("multinode")
    (run,) = Store(uri).child_runs(parent)
    assert run.status == "FINISHED"
    for key, first in (("train/loss", 0), ("train/tokens", 1)):  # a loss at the tokens before its update
        steps = [s for s, _ in Store(uri).metric_history(run.run_id, key)]
        assert steps == [4096 * (i + first) for i in range(UPDATES)], (key, steps)
    assert not (tmp_path / "s3:").exists(), "the URI was taken for a local path"

    # --resume finds the sweep's record in the object store; every trial has ended already.
    code, out, err = run_cli(
        "sweep",
        sweep,
        f"cluster.address={cluster.address}",
        f"train.storage_path={storage}",
        f"tracking.uri={uri}",
        "--resume",
        cwd=tmp_path,
        env=cluster.env,
        timeout=300,
    )
    assert code == 0 and f"resuming sweep 'multinode' from {storage}/sweeps/multinode/" in out, (
        out[-3000:] + err[-3000:]
    )
    assert len(Store(uri).child_runs(parent)) == 1
    for name, value in object_store.items():  # `report` (in this process: it needs no Ray) reads the store
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(capsys, "report", sweep, f"tracking.uri={uri}", "--out", tmp_path / "report")
    assert code == 0 and (tmp_path / "report" / "summary.md").is_file(), out[-2000:] + err[-2000:]

    # `train` keeps its MLflow run id beside the checkpoints in the store, so a re-run finds it.
    train = [
        ROOT / "conf" / "train" / "tiny.yaml",
        f"cluster.address={cluster.address}",
        f"train.storage_path={storage}",
        f"tracking.uri={uri}",
        "train.run_name=solo",
        "model.n_layers=1",
        "model.d_model=64",
        "model.max_seq_len=64",
        "data.seq_len=64",
        "data.max_documents_per_source=600",
        "train.total_tokens=8192",
        "schedule.warmup_tokens=0",
        "train.eval_every_tokens=8192",
        "train.eval_tokens=4096",
    ]
    code, first, err = run_cli("train", *train, cwd=tmp_path, env=cluster.env, timeout=300)
    assert code == 0, first[-2000:] + err[-2000:]
    assert any(k.endswith("solo/orchestrator_run.json") for k in s3_keys(cluster.env, prefix))
    code, again, err = run_main(capsys, "train", *train)  # in this process: it finds the run finished, starts no Ray
    run_id = re.search(r"run 'solo': MLflow run (\w+)", first).group(1)
    assert code == 0 and "run 'solo' finished already with this config: final eval loss" in again, (
        again[-2000:] + err[-2000:]
    )
    assert f"MLflow run {run_id}; nothing to train" in again, again[-2000:]
