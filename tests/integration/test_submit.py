"""`orchestrator submit` and `orchestrator jobs` against a real local Ray cluster with token auth.

The cluster: `ray start --head --block` on 127.0.0.1 with free ports, its own short --temp-dir,
and Ray token authentication on (RAY_AUTH_MODE=token, the token in a file named by
RAY_AUTH_TOKEN_PATH). The submitting side gets only RAY_AUTH_TOKEN_PATH, not RAY_AUTH_MODE: the
orchestrator sends the token itself (Ray's own job client would not without RAY_AUTH_MODE=token).

Teardown does NOT run `ray stop --force`: that kills every Ray process on the machine, including
other sessions' clusters. It ends the `ray start --block` process it started (which stops its
GCS, raylet and dashboard), then any process left whose command line or working directory lies in
this cluster's temp dir, by pid.
"""

import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError
from tests.conftest import ROOT, TINY, free_ports, run_cli, run_main, sqlite_store

SMOKE = ROOT / "conf" / "sweep" / "smoke.yaml"
# submit's local checks need only a YAML mapping inside the project; until the smoke sweep
# exists the secret test submits a train config under the sweep verb and stops the job.
SWEEP = SMOKE if SMOKE.exists() else TINY
RAY = Path(sys.executable).with_name("ray")
SCRUB = (
    "RAY_ADDRESS",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN_PATH",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
)


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    env.update(extra)
    return env


class Cluster:
    def __init__(self, address, token_file, temp):
        self.address, self.token_file, self.temp = address, token_file, temp

    def cli(self, *args, env=None, timeout=300):
        """The orchestrator command line with the token file (and nothing else) for auth."""
        return run_cli(*args, env={"RAY_AUTH_TOKEN_PATH": str(self.token_file), **(env or {})}, timeout=timeout)

    def client(self):
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.address, headers={"Authorization": f"Bearer {self.token_file.read_text()}"})


def _kill_leftovers(temp: str) -> None:
    import psutil

    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid == me:
                continue
            hit = any(temp in part for part in (proc.info["cmdline"] or []))
            hit = hit or proc.cwd().startswith(temp)
            if hit:
                proc.kill()
        except (psutil.Error, OSError):
            pass


