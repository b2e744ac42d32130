"""`--follow` of `submit` and `jobs logs`: stream a job's logs until it ends, riding out lost contact.

A port-forward or SSH tunnel that dies, or a dashboard that restarts, must not end a long
`--follow` nor print a line twice: `follow_job` reconnects with doubling waits (1 s up to
BACKOFF_CAP_S) for RECONNECT_WINDOW_S, skips what it already printed (Ray's log stream always
starts again at the job's first line), checks a quiet stream every IDLE_CHECK_S (a half-open
tunnel would block it forever) and falls back to polling the status every POLL_S when the
stream keeps failing. It exits LOST_CONTACT (3) when the dashboard stays unreachable, since the
job may still be running. Talking to the cluster (connect, auth, errors, `get_json`) is
orchestrator.cluster.ray_jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Optional

from orchestrator.cluster.ray_jobs import TERMINAL, ClusterError, ContactLost, first_line, get_json, mask
from orchestrator.core.errors import ConfigError

LOST_CONTACT = 3
"""Exit code of `--follow` that lost contact with a job that may still be running (docs/design.md 3)."""
RECONNECT_WINDOW_S = 600.0
"""How long `--follow` keeps trying to reach the dashboard again (a port-forward restarted, a
dashboard back up) before it gives up with LOST_CONTACT."""
BACKOFF_CAP_S = 30.0
"""Longest wait between two attempts to reconnect; the waits double from 1 s."""
IDLE_CHECK_S = 30.0
"""A log stream quiet this long is checked with a status request on a new connection: a
half-open tunnel (a dead SSH session) would otherwise block the stream forever."""
POLL_S = 2.0
"""Status polling interval of `--follow` once the log stream is given up."""


def _lost_reason(exc: BaseException) -> Optional[str]:
    """Why contact broke off, when `exc` says it did (else None): refused, reset, timed out, a
    websocket closed abnormally, an HTTP 5xx from a proxy."""
    import aiohttp

    if isinstance(exc, ContactLost):
        return str(exc)
    if isinstance(exc, aiohttp.ClientResponseError):  # the websocket handshake got an HTTP error
        return f"HTTP {exc.status}" if exc.status >= 500 else None
    if isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, OSError)):
        return first_line(exc)
    if isinstance(exc, RuntimeError) and "WebSocket" in str(exc):  # Ray's tail_job_logs, cut off
        return first_line(exc)
    return None


def follow_job(client, job_id: str) -> int:
    """Stream the job's logs until it ends; 0 when it SUCCEEDED, 1 when FAILED or STOPPED, and
    LOST_CONTACT (3) when the dashboard stayed unreachable for RECONNECT_WINDOW_S.

    A dropped connection (a port-forward that died, a restarted dashboard) is retried with
    doubling waits. Ray's log stream always starts again at the job's first line, so the
    characters already written are counted and skipped: every line is printed once.
    """
    address = mask(client.get_address())
    written = 0  # characters of the job's log written to stdout so far
    lost_since: Optional[float] = None  # when contact broke off; None while in contact
    delay = 1.0
    streaming = True  # False: only poll the status and print the logs at the end

    def in_contact() -> None:
        nonlocal lost_since, delay
        if lost_since is not None:
            print(f"reconnected to the Ray dashboard at {address}", file=sys.stderr, flush=True)
        lost_since, delay = None, 1.0

    async def tail() -> None:
        nonlocal written
        seen = 0  # characters of this stream so far
        stream = client.tail_job_logs(job_id)
        try:
            while True:
                chunk = asyncio.ensure_future(stream.__anext__())
                while not (await asyncio.wait({chunk}, timeout=IDLE_CHECK_S))[0]:
                    try:  # a quiet stream: is the dashboard still there?
                        await asyncio.to_thread(get_json, client, f"/api/jobs/{job_id}", job_id)
                    except BaseException:
                        chunk.cancel()
                        await asyncio.wait({chunk})
                        raise
                    in_contact()
                try:
                    text = chunk.result()
                except StopAsyncIteration:
                    return
                in_contact()
                if seen + len(text) > written:
                    sys.stdout.write(text[written - seen :])
                    sys.stdout.flush()
                    written = seen + len(text)
                seen += len(text)
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()

    ended = False  # the log stream ended normally, yet the job's status still said running
    answered = 0.0  # when the dashboard last answered a status request
    try:
        while True:
            try:
                job = get_json(client, f"/api/jobs/{job_id}", job_id)
                answered = time.monotonic()
                if job.get("status") in TERMINAL:
                    logs = get_json(client, f"/api/jobs/{job_id}/logs", job_id).get("logs") or ""
                    in_contact()
                    sys.stdout.write(logs[written:])
                    break
                if ended:  # the stream ends when the job does; its status may lag a moment
                    time.sleep(1.0)
                if streaming:
                    ended = False
                    asyncio.run(tail())  # returns when the job's log stream ends
                    ended = True
                else:
                    in_contact()
                    time.sleep(POLL_S)
            except Exception as exc:
                why = _lost_reason(exc)
                if why is None and streaming and not isinstance(exc, (ConfigError, ClusterError)):
                    # the log stream failed in another way (e.g. a proxy without websockets)
                    print(
                        f"log stream unavailable ({mask(first_line(exc))}); waiting for the job to end",
                        file=sys.stderr,
                    )
                    streaming = False
                    continue
                if why is None:
                    raise
                lost_since = lost_since or time.monotonic()
                left = RECONNECT_WINDOW_S - (time.monotonic() - lost_since)
                if left <= 0 and streaming and answered > lost_since:
                    # the dashboard answers, only its log stream keeps breaking off: poll the status
                    print(
                        f"the log stream keeps breaking off ({mask(why)}); waiting for the job to end", file=sys.stderr
                    )
                    streaming, lost_since, delay = False, None, 1.0
                    continue
                if left <= 0:
                    print(
                        f"lost contact with the Ray dashboard at {address}; job {job_id} may still be running: "
                        f"orchestrator jobs status {job_id} --address {address}",
                        file=sys.stderr,
                        flush=True,
                    )
                    return LOST_CONTACT
                print(
                    f"connection to the Ray dashboard at {address} lost ({mask(why)}); reconnecting in {delay:g} s",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(min(delay, left))
                delay = min(2 * delay, BACKOFF_CAP_S)
    except KeyboardInterrupt:
        print(
            f"stopped following; job {job_id} keeps running (orchestrator jobs stop {job_id} --address {address})",
            file=sys.stderr,
        )
        raise
    status, message = job["status"], job.get("message") or ""
    print(f"job {job_id} {status}" + (f": {mask(message)}" if status != "SUCCEEDED" and message else ""), flush=True)
    return 0 if status == "SUCCEEDED" else 1
