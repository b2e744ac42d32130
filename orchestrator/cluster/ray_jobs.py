"""The Ray Jobs API client: auth token, connect, the dashboard's errors.

`connect` checks the dashboard address, probes it and returns Ray's JobSubmissionClient; the
client's failures become one-line errors (ConfigError, exit 2, for what can be fixed here;
ClusterError, exit 1, for other answers of the dashboard; `calls` for each call). `get_json`
reads a dashboard endpoint with a timeout and raises ContactLost when contact breaks off.
`--follow` (streaming a job's logs and reconnecting) is orchestrator.cluster.follow; the `jobs` verb is
orchestrator.cluster.jobs.

Ray token authentication (Ray >= 2.52, RAY_AUTH_MODE=token on the cluster): the dashboard wants
`Authorization: Bearer <token>`. The token is looked up as Ray does (RAY_AUTH_TOKEN, the file
named by RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token). The first two name a token for the cluster the
user addresses, and are sent to it; ~/.ray/auth_token is the token of the cluster `ray start`
made on this machine, so it goes only to a loopback address, or anywhere with RAY_AUTH_MODE=token
(Ray's own client sends a token only then).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import urlparse

from orchestrator.core.config import redact_uri
from orchestrator.core.errors import ConfigError
from orchestrator.core.validation import loopback

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
HTTP_TIMEOUT_S = 30.0
"""Timeout of the dashboard requests made here (`get_json`, used by `--follow` and the node check)."""


class ClusterError(Exception):
    """The cluster answered with an error that is not a bad argument: exit 1, one line."""


class ContactLost(Exception):
    """Contact with the dashboard broke off; the job may run on."""


def mask(text: str) -> str:
    """Hide URL credentials (scheme://user:pass@host, scheme://token@host) in anything printed:
    the config's one rule."""
    return redact_uri(text)


# ---------------------------------------------------------------- talking to the cluster


def ray_auth_token(address: str = "") -> Tuple[Optional[str], str]:
    """(token or None, where it came from) for the dashboard at `address`: RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token for a loopback address or with RAY_AUTH_MODE=token."""
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
    local = not address or loopback(urlparse(normalise_address(address)).hostname or "")
    with contextlib.suppress(OSError):
        token = default.read_text().strip()
        if token and (local or os.environ.get("RAY_AUTH_MODE", "").lower() == "token"):
            return token, str(default)
        if token:
            return None, (
                f"{default} holds this machine's cluster token, which goes to another address only with "
                "RAY_AUTH_MODE=token, or set RAY_AUTH_TOKEN_PATH to the file of this cluster's token"
            )
    return None, "none found (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)"


def normalise_address(address: str) -> str:
    """http(s)://HOST[:PORT], or HOST:PORT read as http://: its form only (connect probes it)."""
    address = address.strip().rstrip("/")
    schemeless = "://" not in address
    if schemeless:
        address = "http://" + address
    valid = "use the Ray dashboard's http(s)://HOST:PORT (default port 8265)"
    try:
        parsed = urlparse(address)
        parsed.port  # noqa: B018  (raises ValueError for a port outside 0..65535)
    except ValueError as exc:
        raise ConfigError("--address", f"got {mask(address)!r} ({exc}); {valid}") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname or (schemeless and parsed.port is None):
        raise ConfigError(
            "--address", f"got {mask(address.removeprefix('http://') if schemeless else address)!r}; {valid}"
        )
    return address


def first_line(exc: BaseException) -> str:
    """The gist of an error in one short line: requests nests the OS's reason ("[Errno 111]
    Connection refused") deep inside a long repr."""
    text = str(exc).strip()
    errno = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if errno:
        return errno.group(1).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _unreachable(address: str, why: str) -> ConfigError:
    return ConfigError(
        "--address",
        f"cannot reach the Ray dashboard at {mask(address)} (unreachable address: {why}); "
        "is the cluster up and its dashboard port forwarded (`ray dashboard CLUSTER.yaml`, `kubectl port-forward`)?",
    )


def _token_refused(address: str, token_source: str) -> ConfigError:
    return ConfigError(
        "--address",
        f"the Ray cluster at {mask(address)} refused the auth token from {token_source}; "
        "use the cluster's token (`ray get-auth-token` on the head node)",
    )


def _no_job(address: str, job_id: str) -> ConfigError:
    return ConfigError(
        "JOB_ID",
        f"no job {job_id!r} on {mask(address)}; list them with `orchestrator jobs list --address {mask(address)}`",
    )


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not minutes, when nothing listens at the address."""
    parsed = urlparse(address)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        raise _unreachable(address, exc.strerror or str(exc) or type(exc).__name__) from None


@contextlib.contextmanager
def _cluster_errors(address: str, token_source: str, sent: bool) -> Iterator[None]:
    """Map the job client's failures to one-line ConfigErrors (exit 2) naming the cause."""
    import requests
    from ray.exceptions import AuthenticationError

    try:
        yield
    except AuthenticationError as exc:
        if str(exc).startswith("Authentication required") or not sent:
            raise ConfigError(
                "--address",
                f"the Ray cluster at {mask(address)} requires an auth token (token authentication "
                f"is on) and none was sent: {token_source}; set RAY_AUTH_TOKEN_PATH to a file holding it "
                "(`ray get-auth-token` prints it on the head node)",
            ) from None
        raise _token_refused(address, token_source) from None
    except (ConnectionError, requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
        raise _unreachable(address, first_line(exc)) from None


def connect(address: str, insecure: bool = False):
    """A JobSubmissionClient that sends the Ray auth token when one is found, but never over
    plain http to another machine unless `insecure`: anyone on the path could read it there."""
    address = normalise_address(address)
    token, source = ray_auth_token(address)
    host = urlparse(address).hostname or ""
    if token and address.startswith("http://") and not loopback(host) and not insecure:
        raise ConfigError(
            "--address",
            f"{mask(address)} is plain http to another machine, so the Ray auth token (from {source}) "
            "would cross the network readable by anyone on the path; use https://, or a port-forward or SSH tunnel "
            "to 127.0.0.1 (`kubectl port-forward svc/CLUSTER-head-svc 8265`, `ssh -L 8265:127.0.0.1:8265 HEAD`) "
            "with --address http://127.0.0.1:8265, or pass --insecure to send it anyway",
        )
    _probe(address)
    import logging

    # Upload chatter, "WebSocket closed": failures surface as exceptions. Ray's job client modules
    # set their own loggers to INFO, so the parent's level is not enough.
    for name in ("ray", "ray.dashboard.modules.job.sdk", "ray.dashboard.modules.dashboard_sdk"):
        logging.getLogger(name).setLevel(logging.ERROR)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    with _cluster_errors(address, source, sent=token is not None):
        return _jobs_client()(address, headers=headers, token_source=source)


@functools.lru_cache(maxsize=None)
def _jobs_client() -> type:
    """Ray's JobSubmissionClient with what the requests made here need (Ray imported on first use)."""
    from ray.job_submission import JobSubmissionClient

    class JobsClient(JobSubmissionClient):
        def __init__(self, address: str, headers: Optional[Dict[str, str]], token_source: str):
            super().__init__(address, headers=headers)
            self.token_source = token_source
            """Where the auth token came from, for the error messages of later calls."""
            self.auth_headers = headers or {}
            """The headers of the dashboard requests made here (get_json)."""

    return JobsClient


@contextlib.contextmanager
def calls(client, job_id: Optional[str] = None) -> Iterator[None]:
    """Errors of one call: auth and connection as in connect, an unknown job id as exit 2, any
    other error answer of the dashboard as ClusterError (exit 1, one line)."""
    try:
        with _cluster_errors(
            client.get_address(), getattr(client, "token_source", ""), sent=bool(getattr(client, "auth_headers", None))
        ):
            yield
    except RuntimeError as exc:
        if job_id and "404" in str(exc):
            raise _no_job(client.get_address(), job_id) from None
        raise ClusterError(
            f"the Ray dashboard at {mask(client.get_address())} answered: {mask(first_line(exc))}"
        ) from None


def get_json(client, path: str, job_id: Optional[str] = None) -> Dict[str, Any]:
    """GET a dashboard endpoint as JSON, with a timeout (Ray's job client sets none, so a
    half-open tunnel would hang it). ContactLost when the dashboard cannot be reached."""
    import requests

    address = client.get_address()
    headers = getattr(client, "auth_headers", None)
    try:
        r = requests.get(address + path, headers=headers, timeout=HTTP_TIMEOUT_S)
        if r.status_code == 200:
            return r.json()
    except (requests.RequestException, ValueError) as exc:  # refused, reset, timed out, cut off mid-answer
        raise ContactLost(first_line(exc)) from None
    if r.status_code in (401, 403):
        raise _token_refused(address, getattr(client, "token_source", "the request headers"))
    if r.status_code == 404 and job_id:
        raise _no_job(address, job_id)
    if r.status_code >= 500:  # a proxy in front of a dashboard that is restarting
        raise ContactLost(f"HTTP {r.status_code}")
    body = (r.text.strip().splitlines() or [""])[0][:200]
    raise ClusterError(
        f"the Ray dashboard at {mask(address)} answered GET {path} with HTTP {r.status_code}: {mask(body)}"
    )


def wait_for(
    client, job_id: str, statuses: Sequence[str] = TERMINAL, timeout_s: float = 60.0, poll_s: float = 1.0
) -> str:
    """Poll until the job's status is one of `statuses` (or the timeout); the last status seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        with calls(client, job_id):
            status = status_text(client.get_job_status(job_id))
        if status in statuses or time.monotonic() >= deadline:
            return status
        time.sleep(poll_s)


def cluster_nodes(client) -> Optional[List[Dict[str, float]]]:
    """Total resources of the cluster's alive nodes (the dashboard's state API), or None when
    they cannot be read (an older Ray, no permission): then only the sweep on the cluster checks."""
    try:
        data = get_json(client, "/api/v0/nodes?detail=1&limit=10000")
        return [
            {k: float(v) for k, v in (n.get("resources_total") or {}).items()}
            for n in data["data"]["result"]["result"]
            if n.get("state") == "ALIVE"
        ]
    except (ContactLost, ClusterError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(
            f"warning: cannot read the nodes of the Ray cluster at {mask(client.get_address())} "
            f"({mask(first_line(exc))}); "
            "not checking that the trials fit before uploading",
            file=sys.stderr,
            flush=True,
        )
        return None


def status_text(x: Any) -> str:
    """A job status (Ray's enum or its string) as its name."""
    return str(getattr(x, "value", x))
