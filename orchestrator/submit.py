"""Send a sweep to a Ray cluster through the Ray Jobs API, and look after submitted jobs.

`submit` checks the sweep file here, uploads the project folder as the job's working directory
(EXCLUDES keeps it small) and runs `python -m orchestrator sweep <sweep file> <overrides>` in it.
What the job needs from this environment travels as runtime_env env_vars, never on the command
line, and only the variable *names* are printed: MLflow credentials (tracking.env_for_workers),
MLFLOW_TRACKING_URI (with the override `tracking.uri=${oc.env:MLFLOW_TRACKING_URI}` unless you
pass tracking.uri=...), and every variable a `${oc.env:NAME}` names in the overrides, the sweep
file or its base config. A relative `sqlite:///mlflow.db` would resolve inside the job's
temporary working directory on the head node: pass an absolute path there or a server URL.

Ray token authentication (Ray >= 2.52, RAY_AUTH_MODE=token on the cluster): the dashboard wants
`Authorization: Bearer <token>`. The token is looked up as Ray does (RAY_AUTH_TOKEN, the file
named by RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token) and sent whenever one is found; Ray's own client
sends it only when RAY_AUTH_MODE=token is set in the submitting process too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shlex
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import urlparse

import yaml

from orchestrator.errors import ConfigError

# Left out of the uploaded working directory (gitignore syntax, relative to the project root).
# Ray also honours the project's .gitignore unless RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1.
EXCLUDES = [
    ".git", ".venv", "venv", "**/__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis",
    ".cache", "runs", "mlruns", "mlartifacts", "mlflow.db", "reports", "ray_results",
    "build", "dist", ".whl", ".gl", "*.ckpt",
]
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
_ENV_REF_RE = re.compile(r"\$\{oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)")
_USERINFO_RE = re.compile(r"(\b[a-z][a-z0-9+.-]*://)[^\s/@]+@", re.IGNORECASE)


@dataclass
class JobSpec:
    """Everything a submission sends; built and checked without contacting a cluster."""

    entrypoint: str
    runtime_env: Dict[str, Any]
    submission_id: str
    metadata: Dict[str, str] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)

    @property
    def env_names(self) -> List[str]:
        return sorted(self.runtime_env.get("env_vars", {}))


# ---------------------------------------------------------------- building a job (no cluster)

def build_entrypoint(verb: str, target: str, overrides: Sequence[str] = (), resume: bool = False) -> str:
    """The job's shell command; every argument quoted, so `${oc.env:X}` reaches OmegaConf as text."""
    argv = ["python", "-m", "orchestrator", verb, target, *overrides]
    return shlex.join(argv + (["--resume"] if resume else []))


def project_root() -> Path:
    """The folder shipped as working directory: the checkout holding this package, else cwd."""
    src = Path(__file__).resolve().parents[1]
    return src if (src / "pyproject.toml").is_file() else Path.cwd().resolve()


def mask(text: str) -> str:
    """Hide URL credentials (scheme://user:pass@host) in anything printed."""
    return _USERINFO_RE.sub(r"\1***@", text)


def _inside(path: Path, root: Path, what: str) -> str:
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        raise ConfigError(what, f"{path} lies outside the project folder {root}, the only files the job receives; move it under {root}") from None


