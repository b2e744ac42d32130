import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Nothing is downloaded in the tests: Hugging Face libraries stay offline (subprocesses inherit it).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "conf" / "train" / "tiny.yaml"


def free_ports(n: int):
    """n distinct free TCP ports on 127.0.0.1 (bound at once, so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_cli(*args, cwd=None, env=None, timeout=600, check=False):
    """The real command line in a subprocess: (returncode, stdout, stderr)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", *map(str, args)],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc.returncode, proc.stdout, proc.stderr


def run_main(capsys, *args):
    """The command line in this process (`orchestrator.cli.main`, what `python -m orchestrator`
    calls): (returncode, stdout, stderr). Where a subprocess would prove nothing more."""
    from orchestrator import cli

    try:
        code = cli.main([str(a) for a in args])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


BUCKET = "runs"


@pytest.fixture(scope="session")
def object_store():
    """An S3-compatible object store on 127.0.0.1 (moto in server mode) holding one bucket,
    BUCKET. Yields the environment that points pyarrow (so Ray) and boto3 at it."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_ports(1)[0], verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL_S3": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL_S3"],
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    ).create_bucket(Bucket=BUCKET)
    yield env
    server.stop()


def zero_stage(stage: int) -> list:
    """Overrides that run ZeRO `stage` itself, on one worker too, where a run otherwise takes the
    stage holding the least memory (orchestrator.core.derived.zero_stage): for the tests of a
    stage's own code path."""
    return [f"deepspeed.zero_stage={stage}", f"deepspeed.extra.zero_optimization.stage={stage}"]


@functools.lru_cache(maxsize=None)
def _empty_store() -> Path:
    """An MLflow SQLite store with its tables made, once per test session: MLflow makes a new
    store by running its schema migrations, about 3 s each time."""
    from mlflow.tracking import MlflowClient

    db = Path(tempfile.mkdtemp(prefix="mlflow-empty-")) / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


def sqlite_store(folder: Path) -> str:
    """The URI of an MLflow store in `folder`: empty, a copy of the session's, unless one is there."""
    db = Path(folder) / "mlflow.db"
    if not db.exists():
        db.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_empty_store(), db)
    return f"sqlite:///{db}"


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the in-process integration tests (2 CPUs, fractional per worker), with
    the settings the commands give a Ray they start (ray_session.LOCAL_RAY_SETTINGS)."""
    import ray

    from orchestrator.driver.ray_session import LOCAL_RAY_SETTINGS

    for name, value in LOCAL_RAY_SETTINGS.items():
        os.environ.setdefault(name, value)
    if not ray.is_initialized():
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            logging_level="WARNING",
            log_to_driver=False,
        )
    yield
    ray.shutdown()


def varied_corpus(folder: Path, docs: int = 400, seed: int = 0) -> Path:
    """A jsonl corpus of short documents of very different lengths, so micro-batches hold
    different counts of real (loss-bearing) tokens."""
    import json
    import random

    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "varied.jsonl"
    words = "alpha beta gamma delta token batch noise scale update worker".split()
    with path.open("w") as f:
        for _ in range(docs):
            n = rng.choice([1, 2, 3, 8, 20])
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(n))}) + "\n")
    return path


def touched(what: str):
    """A stand-in that fails the test when called: `what` must not start for bad input
    (pytest.fail, which the command line's catch of any Exception lets through)."""

    def fail(*args, **kwargs):
        pytest.fail(f"{what} was touched for bad input")

    return fail


@pytest.fixture
def nothing_starts(monkeypatch, tmp_path):
    """Sentinels in place of Ray, MLflow runs and the corpus; a working directory to keep empty."""
    from orchestrator.driver import ray_session, run_life
    from orchestrator.tracking.store import Store

    monkeypatch.setattr(ray_session, "ray_init", touched("Ray"))
    monkeypatch.setattr(run_life, "preflight", touched("the corpus"))
    monkeypatch.setattr(Store, "create_run", touched("MLflow"))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def write_sweep(folder: Path, source: str = "smoke.yaml", **sections) -> Path:
    """folder/sweep.yaml: a shipped sweep file (conf/sweep/`source`) on the tiny config, with
    `sections` put in its place (None: left out)."""
    import yaml

    body = yaml.safe_load((ROOT / "conf" / "sweep" / source).read_text())
    body["base"]["config"] = str(TINY)
    for name, value in sections.items():
        if value is None:
            body.pop(name, None)
        else:
            body[name] = value
    path = Path(folder) / "sweep.yaml"
    path.write_text(yaml.safe_dump(body))
    return path
