"""Build and check a sweep job here, then submit it to a Ray cluster through the Ray Jobs API.

`submit` checks the sweep file here, uploads the project folder as the job's working directory
(orchestrator.cluster.upload's EXCLUDES keep it small) and runs
`python -m orchestrator sweep <sweep file> <overrides>` in it.
What the job needs from this environment is never on the command line, and only the variable
*names* are printed: MLflow credentials (tracking/store.py's env_for_workers), MLFLOW_TRACKING_URI (with
the override `tracking.uri=${oc.env:MLFLOW_TRACKING_URI}` unless you pass tracking.uri=...), and
every variable a `${oc.env:NAME}` names in the overrides, the sweep file or its base config.
Those are secrets: in the job's runtime_env anyone holding the cluster's Ray token reads them, and
the job table keeps them. So `submit` asks where they come from: `--secrets-on-cluster` (the
cluster's own environment has them, e.g. a Kubernetes Secret on the head pod; nothing is sent)
or `--send-secrets` (copied into runtime_env.env_vars). Only the TLS settings of MLflow, which
are no secret, travel without asking. A relative `sqlite:///mlflow.db` would resolve inside the job's
temporary working directory on the head node: pass an absolute path there or a server URL.
Before uploading it checks the upload's size (orchestrator.cluster.upload) and that every trial shape
fits the cluster's nodes; talking to the cluster (auth token, connect) is orchestrator.cluster.ray_jobs,
`--follow` is orchestrator.cluster.follow.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from orchestrator.cluster.follow import follow_job
from orchestrator.cluster.ray_jobs import (
    ClusterError,
    calls,
    cluster_nodes,
    connect,
    first_line,
    mask,
    normalise_address,
)
from orchestrator.cluster.upload import EXCLUDES, check_upload_size, mib, upload_limit
from orchestrator.core import derived, schema, sweep_file, yaml_files
from orchestrator.core.errors import ConfigError
from orchestrator.formulas import feasibility
from orchestrator.studies import kinds

_ENV_REF_RE = re.compile(r"\$\{oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)")
NOT_SECRET = ("MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH")
SEND, ON_CLUSTER = "send", "on-cluster"
"""Where a job's secrets come from: copied into its runtime_env, or the cluster's own environment."""


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


def _inside(path: Path, root: Path, what: str) -> str:
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        raise ConfigError(
            what,
            f"{path} lies outside the project folder {root}, the only files the job receives; move it under {root}",
        ) from None


def _base_config(sweep: Any, root: Path) -> Optional[Path]:
    """The train config a sweep builds on (`base.config`), which the job must find too."""
    name = sweep.base.config
    if not name:
        return None
    name = str(name)
    candidates = (
        [Path(name)] if Path(name).is_absolute() else [root / name, sweep.path.parent / name, Path.cwd() / name]
    )
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise ConfigError("base.config", f"{name!r} (named in {sweep.path}) not found")
    _inside(found, root, "base.config")
    return found


def _effective_tracking_uri(overrides: Sequence[str], chain: Sequence[Tuple[Path, Dict[str, Any], str]]) -> str:
    """Best guess of tracking.uri on the cluster (for the note on relative local stores): the last
    tracking.uri override, else the nearest file of the config's `extends` chain naming one, else
    the schema's default."""

    for item in list(overrides)[::-1]:
        if str(item).startswith("tracking.uri="):
            return str(item).partition("=")[2]
    for _, raw, _ in chain:
        tracking = raw.get("tracking")
        if isinstance(tracking, dict) and tracking.get("uri"):
            return str(tracking["uri"])
    return schema.TrackingConfig.uri


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
    from orchestrator.tracking.store import env_for_workers

    env = dict(env_for_workers())
    extra: List[str] = []
    if "MLFLOW_TRACKING_URI" in os.environ:
        env["MLFLOW_TRACKING_URI"] = os.environ["MLFLOW_TRACKING_URI"]
        if not any(o.startswith("tracking.uri=") for o in overrides):
            extra.append("tracking.uri=${oc.env:MLFLOW_TRACKING_URI}")
    for name in sorted({m for text in [*texts, *overrides] for m in _ENV_REF_RE.findall(text)}):
        if name in os.environ:
            env[name] = os.environ[name]
    return env, extra


def _secrets(env: Dict[str, str], secrets_from: Optional[str]) -> Tuple[Dict[str, str], List[str]]:
    """(what travels in runtime_env, notes): the secrets among `env` only with SEND."""
    secret = sorted(k for k in env if k not in NOT_SECRET)
    if not secret or secrets_from == SEND:
        return env, []
    if secrets_from != ON_CLUSTER:
        raise ConfigError(
            "--send-secrets",
            f"the job needs {', '.join(secret)}; in its runtime_env anyone holding the cluster's Ray token "
            "could read them: give them to the cluster (its environment, a Kubernetes Secret: deploy/README.md) "
            "and pass --secrets-on-cluster, or pass --send-secrets to copy them",
        )
    kept = {k: v for k, v in env.items() if k not in secret}
    return kept, [f"not sent, the job reads them from the cluster's environment: {', '.join(secret)}"]


