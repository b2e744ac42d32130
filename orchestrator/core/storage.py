"""Where runs keep checkpoints and records: `train.storage_path`, a local path or a URI.

Ray Train and Tune take the location as it is (they open URIs with pyarrow.fs); the run and
sweep records the driver keeps beside the checkpoints go through pyarrow.fs here, so `s3://`,
`gs://` and `file://` work the same as a folder. Object-store credentials and endpoints come
from the usual environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL_S3, GOOGLE_APPLICATION_CREDENTIALS ...).

On a cluster of more than one node a plain path must be on a filesystem every node mounts:
`check_visible` proves it before training starts, instead of Ray failing at the first
checkpoint hours in.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from orchestrator.core.errors import ConfigError

CHECKPOINT_TAG = "state"
"""The DeepSpeed checkpoint tag (the folder inside each checkpoint) the trainer writes and export reads."""


def is_uri(location: str) -> bool:
    return "://" in str(location)


def resolve(location: str) -> str:
    """URIs pass through untouched; a path becomes absolute (Ray workers have their own cwd)."""
    return str(location) if is_uri(location) else str(Path(location).expanduser().resolve())


def join(location: str, *parts: str) -> str:
    if is_uri(location):
        return "/".join([str(location).rstrip("/"), *parts])
    return str(Path(location, *parts))


def local_path(location: str) -> Optional[Path]:
    """The local path behind a location (a path or file://), None for remote URIs."""
    if not is_uri(location):
        return Path(location)
    return Path(location[len("file://") :]) if str(location).startswith("file://") else None


def checkpoint_folder(key: str, value: str) -> None:
    """train.start_from_checkpoint's rule (validation.FIELDS): a folder on this machine (a path or
    file://: DeepSpeed loads local files) holding a checkpoint of this trainer, its CHECKPOINT_TAG folder."""
    folder = local_path(value)
    if folder is None:
        raise ConfigError(key, f"got {value!r}; use a local checkpoint folder (a path or file://), not a URI")
    folder = folder.expanduser()
    if not (folder / CHECKPOINT_TAG).is_dir():
        what = "a file" if folder.is_file() else "no such folder" if not folder.exists() else "holds no checkpoint"
        raise ConfigError(key, f"got {value!r}; {what}; give a run's checkpoint_* folder (it holds {CHECKPOINT_TAG}/)")


def filesystem(location: str):
    """(pyarrow filesystem, path within it) of a path or URI."""
    import pyarrow.fs as pafs

    if is_uri(location):
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), str(Path(location).resolve())


@contextlib.contextmanager
def refused_as(key: str) -> Iterator[None]:
    """pyarrow's errors on a location (a scheme it cannot open, missing credentials, a bucket
    that is not there) as a ConfigError of `key`: one line, exit 2."""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as exc:
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        raise ConfigError(key, lines[0]) from None


def check_reachable(location: str, key: str, timeout_s: float = 30.0) -> None:
    """Look `location` up once, as the checkpoints will: a URI pyarrow cannot open, or an object
    store that refuses or does not answer within `timeout_s`, is a ConfigError before anything starts."""
    if not is_uri(location) or location.startswith("file://"):
        return
    outcome: Dict[str, BaseException] = {}

    def look_up() -> None:
        try:
            with refused_as(key):
                fs, path = filesystem(location)
                fs.get_file_info(path)
        except ConfigError as exc:
            outcome["error"] = exc

    probe = threading.Thread(target=look_up, name="storage-probe", daemon=True)
    probe.start()
    probe.join(timeout_s)
    if probe.is_alive():
        raise ConfigError(
            key, f"{location} did not answer within {timeout_s:.0f} s; check its endpoint and credentials"
        )
    if "error" in outcome:
        raise outcome["error"]


def read_json(location: str) -> Optional[Dict[str, Any]]:
    """The JSON object at `location`, None when there is none."""
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode())


def write_json(location: str, data: Dict[str, Any]) -> None:
    fs, path = filesystem(location)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(json.dumps(data).encode())


def subfolders(location: str) -> List[str]:
    """Names of the folders directly under `location`, sorted ([] when it does not exist)."""
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)


def check_visible(location: str, node_sees: Callable[[str], Dict[str, bool]]) -> None:
    """Refuse a node-local `location` that some node of the cluster cannot see.

    Writes a marker file with a random name under `location` and asks `node_sees(marker)`
    ({node: does it see the marker}; launch.py asks each node with a Ray task). Remote URIs
    are visible from everywhere by construction and are not probed."""
    folder = local_path(location)
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / f".visible-{secrets.token_hex(6)}"
    marker.write_text("orchestrator storage probe")
    try:
        seen = node_sees(str(marker))
    finally:
        marker.unlink(missing_ok=True)
    blind: Sequence[str] = sorted(node for node, ok in seen.items() if not ok)
    if blind:
        raise ConfigError(
            "train.storage_path",
            f"{location} is not visible from {len(blind)} of {len(seen)} nodes "
            f"({', '.join(blind)}): checkpoints there would be lost or unreadable on resume; use a "
            "filesystem every node mounts or an object store (s3://, gs://)",
        )