@pytest.fixture(scope="module")
def cluster():
    temp = tempfile.mkdtemp(prefix="orc-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    token_file = Path(temp) / "auth_token"
    token_file.write_text(secrets.token_hex(16))
    dash, gcs, agent, client_port, metrics, rt_agent = free_ports(6)
    env = clean_env(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token_file),
        RAY_USAGE_STATS_ENABLED="0",
        PATH=f"{RAY.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    cmd = [
        str(RAY),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash}",
        f"--port={gcs}",
        f"--dashboard-agent-listen-port={agent}",
        f"--ray-client-server-port={client_port}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={rt_agent}",
        "--num-cpus=2",
        "--object-store-memory=200000000",
        "--disable-usage-stats",
        f"--temp-dir={temp}/ray",
    ]
    log = open(Path(temp) / "ray-start.log", "w")
    proc = subprocess.Popen(cmd, cwd=temp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        _wait_ready(address, token_file, proc, temp)
        yield Cluster(address, token_file, temp)
    finally:
        proc.terminate()  # `ray start --block` stops its GCS, raylet, dashboard... on SIGTERM
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # slow under load: no need to be graceful in a test
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the process group we started, by its id
            except ProcessLookupError:
                pass
        for _ in range(2):
            _kill_leftovers(temp)
            time.sleep(0.5)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _wait_ready(address, token_file, proc, temp, timeout_s=120):
    import requests

    headers = {"Authorization": f"Bearer {token_file.read_text()}"}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"ray start exited {proc.returncode}:\n{(Path(temp) / 'ray-start.log').read_text()[-3000:]}"
            )
        try:
            if requests.get(f"{address}/api/jobs/", headers=headers, timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise RuntimeError(f"Ray dashboard at {address} not ready after {timeout_s} s")


def _wait(client, job_id, statuses, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.get_job_status(job_id).value
        if status in statuses:
            return status
        time.sleep(1)
    raise AssertionError(f"job {job_id} still {status} after {timeout_s} s:\n{client.get_job_logs(job_id)[-3000:]}")


def _one_line(code, err, *must):
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for text in must:
        assert text in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------- no cluster needed


def test_entrypoint_is_quoted_and_round_trips():
    from orchestrator.cluster import submit

    overrides = ["tracking.uri=sqlite:////tmp/a b/mlflow.db", "tracking.experiment=${oc.env:SECRET_X}", "optim.lr=3e-4"]
    entry = submit.build_entrypoint("sweep", "conf/sweep/smoke.yaml", overrides, resume=True)
    assert shlex.split(entry) == [
        "python",
        "-m",
        "orchestrator",
        "sweep",
        "conf/sweep/smoke.yaml",
        *overrides,
        "--resume",
    ]
    assert "'tracking.experiment=${oc.env:SECRET_X}'" in entry  # single quotes: no shell expansion on the cluster


def test_job_spec_env_and_excludes(monkeypatch):
    from orchestrator.cluster import submit

    for var in SCRUB:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SECRET_X", "hunter2")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:pw@mlflow:5000")
    spec = submit.job_spec("plan", TINY, ["tracking.experiment=${oc.env:SECRET_X}"], secrets_from=submit.SEND)
    assert spec.runtime_env["working_dir"] == str(ROOT)
    for skip in (".venv", ".git", "runs", "mlruns", "mlflow.db", ".cache", "reports"):
        assert skip in spec.runtime_env["excludes"]
    assert spec.runtime_env["env_vars"] == {
        "SECRET_X": "hunter2",
        "MLFLOW_TRACKING_PASSWORD": "pw",
        "MLFLOW_TRACKING_URI": "http://user:pw@mlflow:5000",
    }
    assert shlex.split(spec.entrypoint)[3:] == [
        "plan",
        "conf/train/tiny.yaml",
        "tracking.experiment=${oc.env:SECRET_X}",
        "tracking.uri=${oc.env:MLFLOW_TRACKING_URI}",
    ]
    assert "hunter2" not in spec.entrypoint and "pw" not in spec.entrypoint
    # without a choice, nothing is sent: exit 2 naming what would be and how to choose
    with pytest.raises(
        ConfigError, match="--send-secrets: the job needs MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_URI, SECRET_X; "
    ):
        submit.job_spec("plan", TINY, ["tracking.experiment=${oc.env:SECRET_X}"])
    monkeypatch.setenv("MLFLOW_TRACKING_INSECURE_TLS", "true")  # no secret: it travels either way
    spec = submit.job_spec("plan", TINY, ["tracking.experiment=${oc.env:SECRET_X}"], secrets_from=submit.ON_CLUSTER)
    assert spec.runtime_env["env_vars"] == {"MLFLOW_TRACKING_INSECURE_TLS": "true"}
    assert "${oc.env:SECRET_X}" in spec.entrypoint and any("SECRET_X" in note for note in spec.notes)
    # an explicit tracking.uri wins over MLFLOW_TRACKING_URI; a relative local store gets a note
    spec = submit.job_spec("plan", TINY, ["tracking.uri=sqlite:///mlflow.db"], secrets_from=submit.SEND)
    assert "${oc.env:MLFLOW_TRACKING_URI}" not in spec.entrypoint
    assert any("relative" in note for note in spec.notes)


def test_token_lookup_follows_ray(monkeypatch, tmp_path):
    from orchestrator.cluster import ray_jobs

    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(var, raising=False)
    assert ray_jobs.ray_auth_token()[0] is None
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("home\n")
    assert ray_jobs.ray_auth_token()[0] == "home"
    (tmp_path / "tok").write_text("file")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "tok"))
    assert ray_jobs.ray_auth_token()[0] == "file"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "env")
    assert ray_jobs.ray_auth_token()[0] == "env"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert ray_jobs.ray_auth_token()[0] is None


def test_missing_sweep_file_exits_2_before_any_contact(tmp_path, capsys, monkeypatch):
    # the address is never tried: a missing file is reported, not the (dead) address
    code, out, err = run_main(capsys, "submit", tmp_path / "nope.yaml", "--address", "http://127.0.0.1:9")
    _one_line(code, err, "nope.yaml", "not found")
    # a secret the job would need, with no word on where it comes from: exit 2 before any contact
    monkeypatch.setenv("SECRET_X", "hunter2")
    args = ("submit", SWEEP, "tracking.experiment=${oc.env:SECRET_X}", "--address", "http://127.0.0.1:9")
    code, out, err = run_main(capsys, *args)
    _one_line(code, err, "--send-secrets: the job needs SECRET_X", "--secrets-on-cluster")
    assert "hunter2" not in out + err
    assert out == ""