def _read_mapping(path: Path, what: str) -> Dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(what, f"YAML syntax error in {path}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(what, f"{path} must hold a mapping, got {type(data).__name__}")
    return data


def _config_chain(path: Path) -> List[Path]:
    """A train config and the files it `extends`, nearest first."""
    chain: List[Path] = []
    while path.is_file() and path.resolve() not in chain and len(chain) < 20:
        chain.append(path.resolve())
        with contextlib.suppress(yaml.YAMLError, OSError):
            parent = (yaml.safe_load(path.read_text()) or {}).get("extends")
            if parent:
                path = path.parent / str(parent)
                continue
        break
    return chain


def _base_config(sweep: Dict[str, Any], sweep_path: Path, root: Path) -> Optional[Path]:
    """The train config a sweep builds on (`base.config`), which the job must find too."""
    base = sweep.get("base")
    name = base.get("config") if isinstance(base, dict) else None
    if not name:
        return None
    candidates = [Path(name)] if Path(name).is_absolute() else [root / name, sweep_path.parent / name, Path.cwd() / name]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise ConfigError("base.config", f"{name!r} (named in {sweep_path}) not found")
    _inside(found, root, "base.config")
    return found


def _effective_tracking_uri(overrides: Sequence[str], sweep: Dict[str, Any], base: Optional[Path]) -> str:
    """Best guess of tracking.uri on the cluster (for the note on relative local stores)."""
    base_overrides = sweep.get("base", {}).get("overrides") if isinstance(sweep.get("base"), dict) else None
    if isinstance(base_overrides, dict):  # sweep files write them as a mapping
        base_overrides = [f"{k}={v}" for k, v in base_overrides.items()]
    for item in [*(base_overrides or []), *overrides][::-1]:
        if str(item).startswith("tracking.uri="):
            return str(item).partition("=")[2]
    for path in _config_chain(base) if base else []:
        with contextlib.suppress(Exception):
            uri = ((yaml.safe_load(path.read_text()) or {}).get("tracking") or {}).get("uri")
            if uri:
                return str(uri)
    return "sqlite:///mlflow.db"  # the schema's default


def _relative_local(uri: str) -> bool:
    if "${" in uri:
        return False
    if uri.startswith("sqlite:///"):
        return not uri.startswith("sqlite:////")
    if uri.startswith("file:"):
        return not uri.startswith("file:///")
    return "://" not in uri and not uri.startswith("/")


def job_env(overrides: Sequence[str], texts: Sequence[str]) -> Tuple[Dict[str, str], List[str]]:
    """(env_vars for the job, extra overrides): credentials, MLFLOW_TRACKING_URI, `${oc.env:X}` refs."""
    from orchestrator import tracking

    env = dict(tracking.env_for_workers())
    extra: List[str] = []
    if "MLFLOW_TRACKING_URI" in os.environ:
        env["MLFLOW_TRACKING_URI"] = os.environ["MLFLOW_TRACKING_URI"]
        if not any(o.startswith("tracking.uri=") for o in overrides):
            extra.append("tracking.uri=${oc.env:MLFLOW_TRACKING_URI}")
    for name in sorted({m for text in [*texts, *overrides] for m in _ENV_REF_RE.findall(text)}):
        if name in os.environ:
            env[name] = os.environ[name]
    return env, extra


def _submission_id(verb: str, name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "job"
    return f"{verb}-{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def job_spec(verb: str, target: str | Path, overrides: Sequence[str] = (), resume: bool = False,
             root: Optional[Path] = None) -> JobSpec:
    """A job running `orchestrator VERB TARGET overrides` in a copy of the project; checks TARGET
    (exists, inside the project, a YAML mapping, its base config present) and the overrides."""
    from orchestrator import config

    root = (root or project_root()).resolve()
    path = Path(target)
    path = path if path.is_absolute() else Path.cwd() / path
    if not path.is_file():
        raise ConfigError("SWEEP" if verb == "sweep" else "CONFIG", f"file {str(target)!r} not found")
    rel = _inside(path, root, "SWEEP" if verb == "sweep" else "CONFIG")
    config.parse_overrides(list(overrides))  # key=value shape and the resolver allow-list
    data = _read_mapping(path, rel)
    base = _base_config(data, path, root) if verb == "sweep" else path
    texts = [path.read_text()] + [p.read_text() for p in (_config_chain(base) if base else [])]
    env, extra = job_env(overrides, texts)
    notes = []
    uri = _effective_tracking_uri(overrides, data if verb == "sweep" else {}, base)
    uri = os.environ["MLFLOW_TRACKING_URI"] if extra else uri  # the job resolves ${oc.env:...} to it
    if _relative_local(uri):
        notes.append(f"tracking.uri={uri} is relative: on the cluster it resolves inside the job's working directory on the "
                     "head node (a temporary copy of the project); pass tracking.uri=sqlite:////ABSOLUTE/PATH/mlflow.db "
                     "or an MLflow server URL to keep the runs")
    runtime_env: Dict[str, Any] = {"working_dir": str(root), "excludes": list(EXCLUDES)}
    if env:
        runtime_env["env_vars"] = env
    name = str(data.get("name") or path.stem)
    return JobSpec(
        entrypoint=build_entrypoint(verb, rel, [*overrides, *extra], resume=resume),
        runtime_env=runtime_env,
        submission_id=_submission_id(verb, name),
        metadata={"orchestrator.verb": verb, "orchestrator.target": rel},
        notes=notes,
    )


def command_spec(argv: Sequence[str], name: str = "command", env: Optional[Dict[str, str]] = None) -> JobSpec:
    """A job running an arbitrary command with no working directory (tests: a job that sleeps)."""
    runtime_env: Dict[str, Any] = {"env_vars": dict(env)} if env else {}
    return JobSpec(entrypoint=shlex.join(list(argv)), runtime_env=runtime_env, submission_id=_submission_id("cmd", name))


# ---------------------------------------------------------------- talking to the cluster

def ray_auth_token() -> Tuple[Optional[str], str]:
    """(token or None, where it came from): RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None, "RAY_AUTH_MODE=disabled"
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        path = Path(os.environ["RAY_AUTH_TOKEN_PATH"]).expanduser()
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise ConfigError("RAY_AUTH_TOKEN_PATH", f"{path} cannot be read: {exc.strerror or exc}") from None
        if not token:
            raise ConfigError("RAY_AUTH_TOKEN_PATH", f"{path} is empty")
        return token, f"RAY_AUTH_TOKEN_PATH ({path})"
    default = Path.home() / ".ray" / "auth_token"
    with contextlib.suppress(OSError):
        token = default.read_text().strip()
        if token:
            return token, str(default)
    return None, "none found (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)"


def normalise_address(address: str) -> str:
    address = address.strip().rstrip("/")
    if "://" not in address:
        address = "http://" + address
    parsed = urlparse(address)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError("--address", f"got {mask(address)!r}; use the Ray dashboard's http(s)://HOST:PORT (default port 8265)")
    return address


def _unreachable(address: str, why: str) -> ConfigError:
    return ConfigError("--address", f"cannot reach the Ray dashboard at {mask(address)} (unreachable address: {why}); "
                       "is the cluster up and its dashboard port forwarded (`ray dashboard CLUSTER.yaml`, `kubectl port-forward`)?")


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not minutes, when nothing listens at the address."""
    parsed = urlparse(address)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        raise _unreachable(address, exc.strerror or str(exc) or type(exc).__name__) from None


@contextlib.contextmanager
def _cluster_errors(address: str, token_source: str) -> Iterator[None]:
    """Map the job client's failures to one-line ConfigErrors (exit 2) naming the cause."""
    import requests
    from ray.exceptions import AuthenticationError

    try:
        yield
    except AuthenticationError as exc:
        if str(exc).startswith("Authentication required") or token_source.startswith("none found"):
            raise ConfigError("--address", f"the Ray cluster at {mask(address)} requires an auth token (token authentication "
                              f"is on) and none was sent: {token_source}; set RAY_AUTH_TOKEN_PATH to a file holding it "
                              "(`ray get-auth-token` prints it on the head node)") from None
        raise ConfigError("--address", f"the Ray cluster at {mask(address)} refused the auth token from {token_source}; "
                          "use the cluster's token (`ray get-auth-token` on the head node)") from None
    except (ConnectionError, requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
        raise _unreachable(address, str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None


def connect(address: str):
    """A JobSubmissionClient that sends the Ray auth token when one is found."""
    address = normalise_address(address)
    _probe(address)
    import logging

    from ray.job_submission import JobSubmissionClient

    logging.getLogger("ray").setLevel(logging.ERROR)  # upload chatter; failures surface as exceptions
    token, source = ray_auth_token()
    headers = {"Authorization": f"Bearer {token}"} if token else None
    with _cluster_errors(address, source):
        client = JobSubmissionClient(address, headers=headers)
    client._orchestrator_token_source = source  # for error messages of later calls
    return client


@contextlib.contextmanager
def _calls(client, job_id: Optional[str] = None) -> Iterator[None]:
    """Errors of one call: auth and connection as in connect, an unknown job id as exit 2."""
    try:
        with _cluster_errors(client.get_address(), getattr(client, "_orchestrator_token_source", "")):
            yield
    except RuntimeError as exc:
        if job_id and "404" in str(exc):
            raise ConfigError("JOB_ID", f"no job {job_id!r} on {mask(client.get_address())}; "
                              f"list them with `orchestrator jobs list --address {mask(client.get_address())}`") from None
        raise


def wait_for(client, job_id: str, statuses: Sequence[str] = TERMINAL, timeout_s: float = 60.0, poll_s: float = 1.0) -> str:
    """Poll until the job's status is one of `statuses` (or the timeout); the last status seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        with _calls(client, job_id):
            status = _value(client.get_job_status(job_id))
        if status in statuses or time.monotonic() >= deadline:
            return status
        time.sleep(poll_s)


def follow_job(client, job_id: str) -> int:
    """Stream the job's logs until it ends; 0 when it SUCCEEDED, 1 when FAILED or STOPPED."""
    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            sys.stdout.write(chunk)
            sys.stdout.flush()

    try:
        with _calls(client, job_id):
            try:
                asyncio.run(tail())
            except RuntimeError as exc:  # the log stream broke off: keep waiting for the status
                if "404" in str(exc):
                    raise
                print(f"log stream interrupted ({exc}); waiting for the job to end", file=sys.stderr)
        status = wait_for(client, job_id, timeout_s=float("inf"), poll_s=2.0)
    except KeyboardInterrupt:
        print(f"stopped following; job {job_id} keeps running (orchestrator jobs stop {job_id} "
              f"--address {mask(client.get_address())})", file=sys.stderr)
        raise
    with _calls(client, job_id):
        message = client.get_job_info(job_id).message or ""
    print(f"job {job_id} {status}" + (f": {mask(message)}" if status != "SUCCEEDED" and message else ""))
    return 0 if status == "SUCCEEDED" else 1


def run(spec: JobSpec, address: str, follow_logs: bool = False) -> int:
    """Submit `spec`, print its id and the commands to follow and stop it; follow if asked."""
    client = connect(address)
    if "working_dir" in spec.runtime_env:
        print(f"uploading {spec.runtime_env['working_dir']} as the job's working directory", flush=True)
    with _calls(client):
        job_id = client.submit_job(entrypoint=spec.entrypoint, runtime_env=spec.runtime_env,
                                   submission_id=spec.submission_id, metadata=spec.metadata)
    addr = mask(client.get_address())
    print(f"submitted job {job_id} to {addr}")
    print(f"  entrypoint: {mask(spec.entrypoint)}")
    if spec.env_names:
        print(f"  environment passed to the job (values not shown): {', '.join(spec.env_names)}")
    for note in spec.notes:
        print(f"  note: {mask(note)}")
    print(f"  follow: orchestrator jobs logs {job_id} --address {addr} --follow")
    print(f"  status: orchestrator jobs status {job_id} --address {addr}")
    print(f"  stop:   orchestrator jobs stop {job_id} --address {addr}", flush=True)
    return follow_job(client, job_id) if follow_logs else 0


def submit(sweep: str, overrides: Optional[List[str]] = None, address: str = "", follow: bool = False,
           resume: bool = False) -> int:
    """`orchestrator submit`: check the sweep here, then run it on the cluster at `address`."""
    spec = job_spec("sweep", sweep, overrides or [], resume=resume)  # before any contact
    return run(spec, address, follow_logs=follow)


# ---------------------------------------------------------------- jobs status | logs | stop | list

def _when(ms: Optional[int]) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))


def format_table(jobs: Sequence[Any], width: int = 72) -> str:
    """id, status, entrypoint, start time; newest last."""
    rows = [("ID", "STATUS", "ENTRYPOINT", "START")]
    for j in sorted(jobs, key=lambda j: j.start_time or 0):
        entry = mask(j.entrypoint or "")
        entry = entry if len(entry) <= width else entry[: width - 3] + "..."
        rows.append((j.submission_id or j.job_id or "-", _value(j.status), entry, _when(j.start_time)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows)


def jobs(action: str, job_id: Optional[str] = None, address: str = "", follow: bool = False) -> int:
    """`orchestrator jobs status|logs|stop|list`."""
    if action == "list" and job_id:
        raise ConfigError("JOB_ID", f"`jobs list` takes no submission id (got {job_id!r})")
    if action != "list" and not job_id:
        raise ConfigError("JOB_ID", f"`jobs {action}` needs a submission id; see `orchestrator jobs list --address URL`")
    client = connect(address)
    if action == "list":
        with _calls(client):
            print(format_table(client.list_jobs()))
        return 0
    if action == "logs":
        if follow:
            return follow_job(client, job_id)
        with _calls(client, job_id):
            sys.stdout.write(client.get_job_logs(job_id))
        return 0
    if action == "stop":
        with _calls(client, job_id):
            stopping = client.stop_job(job_id)
        status = wait_for(client, job_id, timeout_s=60.0)
        if not stopping:
            print(f"job {job_id} was not running: {status}")
        else:
            print(f"job {job_id} {status}" + ("" if status in TERMINAL else " (stop requested; not ended within 60 s)"))
        return 0 if status in TERMINAL else 1
    with _calls(client, job_id):
        info = client.get_job_info(job_id)
    for key, value in (("id", job_id), ("status", _value(info.status)), ("entrypoint", mask(info.entrypoint or "")),
                       ("start", _when(info.start_time)), ("end", _when(info.end_time)),
                       ("message", mask(info.message or "")), ("exit code", info.driver_exit_code)):
        if value not in (None, ""):
            print(f"{key:<11} {value}")
    return 0
