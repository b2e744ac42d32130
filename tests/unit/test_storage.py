"""orchestrator/core/storage.py: run records read and written the same on a path and in an object
store (moto's S3 on 127.0.0.1), and the node-visibility check of path storage."""

import pytest

from orchestrator.core import storage
from orchestrator.core.errors import ConfigError
from tests.conftest import BUCKET


@pytest.fixture(params=["path", "s3"])
def location(request, tmp_path, monkeypatch):
    if request.param == "path":
        return str(tmp_path / "runs")
    for key, value in request.getfixturevalue("object_store").items():
        monkeypatch.setenv(key, value)
    return f"s3://{BUCKET}/{tmp_path.name}"


def test_records_round_trip_and_list(location):
    assert storage.read_json(storage.join(location, "a", "record.json")) is None
    assert storage.subfolders(location) == []
    for name in ("20260102-000000", "20260101-000000"):
        storage.write_json(storage.join(location, name, "record.json"), {"run": name})
    assert storage.subfolders(location) == ["20260101-000000", "20260102-000000"]
    assert storage.read_json(storage.join(location, "20260102-000000", "record.json")) == {"run": "20260102-000000"}


def test_uris_pass_through_and_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert storage.resolve("s3://bucket/runs") == "s3://bucket/runs"  # not <cwd>/s3:/bucket/runs
    assert storage.resolve("runs") == str(tmp_path / "runs")
    assert storage.join("s3://bucket/runs/", "a", "b") == "s3://bucket/runs/a/b"
    assert storage.local_path("file:///data/runs") == storage.local_path("/data/runs")
    assert storage.local_path("gs://bucket/runs") is None


def test_a_path_some_node_cannot_see_is_refused(tmp_path):
    seen = {}

    def two_nodes(marker):  # node A is this machine; node B mounts something else there
        from pathlib import Path

        seen["marker"] = marker
        return {"10.0.0.1 (a)": Path(marker).exists(), "10.0.0.2 (b)": False}

    with pytest.raises(ConfigError) as err:
        storage.check_visible(str(tmp_path / "runs"), two_nodes)
    assert err.value.key == "train.storage_path" and "1 of 2 nodes (10.0.0.2 (b))" in str(err.value)
    assert seen["marker"].startswith(str(tmp_path / "runs")) and not list((tmp_path / "runs").iterdir())  # cleaned up
    storage.check_visible(str(tmp_path / "runs"), lambda marker: {"a": True, "b": True})
    storage.check_visible("s3://bucket/runs", lambda marker: pytest.fail("object stores are not probed"))


def test_an_object_store_that_refuses_or_does_not_answer_is_a_config_error(monkeypatch):
    """Before anything starts: a store whose endpoint refuses the connection, and one that
    accepts it but never answers, are each one ConfigError naming the key, within the bound."""
    import socket
    import time

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts, never replies
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refusing_port = closed.getsockname()[1]
    closed.close()
    try:
        for port in (refusing_port, silent.getsockname()[1]):
            monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{port}")
            started = time.monotonic()
            with pytest.raises(ConfigError) as refused:
                storage.check_reachable("s3://bucket/runs", "train.storage_path", timeout_s=3)
            assert time.monotonic() - started < 20
            assert str(refused.value).startswith("train.storage_path: ") and "\n" not in str(refused.value)
    finally:
        silent.close()
    storage.check_reachable("/a/local/folder", "train.storage_path")  # local paths need no probe