def test_unreachable_address_exits_2_with_one_line(capsys):
    (port,) = free_ports(1)
    code, out, err = run_main(capsys, "submit", SWEEP, "--address", f"http://127.0.0.1:{port}")
    _one_line(code, err, "unreachable address", f"127.0.0.1:{port}")
    code, _, err = run_main(capsys, "jobs", "list", "--address", f"127.0.0.1:{port}")
    _one_line(code, err, "unreachable address")


def test_jobs_id_argument_checked_before_any_contact(capsys):
    code, _, err = run_main(capsys, "jobs", "stop", "--address", "http://127.0.0.1:9")
    _one_line(code, err, "needs a submission id")
    code, _, err = run_main(capsys, "jobs", "list", "some-id", "--address", "http://127.0.0.1:9")
    _one_line(code, err, "takes no submission id")


def _project(root: Path, files=()) -> Path:
    """A project folder holding a sweep file (a YAML mapping is all job_spec needs) and `files`."""
    for rel in ("conf/sweep/s.yaml", *files):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("name: s\n" if rel.endswith("s.yaml") else "x\n")
    return root / "conf/sweep/s.yaml"


def test_uploads_leave_secrets_out_and_source_in(tmp_path):
    from orchestrator.cluster import submit, upload

    secrets_ = [
        "deploy/mlflow/.env",
        ".env",
        ".env.local",
        "conf/prod.env",
        ".envrc",
        "certs/server.pem",
        "certs/server.key",
        ".aws/credentials",
        "deploy/credentials",
        "gcp/credentials.json",
        ".netrc",
        ".ssh/id_rsa",
        ".ssh/id_ed25519.pub",
        "auth_token",
        ".ray/auth_token",
        ".git-credentials",
        ".kube/config",
        ".pypirc",
        ".pgpass",
        ".databrickscfg",
        ".config/gcloud/application_default_credentials.json",
        ".s3cfg",
        ".boto",
        "ci.token",
        "keys/service_account.json",
        "infra/terraform.tfstate",
        "infra/terraform.tfstate.backup",
        "deploy/mlflow/basic_auth.db",
        ".htpasswd",
        ".npmrc",
        "mine/notes.secret",  # the user's own pattern, from .rayignore
    ]
    kept = [
        "orchestrator/cluster/submit.py",
        "workloads/text/tokenizer.py",
        "workloads/tokens.py",
        "conf/train/tiny.yaml",
        "deploy/mlflow/docker-compose.yaml",
        "deploy/mlflow/README.md",
        "docs/keys.md",
    ]
    sweep = _project(tmp_path, secrets_ + kept)
    (tmp_path / ".rayignore").write_text("*.secret\n")  # what submit --help points to for your own patterns
    spec = submit.job_spec("sweep", sweep, root=tmp_path)
    # Ray's own walk and matcher decide what is zipped: the same call here
    shipped = upload.upload_files(Path(spec.runtime_env["working_dir"]), spec.runtime_env["excludes"])
    assert not set(secrets_) & set(shipped), sorted(set(secrets_) & set(shipped))
    assert set(kept) <= set(shipped), sorted(set(kept) - set(shipped))
    # the real project: every source and config file travels
    shipped = upload.upload_files(ROOT, upload.EXCLUDES)
    sources = [
        p.relative_to(ROOT).as_posix()
        for pattern in ("orchestrator/**/*.py", "workloads/**/*.py", "conf/**/*.yaml")
        for p in ROOT.glob(pattern)
    ]
    assert sources and not set(sources) - set(shipped), sorted(set(sources) - set(shipped))


def test_oversized_working_directory_refused_before_contact(tmp_path):
    from orchestrator.cluster import submit, upload
    from orchestrator.core.errors import ConfigError

    sweep = _project(tmp_path, ["orchestrator/a.py"])
    big = tmp_path / "data" / "shards" / "big.bin"
    big.parent.mkdir(parents=True)
    with open(big, "wb") as f:  # sparse: no disk used
        os.truncate(f.fileno(), upload.upload_limit() + 2**20)
    spec = submit.job_spec("sweep", sweep, root=tmp_path)
    with pytest.raises(ConfigError) as err:
        submit.run(spec, "http://127.0.0.1:9")  # nothing listens there: refused before any contact
    message = str(err.value)
    assert message.startswith("working_dir:") and "data/shards/big.bin" in message and ".rayignore" in message, message
    assert f"{upload.upload_limit() / 2**20:,.1f} MiB" in message and "unreachable" not in message, message
    (tmp_path / ".rayignore").write_text("data/\n")  # the fix the message suggests
    upload.check_upload_size(spec.runtime_env)


