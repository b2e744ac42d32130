"""What `submit` uploads as the job's working directory, checked here before any contact.

Ray ships the project folder as a zip through the dashboard, which refuses a body over its limit
(100 MiB in Ray 2.60) with a bare HTTP 413. So the upload is walked here with Ray's own matcher
(EXCLUDES, .gitignore, .rayignore), and one that is too large is refused before contacting the
cluster, naming its largest entries. SECRET_EXCLUDES keeps credential files out of every upload:
the job gets what it needs as runtime_env env_vars.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from orchestrator.core.errors import ConfigError

# Left out of the uploaded working directory (gitignore syntax, relative to the project root;
# a pattern without a slash matches at any depth). Ray also honours the project's .gitignore
# (unless RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1) and .rayignore files.
EXCLUDES = [
    ".git",
    ".venv",
    "venv",
    "**/__pycache__",
    "*.egg-info",
    ".pytest_cache",
    ".hypothesis",
    ".cache",
    "runs",
    "mlruns",
    "mlartifacts",
    "mlflow.db",
    "reports",
    "ray_results",
    "build",
    "dist",
    ".whl",
    ".gl",
    "*.ckpt",
]
# Secrets never travel with a job, wherever they lie (deploy/mlflow/.env holds the PostgreSQL
# password): the job gets what it needs as runtime_env env_vars. Names only, never a pattern
# like *token* that would also drop source files (workloads/text/tokenizer.py).
SECRET_EXCLUDES = [
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".ssh",
    ".aws",
    ".azure",
    ".kube",
    "kubeconfig",
    ".docker",
    ".netrc",
    ".pypirc",
    ".git-credentials",
    "credentials",
    "credentials.json",
    "auth_token",
    "*.token",
    ".pgpass",
    ".databrickscfg",
    ".config/gcloud",
    "application_default_credentials.json",
    "service_account*.json",
    ".s3cfg",
    ".boto",
    "*.tfstate",
    "*.tfstate.*",
    ".terraform",
    "basic_auth.db",  # MLflow's user database
    ".htpasswd",
    ".npmrc",
    ".yarnrc*",
]
EXCLUDES += SECRET_EXCLUDES


def upload_files(root: Path, excludes: Sequence[str] = EXCLUDES) -> Dict[str, int]:
    """{path relative to root: bytes} of what Ray ships as the working directory, found by Ray's
    own walk (its gitignore matcher over `excludes`, .gitignore and .rayignore files)."""
    import logging

    from ray._private import ray_constants
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    root = Path(root).absolute()
    include_gitignore = os.environ.get(ray_constants.RAY_RUNTIME_ENV_IGNORE_GITIGNORE, "0") != "1"
    sizes: Dict[str, int] = {}

    def add(path: Path) -> None:
        if path.is_file():  # Ray zips files (and empty folders, which weigh nothing)
            sizes[path.relative_to(root).as_posix()] = path.stat().st_size

    quiet = logging.getLogger("orchestrator.cluster.upload")
    quiet.setLevel(logging.WARNING)  # Ray logs every ignore file it reads at INFO
    _dir_travel(root, [_get_excludes(root, list(excludes))], add, include_gitignore=include_gitignore, logger=quiet)
    return sizes


def upload_limit() -> int:
    """Bytes Ray accepts for a working directory sent through the Jobs API: the dashboard's
    largest request body (100 MiB in Ray 2.60), and the GCS's largest package behind it."""
    from ray._private import ray_constants
    from ray._private.runtime_env import packaging

    limits = [
        getattr(ray_constants, "DASHBOARD_CLIENT_MAX_SIZE", None),
        getattr(packaging, "GCS_STORAGE_MAX_SIZE", None),
    ]
    return min(x for x in limits if x) if any(limits) else 100 * 1024**2


def mib(n: float) -> str:
    return f"{n / 1024**2:,.1f} MiB"


def _biggest(sizes: Dict[str, int], n: int = 3) -> List[Tuple[str, int]]:
    """The n largest top-level entries, each followed down while one child holds 90% of it, so
    that a single huge file deep in a folder is named, not just its folder."""

    def grouped(prefix: str) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for path, size in sizes.items():
            if path.startswith(prefix):
                head, sep, _ = path[len(prefix) :].partition("/")
                out[prefix + head + sep] = out.get(prefix + head + sep, 0) + size
        return out

    picked = []
    for name, size in sorted(grouped("").items(), key=lambda kv: -kv[1])[:n]:
        while name.endswith("/"):
            child, child_size = max(grouped(name).items(), key=lambda kv: kv[1])
            if child_size < 0.9 * size:
                break
            name, size = child, child_size
        picked.append((name, size))
    return picked


def check_upload_size(runtime_env: Mapping[str, Any]) -> None:
    """Refuse, before contacting the cluster, a working directory Ray would refuse to take."""
    root = runtime_env.get("working_dir")
    if not root:
        return
    try:
        sizes = upload_files(Path(root), runtime_env.get("excludes", []))
    except (ImportError, AttributeError):  # another Ray without these helpers: its upload decides
        return
    except OSError as exc:
        raise ConfigError(
            "working_dir", f"cannot read {exc.filename or root} to upload it: {exc.strerror or exc}"
        ) from None
    # Ray stores files uncompressed; each adds two zip headers (about 100 bytes and its name twice).
    total = sum(size + 100 + 2 * len(name) for name, size in sizes.items())
    limit = upload_limit()
    if total >= limit:
        largest = ", ".join(f"{name} ({mib(size)})" for name, size in _biggest(sizes))
        raise ConfigError(
            "working_dir",
            f"the project folder {root} would upload {mib(total)} ({len(sizes)} files), above "
            f"Ray's limit of {mib(limit)}; largest: {largest}; exclude them in {Path(root) / '.rayignore'} "
            "(gitignore syntax) or move them out of the project folder",
        )
