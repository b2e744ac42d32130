"""Hostile input to the surfaces a security review tried (issue 38): sweep names that become
folders, the `branch:` section, `batch.ramp`, `optuna_storage`, checkpoints to start from,
`report DIR` on hostile tables, report folders holding a user's files, `ui`, `prepare`, `submit`.
Each case is a row, run through the CLI's entry in-process with Ray, MLflow runs and the corpus
replaced by sentinels that fail the test when touched (`nothing_starts`): bad input is exit 2
with one line on stderr naming the key, nothing written or removed (every file compared by
content), no password printed; a failure during a run is exit 1 in one line, without one."""

from __future__ import annotations

import json
import os

import pytest

from orchestrator.cli import main
from orchestrator.core import config, sweep_file
from orchestrator.driver import sweep
from orchestrator.tracking import mlflow_runs
from tests.conftest import TINY, free_ports, sqlite_store, write_sweep

PASSWORD = "PW-hunter2"
"""In every URI a row gives a password: it must appear nowhere the command prints or writes."""


def tree(folder) -> list:
    """Every file and folder under `folder` with its bytes: what "nothing written or removed" compares."""
    return sorted((str(p.relative_to(folder)), p.read_bytes() if p.is_file() else None) for p in folder.rglob("*"))


def cli(args) -> int:
    """The exit code of the command line's entry in-process (argparse's own refusals end in SystemExit)."""
    try:
        return main([str(a) for a in args])
    except SystemExit as stop:
        return stop.code


@pytest.fixture
def hostile(nothing_starts, tmp_path, monkeypatch):
    """What a row names, outside the working directory: a plain file, an empty folder, a
    checkpoint folder without its state/."""
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "empty").mkdir()
    (tmp_path / "no-state" / "other").mkdir(parents=True)
    monkeypatch.setenv("ORCHESTRATOR_CACHE_DIR", str(tmp_path / "token-cache"))  # `train` names it (and reads nothing)
    return {"AFILE": tmp_path / "a-file", "EMPTY": tmp_path / "empty", "NOSTATE": tmp_path / "no-state"}


def placed(args, things) -> list:
    out = []
    for a in args:
        for name, value in things.items():
            a = str(a).replace(name, str(value))
        out.append(a)
    return out


REFUSED_BEFORE_ANYTHING_STARTS = [  # (args, the key the one line names)
    # a password inside a URI is never printed, not even in the refusal
    (["plan", TINY, f"tracking.uri=ftp://u:{PASSWORD}@host/x"], "tracking.uri"),
    (["train", TINY, f"train.storage_path=ftp://u:{PASSWORD}@host/runs"], "train.storage_path"),
]


@pytest.mark.parametrize(
    "args, key",
    REFUSED_BEFORE_ANYTHING_STARTS,
    ids=[" ".join(str(x) for x in a if x != TINY)[:120] for a, _ in REFUSED_BEFORE_ANYTHING_STARTS],
)
def test_bad_input_is_refused_in_one_line_before_anything_starts(args, key, hostile, nothing_starts, capsys):
    before = tree(nothing_starts.parent)
    code = cli(placed(args, hostile))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and key in err[0], err
    assert PASSWORD not in err[0]
    assert tree(nothing_starts.parent) == before, "nothing written or removed"


SWEEP_FILES = [  # (sections of a sweep file, the key the one line names)
    # the database URL's password is not printed
    ({"search": {"algorithm": "optuna", "optuna_storage": f"ftp://u:{PASSWORD}@h/db"}}, "search.optuna_storage"),
]


@pytest.mark.parametrize("sections, key", SWEEP_FILES, ids=[k for _, k in SWEEP_FILES])
def test_a_bad_sweep_file_is_refused_in_one_line_before_anything_starts(sections, key, nothing_starts, capsys):
    source = "branches.yaml" if "branch" in sections else "smoke.yaml"
    path = write_sweep(nothing_starts.parent, source, **sections)
    before = tree(nothing_starts.parent)
    for verb in (["sweep"], ["sweep", "--dry-run"], ["report"]) if key == "name" else (["sweep"],):
        code = cli([verb[0], path, *verb[1:]])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and key in err[0], (verb, err)
        assert PASSWORD not in err[0]
    assert tree(nothing_starts.parent) == before, "nothing written or removed"


# ---------------------------------------------------------------- passwords in what is logged and printed


def test_no_password_reaches_the_store_from_a_sweep_file_or_a_config(tmp_path):
    """The sweep's parent run: its params and its sweep-file artifact; and every param, tag and
    text logged through the one door (a storage URI in the checkpoints tag, a failure reason)."""
    uri = sqlite_store(tmp_path)
    secret_uri = f"postgresql://u:{PASSWORD}@127.0.0.1:9/db"
    path = write_sweep(
        tmp_path,
        base={"config": str(TINY), "overrides": {"train.storage_path": f"s3://k:{PASSWORD}@b/r"}},
        search={"algorithm": "optuna", "optuna_storage": secret_uri, "num_samples": 2},
        space={"optim.lr": {"loguniform": [1e-4, 1e-2]}},
    )
    parent = sweep._open_parent(sweep_file.load(path), config.load(TINY, [f"tracking.uri={uri}"]), None)
    mlflow_runs.set_tags(uri, parent, {mlflow_runs.CHECKPOINTS_TAG: f"s3://k:{PASSWORD}@b/r/x"})
    mlflow_runs.set_tags(uri, parent, {mlflow_runs.FAILURE_TAG: f"OSError: cannot open {secret_uri}"})
    run = mlflow_runs.get_run(uri, parent)
    stored = json.dumps([run.data.params, run.data.tags])
    stored += mlflow_runs.read_text_artifact(uri, parent, path.name)
    assert PASSWORD not in stored and "u:***@127.0.0.1:9/db" in stored and "k:***@b/r" in stored
    assert run.data.params["sweep.search.optuna_storage"] == "postgresql://u:***@127.0.0.1:9/db"


@pytest.mark.parametrize("verb", [["ui", "--port", "PORT"], ["report", "some-sweep"]])
def test_a_failure_reaching_the_command_line_is_one_line_without_the_password(
    verb, nothing_starts, monkeypatch, capsys
):
    """A tracking server that refuses the connection: MLflow's exception names the URI with its
    password; the command prints its first line, redacted, and exits 1."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow retries for minutes otherwise
    args = [a.replace("PORT", str(free_ports(1)[0])) for a in verb]
    code = cli([*args, f"tracking.uri=http://u:{PASSWORD}@127.0.0.1:9"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "MlflowException" in err[0] and "u:***@127.0.0.1:9" in err[0], err
    assert PASSWORD not in err[0] and os.listdir(nothing_starts) == []