def test_token_never_sent_over_plain_http_to_another_host(monkeypatch, capsys, tmp_path):
    from orchestrator import cli
    from orchestrator.cluster import ray_jobs
    from orchestrator.core.errors import ConfigError

    class Probed(Exception):
        pass

    def probe(address, timeout_s=5.0):
        raise Probed(address)  # connect() got past the check and would contact the address

    for var in SCRUB:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.setattr(ray_jobs, "_probe", probe)
    for address in (
        "http://127.0.0.1:8265",
        "http://127.3.4.5:8265",
        "localhost:8265",
        "http://[::1]:8265",
        "http://10.1.2.3:8265",
        "https://ray.example.com",
    ):
        with pytest.raises(Probed):  # no token: nothing to protect
            ray_jobs.connect(address)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "t0k3n")
    for address in ("http://10.1.2.3:8265", "ray-head:8265", "http://ray.example.com"):
        with pytest.raises(ConfigError) as err:
            ray_jobs.connect(address)
        for text in ("--address", "plain http", "https://", "127.0.0.1", "--insecure"):
            assert text in str(err.value), str(err.value)
        assert "t0k3n" not in str(err.value)
    for address in (
        "http://127.0.0.1:8265",
        "http://127.3.4.5:8265",
        "localhost:8265",
        "http://[::1]:8265",
        "https://ray.example.com:8443",
    ):
        with pytest.raises(Probed):
            ray_jobs.connect(address)
    with pytest.raises(Probed):
        ray_jobs.connect("http://10.1.2.3:8265", insecure=True)
    # this machine's own cluster token (~/.ray/auth_token) goes to loopback only, unless RAY_AUTH_MODE=token
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("l0cal")
    monkeypatch.setenv("HOME", str(home))
    assert ray_jobs.ray_auth_token("http://127.0.0.1:8265")[0] == "l0cal"
    token, why = ray_jobs.ray_auth_token("https://ray.example.com")
    assert token is None and "RAY_AUTH_MODE=token" in why and "l0cal" not in why
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert ray_jobs.ray_auth_token("https://ray.example.com")[0] == "l0cal"
    # the command line: one line, exit 2; --insecure on both verbs
    assert cli.main(["jobs", "list", "--address", "http://10.1.2.3:8265"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--insecure" in err, err
    assert cli.main(["jobs", "list", "--address", "http://10.1.2.3:8265", "--insecure"]) == 1  # probed: got past
    assert capsys.readouterr().err.strip() == "orchestrator jobs: error: Probed: http://10.1.2.3:8265"
    assert cli.build_parser().parse_args(["submit", "s.yaml", "--address", "x", "--insecure"]).insecure


def test_unreadable_nodes_warn_and_go_on(monkeypatch, capsys):
    from orchestrator.cluster import ray_jobs, submit
    from orchestrator.formulas import feasibility

    class Client:
        def get_address(self):
            return "http://127.0.0.1:8265"

    def refused(client, path, job_id=None):
        raise ray_jobs.ClusterError("the Ray dashboard answered GET /api/v0/nodes with HTTP 404")

    monkeypatch.setattr(ray_jobs, "get_json", refused)
    submit.check_fit(Client(), [feasibility.Shape(64, {"CPU": 1.0})])  # no error: cannot judge
    err = capsys.readouterr().err
    assert err.startswith("warning: cannot read the nodes") and "HTTP 404" in err and len(err.splitlines()) == 1, err


class _FakeJobs:
    """A job client whose log streams and answers are scripted: each stream is (chunks, error)."""

    def __init__(self, streams, statuses, logs):
        self.streams, self.statuses, self.logs = list(streams), iter(statuses), logs

    def get_address(self):
        return "http://127.0.0.1:8265"

    async def tail_job_logs(self, job_id):
        chunks, error = self.streams.pop(0)
        for chunk in chunks:
            yield chunk
        if error:
            raise error

    def get(self, client, path, job_id=None):
        return {"logs": self.logs} if path.endswith("/logs") else {"status": next(self.statuses), "message": ""}


def test_follow_skips_what_it_printed_and_falls_back_to_polling(monkeypatch, capsys):
    from orchestrator.cluster import follow

    cut = RuntimeError("WebSocket connection closed unexpectedly with close code 1006")  # what Ray raises
    # a stream cut off after two lines; the next one starts again at the first line (as Ray's does)
    fake = _FakeJobs(
        [(["a\n", "b\n"], cut), (["a\nb", "\nc\n"], None)], ["RUNNING", "RUNNING", "SUCCEEDED"], "a\nb\nc\nd\n"
    )
    monkeypatch.setattr(follow, "get_json", fake.get)
    assert follow.follow_job(fake, "j1") == 0
    out, err = capsys.readouterr()
    assert out == "a\nb\nc\nd\njob j1 SUCCEEDED\n", out
    assert "lost (WebSocket connection closed" in err and "reconnecting in 1 s" in err and "reconnected" in err, err
    # a stream that always breaks while the status answers: after the window, poll the status
    monkeypatch.setattr(follow, "RECONNECT_WINDOW_S", 0.2)
    monkeypatch.setattr(follow, "POLL_S", 0.0)
    fake = _FakeJobs([([], cut)] * 20, ["RUNNING"] * 8 + ["FAILED"], "x\n")
    monkeypatch.setattr(follow, "get_json", fake.get)
    assert follow.follow_job(fake, "j2") == 1
    out, err = capsys.readouterr()
    assert out == "x\njob j2 FAILED\n" and "log stream keeps breaking off" in err, out + err


# ---------------------------------------------------------------- against the cluster


@pytest.mark.slow
def test_refused_or_missing_token_exits_2(cluster, tmp_path):
    bad = tmp_path / "bad_token"
    bad.write_text("not-the-token")
    code, _, err = run_cli("jobs", "list", "--address", cluster.address, env={"RAY_AUTH_TOKEN_PATH": str(bad)})
    _one_line(code, err, "refused the auth token", "RAY_AUTH_TOKEN_PATH")
    code, _, err = run_cli("jobs", "list", "--address", cluster.address, env={"HOME": str(tmp_path)})
    _one_line(code, err, "requires an auth token")
    assert "not-the-token" not in err and cluster.token_file.read_text() not in err


@pytest.mark.slow
def test_plan_job_follow_logs_status_list(cluster, monkeypatch, capsys):
    from orchestrator.cluster import submit

    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(cluster.token_file))
    spec = submit.job_spec("plan", TINY, ["optim.lr=1e-3"])
    assert submit.run(spec, cluster.address, follow_logs=True) == 0
    out = capsys.readouterr().out
    assert f"submitted job {spec.submission_id}" in out and "tokens / update" in out
    assert f"orchestrator jobs stop {spec.submission_id} --address {cluster.address}" in out
    assert out.rstrip().endswith(f"job {spec.submission_id} SUCCEEDED")

    code, out, err = cluster.cli("jobs", "logs", spec.submission_id, "--address", cluster.address)
    assert code == 0 and "tokens / update" in out, err
    code, out, err = cluster.cli("jobs", "status", spec.submission_id, "--address", cluster.address)
    assert code == 0 and "SUCCEEDED" in out, err
    code, out, err = cluster.cli("jobs", "list", "--address", cluster.address)
    assert code == 0, err
    assert out.splitlines()[0].split() == ["ID", "STATUS", "ENTRYPOINT", "START"]
    assert any(spec.submission_id in line and "SUCCEEDED" in line for line in out.splitlines()), out

    code, _, err = cluster.cli("jobs", "status", "no-such-job", "--address", cluster.address)
    _one_line(code, err, "no-such-job")


@pytest.mark.slow
def test_failed_job_follow_exits_1(cluster, monkeypatch, capsys):
    from orchestrator.cluster import submit

    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(cluster.token_file))
    spec = submit.command_spec(["python", "-c", "import sys; print('bye'); sys.exit(3)"], name="fail")
    assert submit.run(spec, cluster.address, follow_logs=True) == 1
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.slow
def test_jobs_stop_stops_a_running_job(cluster, monkeypatch):
    from orchestrator.cluster import submit

    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(cluster.token_file))
    spec = submit.command_spec(
        ["python", "-c", "import time; print('sleeping', flush=True); time.sleep(600)"], name="sleep"
    )
    assert submit.run(spec, cluster.address) == 0
    client = cluster.client()
    _wait(client, spec.submission_id, {"RUNNING"})
    code, out, err = cluster.cli("jobs", "status", spec.submission_id, "--address", cluster.address)
    assert code == 0 and "RUNNING" in out, err
    code, out, err = cluster.cli("jobs", "stop", spec.submission_id, "--address", cluster.address)
    assert code == 0 and "STOPPED" in out, out + err
    assert client.get_job_status(spec.submission_id).value == "STOPPED"
    code, out, _ = cluster.cli("jobs", "list", "--address", cluster.address)
    assert any(spec.submission_id in line and "STOPPED" in line for line in out.splitlines()), out