def _submission_id(verb: str, name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "job"
    return f"{verb}-{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def job_spec(
    verb: str,
    target: str | Path,
    overrides: Sequence[str] = (),
    resume: bool = False,
    root: Optional[Path] = None,
    secrets_from: Optional[str] = None,
) -> JobSpec:
    """A job running `orchestrator VERB TARGET overrides` in a copy of the project; checks TARGET
    (exists, inside the project, a YAML mapping, its base config present) and the overrides.
    `secrets_from` (SEND or ON_CLUSTER) must be given when the job needs a secret."""

    root = (root or project_root()).resolve()
    path = Path(target)
    path = path if path.is_absolute() else Path.cwd() / path
    if not path.is_file():
        raise ConfigError("SWEEP" if verb == "sweep" else "CONFIG", f"file {str(target)!r} not found")
    rel = _inside(path, root, "SWEEP" if verb == "sweep" else "CONFIG")
    yaml_files.parse_overrides(list(overrides))  # key=value shape and the resolver allow-list
    if verb == "sweep":
        sweep = sweep_file.load(path, check=False)  # the rest is checked by trial_shapes and on the cluster
        name, base, base_overrides, texts = sweep.name, _base_config(sweep, root), sweep.base_overrides, [sweep.text]
    else:
        name, base, base_overrides, texts = path.stem, path, [], []
    chain = yaml_files.extends_chain(base) if base else []
    texts += [text for _, _, text in chain]
    env, extra = job_env(overrides, texts)
    env, notes = _secrets(env, secrets_from)
    uri = _effective_tracking_uri([*base_overrides, *overrides], chain)
    uri = os.environ["MLFLOW_TRACKING_URI"] if extra else uri  # the job resolves ${oc.env:...} to it
    if _relative_local(uri):
        notes.append(
            f"tracking.uri={uri} is relative: on the cluster it resolves inside the job's working directory on the "
            "head node (a temporary copy of the project); pass tracking.uri=sqlite:////ABSOLUTE/PATH/mlflow.db "
            "or an MLflow server URL to keep the runs"
        )
    runtime_env: Dict[str, Any] = {"working_dir": str(root), "excludes": list(EXCLUDES)}
    if env:
        runtime_env["env_vars"] = env
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
    return JobSpec(
        entrypoint=shlex.join(list(argv)), runtime_env=runtime_env, submission_id=_submission_id("cmd", name)
    )


# ---------------------------------------------------------------- submitting


def trial_shapes(sweep_path: str | Path, overrides: Sequence[str] = ()) -> List[Any]:
    """The distinct shapes (feasibility.Shape) of the sweep's trials, as `orchestrator sweep`
    computes them (studies/kinds.prepare)."""

    prepared = kinds.prepare(sweep_path, overrides)
    return feasibility.distinct([derived.trial_shape(t.cfg, prepared.sweep.local_mode) for t in prepared.all_trials()])


def check_fit(client, shapes: Sequence[Any]) -> None:
    """ConfigError (exit 2) when a trial shape can never be placed on the cluster's alive nodes."""

    nodes = cluster_nodes(client)
    if nodes is None:
        return
    for shape in shapes:
        problem = feasibility.problem(shape, nodes, f"the Ray cluster at {mask(client.get_address())}")
        if problem:
            # The dashboard reports the nodes that are up, not an autoscaler's limits.
            raise ConfigError(
                "cluster",
                f"{problem} (judged on the nodes that are up; if the cluster autoscales, "
                "--no-fit-check leaves the check to the sweep on the cluster)",
            )


def _submit_job(client, spec: JobSpec) -> str:
    """client.submit_job, with upload failures as one line: exit 2 for what can be fixed here."""
    root = spec.runtime_env.get("working_dir", "")
    try:
        with calls(client):
            return client.submit_job(
                entrypoint=spec.entrypoint,
                runtime_env=spec.runtime_env,
                submission_id=spec.submission_id,
                metadata=spec.metadata,
            )
    except ConfigError:
        raise
    except ClusterError as exc:
        if "status code 413" in str(exc):
            raise ConfigError(
                "working_dir",
                f"the Ray dashboard at {mask(client.get_address())} refused the upload of "
                f"{root} as too large (Ray's limit: {mib(upload_limit())}); exclude large files in "
                f"{root}/.rayignore",
            ) from None
        raise
    except (OSError, ValueError) as exc:  # reading or zipping the working directory, Ray's own size check
        raise ConfigError("working_dir", f"cannot upload {root}: {mask(first_line(exc))}") from None


def run(
    spec: JobSpec,
    address: str,
    follow_logs: bool = False,
    insecure: bool = False,
    shapes: Optional[Sequence[Any]] = None,
) -> int:
    """Submit `spec`, print its id and the commands to follow and stop it; follow if asked.
    `shapes`: trial shapes to check against the cluster's nodes before uploading."""
    check_upload_size(spec.runtime_env)  # before any contact
    client = connect(address, insecure=insecure)
    if shapes:
        check_fit(client, shapes)
    if "working_dir" in spec.runtime_env:
        print(f"uploading {spec.runtime_env['working_dir']} as the job's working directory", flush=True)
    job_id = _submit_job(client, spec)
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


def submit(
    sweep: str,
    overrides: Optional[List[str]] = None,
    address: str = "",
    follow: bool = False,
    resume: bool = False,
    insecure: bool = False,
    fit_check: bool = True,
    secrets_from: Optional[str] = None,
) -> int:
    """`orchestrator submit`: check the sweep here, then run it on the cluster at `address`."""
    overrides = overrides or []
    normalise_address(address)  # its form first: the command line's own argument, before the sweep file's checks
    spec = job_spec("sweep", sweep, overrides, resume=resume, secrets_from=secrets_from)  # before any contact
    shapes = trial_shapes(sweep, overrides) if fit_check else None
    try:
        return run(spec, address, follow_logs=follow, insecure=insecure, shapes=shapes)
    except ClusterError as exc:
        print(f"orchestrator submit: error: {exc}", file=sys.stderr)
        return 1
