"""`orchestrator jobs status|logs|stop|list`: one call of the Ray Jobs API per action, through
orchestrator.cluster.ray_jobs (connect, errors); `logs --follow` is orchestrator.cluster.follow."""

from __future__ import annotations

import re
import sys
import time
from typing import Any, Optional, Sequence

from orchestrator.cluster.follow import follow_job
from orchestrator.cluster.ray_jobs import TERMINAL, ClusterError, calls, connect, mask, status_text, wait_for
from orchestrator.core.errors import ConfigError

JOB_ID = re.compile(r"(?!\.\.?$)[A-Za-z0-9_.-]+")  # raysubmit_..., or a name given at submit; never ".." or "/"


def _when(ms: Optional[int]) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"


def format_table(jobs: Sequence[Any], width: int = 72) -> str:
    """id, status, entrypoint, start time; newest last."""
    rows = [("ID", "STATUS", "ENTRYPOINT", "START")]
    for j in sorted(jobs, key=lambda j: j.start_time or 0):
        entry = mask(j.entrypoint or "")
        entry = entry if len(entry) <= width else entry[: width - 3] + "..."
        rows.append((j.submission_id or j.job_id or "-", status_text(j.status), entry, _when(j.start_time)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows)


def run(
    action: str, job_id: Optional[str] = None, address: str = "", follow: bool = False, insecure: bool = False
) -> int:
    """`orchestrator jobs status|logs|stop|list`."""
    if action == "list" and job_id:
        raise ConfigError("JOB_ID", f"`jobs list` takes no submission id (got {job_id!r})")
    if job_id is not None and not JOB_ID.fullmatch(job_id):
        raise ConfigError("JOB_ID", f"got {job_id!r}; a submission id has letters, digits, '_', '-' and '.' only")
    if action != "list" and not job_id:
        raise ConfigError(
            "JOB_ID", f"`jobs {action}` needs a submission id; see `orchestrator jobs list --address URL`"
        )
    try:
        return _jobs(action, job_id, connect(address, insecure=insecure), follow)
    except ClusterError as exc:
        print(f"orchestrator jobs: error: {exc}", file=sys.stderr)
        return 1


def _jobs(action: str, job_id: Optional[str], client, follow: bool) -> int:
    if action == "list":
        with calls(client):
            print(format_table(client.list_jobs()))
        return 0
    if action == "logs":
        if follow:
            return follow_job(client, job_id)
        with calls(client, job_id):
            sys.stdout.write(client.get_job_logs(job_id))
        return 0
    if action == "stop":
        with calls(client, job_id):
            stopping = client.stop_job(job_id)
        status = wait_for(client, job_id, timeout_s=60.0)
        if not stopping:
            print(f"job {job_id} was not running: {status}")
        else:
            print(f"job {job_id} {status}" + ("" if status in TERMINAL else " (stop requested; not ended within 60 s)"))
        return 0 if status in TERMINAL else 1
    with calls(client, job_id):
        info = client.get_job_info(job_id)
    for key, value in (
        ("id", job_id),
        ("status", status_text(info.status)),
        ("entrypoint", mask(info.entrypoint or "")),
        ("start", _when(info.start_time)),
        ("end", _when(info.end_time)),
        ("message", mask(info.message or "")),
        ("exit code", info.driver_exit_code),
    ):
        if value not in (None, ""):
            print(f"{key:<11} {value}")
    return 0