@pytest.mark.slow
def test_secret_from_env_is_never_printed(cluster):
    env = {"SECRET_X": "hunter2", "MLFLOW_TRACKING_PASSWORD": "pw-s3cret"}
    code, out, err = cluster.cli(
        "submit",
        SWEEP,
        "tracking.experiment=${oc.env:SECRET_X}",
        "--send-secrets",
        "--address",
        cluster.address,
        env=env,
    )
    client = cluster.client()
    job_id = next((line.split()[2] for line in out.splitlines() if line.startswith("submitted job ")), None)
    try:
        assert code == 0, err
        assert "environment passed to the job (values not shown): MLFLOW_TRACKING_PASSWORD, SECRET_X" in out
        info = client.get_job_info(job_id)
        # the override travels as text and is resolved on the cluster from the job's environment
        assert "${oc.env:SECRET_X}" in info.entrypoint and "hunter2" not in info.entrypoint
        assert info.runtime_env["env_vars"]["SECRET_X"] == "hunter2"
        for args in (("jobs", "status", job_id), ("jobs", "list")):
            c, o, e = cluster.cli(*args, "--address", cluster.address)
            assert c == 0, e
            out, err = out + o, err + e
        assert "hunter2" not in out + err and "pw-s3cret" not in out + err
    finally:
        if job_id:
            client.stop_job(job_id)
            _wait(client, job_id, {"STOPPED", "FAILED", "SUCCEEDED"})


@pytest.mark.slow
@pytest.mark.skipif(
    not SMOKE.exists(), reason="conf/sweep/smoke.yaml not written yet (orchestrator sweep is in progress)"
)
def test_smoke_sweep_runs_on_the_cluster(cluster, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = sqlite_store(tmp_path)
    code, out, err = cluster.cli(
        "submit", SMOKE, f"tracking.uri={uri}", "--address", cluster.address, "--follow", timeout=600
    )
    assert code == 0, out[-4000:] + err[-4000:]
    job_id = next(line.split()[2] for line in out.splitlines() if line.startswith("submitted job "))
    code, logs, err = cluster.cli("jobs", "logs", job_id, "--address", cluster.address)
    assert code == 0 and logs.strip(), err

    mlflow = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in mlflow.search_experiments()]
    parents = mlflow.search_runs(experiments, filter_string="tags.`orchestrator.role` = 'sweep'")
    assert len(parents) == 1, [r.info.run_id for r in parents]
    children = mlflow.search_runs(experiments, filter_string=f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'")
    assert children, "the sweep logged no trial runs"


@pytest.mark.slow
def test_infeasible_trial_shape_refused_before_upload(cluster):
    client = cluster.client()
    before = {j.submission_id for j in client.list_jobs()}
    started = time.monotonic()
    code, out, err = cluster.cli(
        "submit", SMOKE, "cluster.num_workers=4", "cluster.cpus_per_worker=1", "--address", cluster.address
    )
    line = _one_line(code, err, "cluster:", "4 x {CPU: 1}", "{CPU: 2}", "nearest that fits")
    assert "cluster.num_workers=1" in line and "uploading" not in out, out + err
    assert time.monotonic() - started < 30
    assert {j.submission_id for j in client.list_jobs()} == before


class DroppingProxy:
    """A TCP proxy on 127.0.0.1 in front of the dashboard that can drop every connection and
    refuse new ones for a while (or for good): a `kubectl port-forward` that dies and is started
    again. It forwards bytes only; the token header travels inside them."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        (self.port,) = free_ports(1)
        self.address = f"http://127.0.0.1:{self.port}"
        self.dropped = 0
        self._live, self._lock = [], threading.Lock()
        self._closed_until = 0.0  # no listener until then (connections refused)
        self._stop = False
        # Listening before __init__ returns: a connect right after it must not race the thread.
        first = self._listen()
        self._thread = threading.Thread(target=self._serve, args=(first,), daemon=True)
        self._thread.start()

    def _listen(self):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.05)
        return listener

    def _serve(self, listener):
        while not self._stop:
            if time.monotonic() < self._closed_until:
                if listener:
                    listener.close()
                    listener = None
                time.sleep(0.05)
                continue
            listener = listener or self._listen()
            try:
                down, _ = listener.accept()
                up = socket.create_connection(self.target)
            except OSError:
                continue
            with self._lock:
                self._live += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()
        if listener:
            listener.close()

    @staticmethod
    def _pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            DroppingProxy._close(s)

    @staticmethod
    def _close(s):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()

    def drop(self, refuse_s: float) -> None:
        """Close both sockets of every live connection, and refuse new ones for refuse_s."""
        self._closed_until = time.monotonic() + refuse_s
        with self._lock:
            live, self._live = self._live, []
        for s in live:
            self._close(s)
        self.dropped += len(live) // 2

    def close(self) -> None:
        self._stop = True
        self.drop(float("inf"))
        self._thread.join(5)


def _when_logged(client, job_id, text, then):
    """In a thread: once the job's log holds `text`, call `then` (the proxy drops, mid-follow)."""

    def watch():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and text not in client.get_job_logs(job_id):
            time.sleep(0.2)
        then()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def counting_job_behind_a_proxy(cluster, seconds):
    """A job printing line-0, line-1, ... one a second, and a DroppingProxy to the dashboard."""
    from orchestrator.cluster import submit

    script = f"import time\nfor i in range({seconds}):\n    print(f'line-{{i}}', flush=True)\n    time.sleep(1)\n"
    spec = submit.command_spec(["python", "-c", script], name="counting")
    client = cluster.client()
    job_id = client.submit_job(entrypoint=spec.entrypoint, submission_id=spec.submission_id)
    return client, job_id, DroppingProxy(int(cluster.address.rsplit(":", 1)[1]))


@pytest.mark.slow
def test_follow_rides_out_a_dropped_connection(cluster, monkeypatch, capsys):
    from orchestrator.cluster import follow, ray_jobs

    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(cluster.token_file))
    client, job_id, proxy = counting_job_behind_a_proxy(cluster, seconds=9)
    try:
        connected = ray_jobs.connect(proxy.address)  # before any drop: a refused connect is exit 2, not a loss
        watcher = _when_logged(client, job_id, "line-2", lambda: proxy.drop(refuse_s=2.0))
        code = follow.follow_job(connected, job_id)
        watcher.join(5)
    finally:
        proxy.close()
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert proxy.dropped >= 1 and "reconnecting in" in err and "reconnected" in err, err
    assert "Traceback" not in out + err and "WebSocket closed" not in err
    for i in range(9):
        assert out.count(f"line-{i}\n") == 1, out
    assert out.rstrip().endswith(f"job {job_id} SUCCEEDED"), out


@pytest.mark.slow
def test_follow_exits_3_when_contact_is_lost_for_good(cluster, monkeypatch, capsys):
    from orchestrator.cluster import follow, ray_jobs

    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(cluster.token_file))
    monkeypatch.setattr(follow, "RECONNECT_WINDOW_S", 3.0)
    client, job_id, proxy = counting_job_behind_a_proxy(cluster, seconds=120)
    try:
        connected = ray_jobs.connect(proxy.address)  # before any drop: a refused connect is exit 2, not a loss
        watcher = _when_logged(client, job_id, "line-3", lambda: proxy.drop(refuse_s=float("inf")))
        started = time.monotonic()
        code = follow.follow_job(connected, job_id)
        lost_after = time.monotonic() - started
        watcher.join(5)
        assert client.get_job_status(job_id).value == "RUNNING"  # it runs on: "may still be running" is true
    finally:
        proxy.close()
        client.stop_job(job_id)
        _wait(client, job_id, {"STOPPED", "FAILED", "SUCCEEDED"})
    out, err = capsys.readouterr()
    assert code == 3, out + err
    assert "line-0\n" in out and "Traceback" not in out + err and "WebSocket closed" not in err
    assert err.strip().splitlines()[-1] == (
        f"lost contact with the Ray dashboard at {proxy.address}; job {job_id} may still "
        f"be running: orchestrator jobs status {job_id} --address {proxy.address}"
    )
    assert lost_after < 30, lost_after
