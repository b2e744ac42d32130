"""Hostile input to the surfaces a security review tried (issue 38): sweep names that become
folders, the `branch:` section, `batch.ramp`, `optuna_storage`, checkpoints to start from,
`report DIR` on hostile tables, report folders holding a user's files, `ui`, `prepare`, `submit`.
Each case is a row, run through the CLI's entry in-process with Ray, MLflow runs and the corpus
replaced by sentinels that fail the test when touched (`nothing_starts`): bad input is exit 2
with one line on stderr naming the key, nothing written or removed (every file compared by
content), no password printed; a failure during a run is exit 1 in one line, without one."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from mlflow.tracking import MlflowClient

from orchestrator.cli import main
from orchestrator.core import config, derived, storage
from orchestrator.driver import plan, ray_session, sweep
from orchestrator.reporting import report_files
from orchestrator.studies import kinds
from orchestrator.studies.study import Prepared
from orchestrator.tracking import mlflow_ui, run_tags
from orchestrator.tracking.store import Store
from tests.conftest import TINY, free_ports, sqlite_store, touched, write_sweep

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
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "trials.csv").write_text(TRIALS)
    (tmp_path / "tables" / "curves.csv").write_text(CURVES)
    return {
        "TABLEDIR": tmp_path / "tables",
        "AFILE": tmp_path / "a-file",
        "EMPTY": tmp_path / "empty",
        "NOSTATE": tmp_path / "no-state",
        "DANGLING": tmp_path / "dangling",
    }


def placed(args, things) -> list:
    out = []
    for a in args:
        for name, value in things.items():
            a = str(a).replace(name, str(value))
        out.append(a)
    return out


RAMP = "batch.ramp=[{from_tokens: 0, tokens_per_update: 4096}, {from_tokens: 16384, tokens_per_update: 8192}]"
TRIALS = "trial,status,batch.tokens_per_update,optim.lr,stopped_at\na,FINISHED,4096,0.001,\nb,FINISHED,8192,0.001,\n"
CURVES = "trial,metric,tokens,value\na,train/loss,0,5.0\na,train/loss,4096,4.0\nb,train/loss,0,5.0\n"
"""A table folder `report DIR` reads (the rows below make it hostile)."""

REFUSED_BEFORE_ANYTHING_STARTS = [  # (args, the key the one line names)
    # a password inside a URI is never printed, not even in the refusal
    (["plan", TINY, f"tracking.uri=ftp://u:{PASSWORD}@host/x"], "tracking.uri"),
    (["train", TINY, f"train.storage_path=ftp://u:{PASSWORD}@host/runs"], "train.storage_path"),
    # a checkpoint to start from: validated for every verb, not skipped for containing ://
    (["plan", TINY, "train.start_from_checkpoint=ftp://host/runs/checkpoint_000001"], "train.start_from_checkpoint"),
    (["plan", TINY, "train.start_from_checkpoint=s3://bucket/checkpoint_000001"], "train.start_from_checkpoint"),
    (["plan", TINY, "train.start_from_checkpoint=AFILE"], "train.start_from_checkpoint"),
    (["plan", TINY, "train.start_from_checkpoint=EMPTY"], "train.start_from_checkpoint"),
    (["train", TINY, "train.start_from_checkpoint=NOSTATE"], "train.start_from_checkpoint"),
    (["plan", TINY, "model.init_from=s3://bucket/model.safetensors"], "model.init_from"),
    # checkpoints repeated or past the end of the run
    (["plan", TINY, "train.checkpoint_at_tokens=[65536, 65536]"], "train.checkpoint_at_tokens"),
    (["plan", TINY, "train.checkpoint_at_tokens=[524288]"], "train.checkpoint_at_tokens"),
    (
        ["train", TINY, "train.stop_at_tokens=65536", "train.checkpoint_at_tokens=[131072]"],
        "train.checkpoint_at_tokens",
    ),
    # a budget no run could train (an ETA of 10^300 days)
    (["plan", TINY, "train.total_tokens=1" + "0" * 300], "train.total_tokens"),
    # an lr scaling exponent that overflows
    (["plan", TINY, RAMP, "batch.ramp_lr_scaling=1000"], "batch.ramp_lr_scaling"),
    (["plan", TINY, RAMP, "batch.ramp_lr_scaling=-1e308"], "batch.ramp_lr_scaling"),
    # a ramp's errors name the step's full key; one too long for the command line is refused
    (["plan", TINY, "batch.ramp=[{from_tokens: abc, tokens_per_update: 4096}]"], "batch.ramp.0.from_tokens"),
    (["plan", TINY, "batch.ramp=[{from_tokens: 0, tokens_per_updat: 4096}]"], "batch.ramp.0.tokens_per_updat"),
    (["plan", TINY, "batch.ramp=[{from_tokens: 0}]"], "batch.ramp.0.tokens_per_update"),
    (["plan", TINY, RAMP, "batch.ramp.1.from_tokens=1.5"], "batch.ramp.1.from_tokens"),
    (["plan", TINY, RAMP, "batch.ramp.2.from_tokens=0"], "batch.ramp.2.from_tokens"),
    (["plan", TINY, "batch.ramp=[" + "{from_tokens: 0, tokens_per_update: 4096}, " * 4000 + "]"], "batch.ramp"),
    (["report", "EMPTY"], "trials.csv"),  # a folder, not a name the store knows: the file it lacks
    # report's target losses
    (["report", "EMPTY", "--target-loss", "nan"], "--target-loss"),
    (["report", "EMPTY", "--target-loss", "-1"], "--target-loss"),
    # a ladder's target: positive finite N and D, both (or the sweep file's ladder.target)
    (["report", "EMPTY", "--target-params", "-1", "--target-tokens", "1e9"], "--target-params"),
    (["report", "EMPTY", "--target-params", "1e9", "--target-tokens", "nan"], "--target-tokens"),
    (["report", "EMPTY", "--target-params", "1e9"], "--target-tokens"),
    (["report", "EMPTY", "--target-params", "1e-300", "--target-tokens", "1e9"], "--target-params"),  # < 1
    (["report", "EMPTY", "--target-params", "1e9", "--target-tokens", "0.5"], "--target-tokens"),
    # --out where no folder can be: under a file, or a link to nothing
    (["report", "TABLEDIR", "--out", "AFILE/report"], "--out"),
    (["report", "TABLEDIR", "--out", "DANGLING"], "--out"),
    # the loss traded for a larger batch: a share of the loss, strictly between 0 and 1
    (["report", "EMPTY", "--loss-tolerance", "0"], "--loss-tolerance"),
    (["report", "EMPTY", "--loss-tolerance", "1.5"], "--loss-tolerance"),
    (["report", "EMPTY", "--loss-tolerance", "nan"], "--loss-tolerance"),
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


BRANCH = {"at_tokens": [16384, 65536], "factors": [1, 2, 4], "tokens": 20480}
SWEEP_FILES = [  # (sections of a sweep file, the key the one line names)
    # a sweep's name is one plain folder name (validation.plain_name), as a run's is
    ({"name": "/elsewhere/abs-study"}, "name"),
    ({"name": ".."}, "name"),
    ({"name": "."}, "name"),
    ({"name": "a/b"}, "name"),
    ({"name": ".hidden"}, "name"),
    # the database URL's password is not printed
    ({"search": {"algorithm": "optuna", "optuna_storage": f"ftp://u:{PASSWORD}@h/db"}}, "search.optuna_storage"),
    # lr scaling exponents have an upper bound
    (
        {
            "lr_scaling": {"reference_tokens": 2, "base_lr": 1e-3, "alpha": 5000},
            "space": {"batch.tokens_per_update": 4096},
        },
        "lr_scaling.alpha",
    ),
    ({"branch": {**BRANCH, "lr_scaling": 1000}}, "branch.lr_scaling"),
    # each branch factor and branch point once
    ({"branch": {**BRANCH, "factors": [1, 2, 2]}}, "branch.factors"),
    ({"branch": {**BRANCH, "at_tokens": [16384, 16384]}}, "branch.at_tokens"),
    # branch.from naming no run: before Ray, before the parent run (with no store: none is created)
    ({"branch": {**BRANCH, "from": "no-such-run"}}, "branch.from"),
    # the loss traded for a larger batch: a share of the loss; a branch study's is branch.tolerance
    ({"loss_tolerance": 1.5}, "loss_tolerance"),
    ({"loss_tolerance": 0}, "loss_tolerance"),
    ({"branch": BRANCH, "loss_tolerance": 0.01}, "loss_tolerance"),
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


def alias_bomb(levels: int = 9) -> str:
    """A few hundred bytes of YAML whose aliases expand to 9^levels strings (billion laughs)."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("verb", [["plan"], ["sweep", "--dry-run"]])
def test_a_yaml_alias_bomb_is_refused_in_one_line(verb, nothing_starts, capsys):
    """A config or a sweep file of under 700 bytes whose aliases would expand to 387 million
    nodes: refused by the one YAML reader before anything builds on it."""
    bomb = alias_bomb()
    assert len(bomb) < 700
    path = nothing_starts.parent / "bomb.yaml"
    path.write_text(bomb)
    before = tree(nothing_starts.parent)
    code = cli([verb[0], str(path), *verb[1:]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "aliases" in err[0], err
    assert tree(nothing_starts.parent) == before


def test_a_param_read_back_as_yaml_is_bounded_too():
    """A run's params are read back as YAML (recommended.yaml, a report's template run): an alias
    bomb logged as a param stays the text it was, not expanded."""
    from orchestrator.core import config

    assert config.from_params({"train.run_name": alias_bomb()})["train"]["run_name"] == alias_bomb()


LADDER_MODELS = [{"model.d_model": 32, "model.n_layers": 1}, {"model.d_model": 48, "model.n_layers": 1}]
TARGET = {"params": 1.0e6, "tokens": 2.0e7}
BAD_LADDERS = [  # (the ladder section, the key the one line names)
    # the target's overrides make a config `train` would refuse: refused before the rungs train
    (
        {
            "models": LADDER_MODELS,
            "tokens_per_param": [2, 4],
            "target": {"overrides": {"model.d_model": 128, "train.run_name": "../../esc"}, "tokens": 1638400},
        },
        "train.run_name",
    ),
    # the same model twice: its rungs would be merged silently
    (
        {
            "models": [LADDER_MODELS[0], LADDER_MODELS[1], LADDER_MODELS[0]],
            "tokens_per_param": [2, 4],
            "target": {"params": 1.0e6, "tokens": 2.0e7},
        },
        "ladder.models.2",
    ),
    # a target of one token, and one smaller than the rungs: a ladder extrapolates up to its target
    ({"models": LADDER_MODELS, "tokens_per_param": [2, 4], "target": {"params": 1.0e6, "tokens": 1}}, "ladder.target"),
    ({"models": LADDER_MODELS, "tokens_per_param": [2, 4], "target": {"params": 10, "tokens": 100}}, "ladder.target"),
    # budgets no run could train (10^300 days), or too short to warm up at the largest batch
    ({"models": LADDER_MODELS, "tokens_per_param": [2, 1.0e300], "target": TARGET}, "ladder.tokens_per_param"),
    ({"models": LADDER_MODELS, "tokens_per_param": [1.0e-9, 2], "target": TARGET}, "ladder.tokens_per_param"),
    # a rung's budget below every batch size the grid names
    (
        {
            "rungs": [
                {"overrides": LADDER_MODELS[0], "total_tokens": 100},
                {"overrides": LADDER_MODELS[1], "total_tokens": 65536},
            ],
            "target": TARGET,
        },
        "ladder.rungs.0.total_tokens",
    ),
    # more rungs than any ladder has: 1,002 laid out (each a bracket search) before a refusal
    (
        {"models": LADDER_MODELS, "tokens_per_param": [2 * 1.01**i for i in range(501)], "target": TARGET},
        "ladder: 1,002 rungs",
    ),
    # a model's own batch size or lr, which the grid would replace silently
    (
        {
            "models": [{**LADDER_MODELS[0], "batch.tokens_per_update": 512}, LADDER_MODELS[1]],
            "tokens_per_param": [2, 4],
            "target": TARGET,
        },
        "ladder.models.0",
    ),
    (
        {
            "models": [LADDER_MODELS[0], {**LADDER_MODELS[1], "optim.lr": 0.5}],
            "tokens_per_param": [2, 4],
            "target": TARGET,
        },
        "ladder.models.1",
    ),
]


@pytest.mark.parametrize("ladder, key", BAD_LADDERS, ids=[f"{i}-{k}" for i, (_, k) in enumerate(BAD_LADDERS)])
def test_a_bad_ladder_is_refused_in_one_line_before_anything_starts(ladder, key, nothing_starts, capsys):
    path = write_sweep(nothing_starts.parent, "ladder.yaml", ladder=ladder)
    before = tree(nothing_starts.parent)
    for verb in (["sweep", "--dry-run"], ["sweep"]):
        code = cli([verb[0], path, *verb[1:]])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and key in err[0], (verb, err)
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
    loaded = kinds.load(path)
    study = kinds.kind_of(loaded)
    base = config.load(TINY, [f"tracking.uri={uri}"])
    parent = sweep._open_parent(Prepared(study, loaded, base, base, None))
    Store(uri).set_tags(parent, {run_tags.CHECKPOINTS_TAG: f"s3://k:{PASSWORD}@b/r/x"})
    Store(uri).set_tags(parent, {run_tags.FAILURE_TAG: f"OSError: cannot open {secret_uri}"})
    run = Store(uri).get_run(parent)
    stored = json.dumps([run.params, run.tags])
    stored += Store(uri).read_text_artifact(parent, path.name)
    assert PASSWORD not in stored and "u:***@127.0.0.1:9/db" in stored and "k:***@b/r" in stored
    assert run.params["sweep.search.optuna_storage"] == "postgresql://u:***@127.0.0.1:9/db"


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


@pytest.mark.parametrize(
    "switch, traceback_shown", [("0", False), ("false", False), ("", False), ("1", True), ("yes", True)]
)
def test_the_traceback_switch_is_on_only_when_asked_and_its_traceback_is_redacted(
    switch, traceback_shown, nothing_starts, monkeypatch, capsys
):
    """ORCHESTRATOR_TRACEBACK=0 means off; on (1, true, yes), the whole traceback is printed with
    every URI's password redacted, as the one line is."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("ORCHESTRATOR_TRACEBACK", switch)
    password = "Pa@ss-w0rd"  # an '@' in it: the userinfo ends at the last one
    code = cli(["report", "some-sweep", f"tracking.uri=http://u:{password}@127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 1 and password not in err and "ss-w0rd" not in err and "u:***@127.0.0.1:9" in err, err
    assert ("Traceback (most recent call last)" in err) == traceback_shown
    assert len(err.strip().splitlines()) == 1 or traceback_shown


# ---------------------------------------------------------------- where report writes

FOLDERS = [  # (--out, what is in the folders beforehand, the key the one line names)
    ("USERDIR", {"USERDIR/trials.csv": "the user's own"}, "--out"),  # not a folder a report wrote
    ("USERDIR", {"USERDIR/notes.txt": "mine", "USERDIR/report.json": "{}"}, "--out"),  # a report's, and a user's file
    (  # the names a report writes, but the user's own files: report.json is not one a report wrote
        "USERDIR",
        {"USERDIR/report.json": '{"budget": 3}', "USERDIR/summary.md": "# mine", "USERDIR/recommended.yaml": "a: 1"},
        "--out",
    ),
    ("TABLES", {}, "--out"),  # DIR is never rewritten
    (None, {}, "--out"),  # nor when it is the default reports/<its name>
]


@pytest.mark.parametrize(
    "out, files, key", FOLDERS, ids=["user-trials", "user-file", "user-report-names", "same", "default-same"]
)
def test_report_writes_only_into_a_folder_of_its_own(out, files, key, nothing_starts, capsys):
    tables = nothing_starts / "reports" / "tables"  # report DIR's default --out is reports/tables
    tables.mkdir(parents=True)
    (tables / "trials.csv").write_text(TRIALS)
    (tables / "curves.csv").write_text(CURVES)
    for name, text in files.items():
        (nothing_starts / name).parent.mkdir(parents=True, exist_ok=True)
        (nothing_starts / name).write_text(text)
    before = tree(nothing_starts.parent)
    places = {"USERDIR": nothing_starts / "USERDIR", "TABLES": tables}
    code = cli(["report", "reports/tables", *(["--out", places[out]] if out else [])])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and key in err[0], err
    assert tree(nothing_starts.parent) == before


def test_a_ladder_table_of_too_many_rungs_is_refused_in_one_line(tmp_path, capsys):
    """1,001 rungs (one run each at its own budget): refused before the rungs are analysed (each
    costs milliseconds, and the laws' fits grow with them), nothing written."""
    trials = ["trial,status,batch.tokens_per_update,optim.lr,model.params,train.total_tokens"]
    curves = ["trial,metric,tokens,value"]
    for i in range(1001):
        trials.append(f"r{i},FINISHED,4096,0.001,1000,{4096 * (i + 2)}")
        curves += [f"r{i},train/loss,4096,5.0", f"r{i},train/loss,{4096 * (i + 2)},4.0"]
    folder = tmp_path / "tables"
    folder.mkdir()
    (folder / "trials.csv").write_text("\n".join(trials) + "\n")
    (folder / "curves.csv").write_text("\n".join(curves) + "\n")
    code = cli(["report", str(folder), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "1,001 rungs" in err[0] and "at most 1,000" in err[0], err
    assert not (tmp_path / "out").exists()


def test_report_names_that_are_not_plain_folder_names_need_an_out(nothing_starts, capsys):
    """A run named '..' (from a store written before names were checked) has no default folder."""
    uri = sqlite_store(nothing_starts.parent / "store")
    run_id = MlflowClient(tracking_uri=uri).create_run("0", run_name="..").info.run_id  # the Default experiment
    before, _ = tree(nothing_starts.parent), capsys.readouterr()
    code = cli(["report", run_id, f"tracking.uri={uri}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--out" in err[0] and "'..'" in err[0], err
    assert tree(nothing_starts.parent) == before


def test_a_report_rerun_into_its_default_folder_replaces_its_own_files(tmp_path, monkeypatch, capsys):
    """`report DIR` twice into its default reports/<name>: the second run replaces the first's
    files and touches no other."""
    monkeypatch.chdir(tmp_path)
    world_tables(tmp_path / "tables")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "mine.txt").write_text("a user's file beside the report")
    for _ in range(2):
        assert main(["report", "tables"]) == 0, capsys.readouterr().err
    out = tmp_path / "reports" / "tables"
    assert {p.name for p in out.iterdir()} <= set(report_files.OWNED) and (out / report_files.MARKER).is_file()
    assert (tmp_path / "reports" / "mine.txt").read_text() == "a user's file beside the report"


def test_a_report_over_an_earlier_one_leaves_none_of_the_earlier_files(tmp_path, monkeypatch, capsys):
    """A ladder's figures left by an earlier report of the folder are gone after a single sweep's
    report into it: the folder holds one report, never a mix."""
    monkeypatch.chdir(tmp_path)
    world_tables(tmp_path / "tables")
    assert main(["report", "tables", "--out", "out"]) == 0, capsys.readouterr().err
    first = {p.name for p in (tmp_path / "out").iterdir()}
    (tmp_path / "out" / "ladder_b_opt.png").write_bytes(b"an earlier ladder report's figure")
    assert main(["report", "tables", "--out", "out"]) == 0, capsys.readouterr().err
    assert {p.name for p in (tmp_path / "out").iterdir()} == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tables"]  # nothing of its own beside it


@pytest.mark.parametrize("earlier", [False, True], ids=["new-folder", "over-a-report"])
def test_a_report_that_fails_writing_leaves_the_folder_as_it_was(earlier, tmp_path, monkeypatch, capsys):
    """The disk fills up at the second figure: no half-written report (report.json and a figure
    that look like one), the earlier report whole, nothing of the report's own left beside it."""
    import errno

    from matplotlib.figure import Figure

    monkeypatch.chdir(tmp_path)
    world_tables(tmp_path / "tables")
    if earlier:
        assert main(["report", "tables", "--out", "out"]) == 0, capsys.readouterr().err
    before = tree(tmp_path)
    saved = Figure.savefig
    calls = []

    def full_disk(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return saved(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", full_disk)
    assert main(["report", "tables", "--out", "out"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left" in err[0], err
    assert tree(tmp_path) == before


def test_two_reports_into_one_folder_at_once_leave_one_whole_report(tmp_path):
    """Two reports staged at once into one new folder, in either order of finishing: the folder
    holds every file of the one that finished last, none of the other's, and nothing staged is left."""
    out = tmp_path / "reports" / "shared"
    figure = {"a": "loss_vs_tokens.png", "b": "critical_batch.png"}  # a file each, of the names a report writes
    for first, second in (("a", "b"), ("b", "a")):
        stages = {name: report_files.staged(out) for name in "ab"}
        folders = {name: stage.__enter__() for name, stage in stages.items()}
        for name, folder in folders.items():
            (folder / report_files.MARKER).write_text(json.dumps({"name": name, "critical_batch": []}))
            (folder / figure[name]).write_text(name)
        for name in (first, second):
            stages[name].__exit__(None, None, None)
        assert sorted(p.name for p in out.iterdir()) == sorted([figure[second], report_files.MARKER])
        assert json.loads((out / report_files.MARKER).read_text())["name"] == second
        assert [p.name for p in out.parent.iterdir()] == ["shared"]


def world_tables(folder, renamed=()):
    """trials.csv and curves.csv of a small known-truth world in `folder`; its first trials renamed."""
    from tests.known_truth import World

    world = World(draw=1, max_points=60)
    runs = world.grid(batches=(256, 512, 1024), lrs=(0.004, 0.008), seeds=1)
    world.write(runs, folder)
    for name in ("trials.csv", "curves.csv"):  # consistently in both files
        text = (folder / name).read_text()
        for run, new in zip(runs, renamed):
            text = text.replace(run.name, new)
        (folder / name).write_text(text)
    return folder


# ---------------------------------------------------------------- prepare


def test_a_failed_prepare_leaves_no_folder_it_created(tmp_path, capsys):
    """--out three folders deep, none of them there: a source that fails while it is tokenized
    (a line that is not JSON) leaves none of them."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "fine"}\nnot json\n')
    source = f"data.sources=[{{name: mine, kind: files, path: '{corpus}'}}]"
    before = tree(tmp_path)
    code = main(["prepare", str(TINY), source, "--out", str(tmp_path / "new" / "deeper" / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "data.sources.0" in err[0], err
    assert tree(tmp_path) == before


# ---------------------------------------------------------------- what a report shows of a name


def test_hostile_trial_names_come_out_inert(tmp_path, capsys):
    """A trial named like a spreadsheet formula or holding HTML: the written tables start it with a
    quote, summary.md opens no tag, summary.html escapes it."""
    formula, script = "=cmd|' /C calc'!A0", "<script>alert(1)</script>"
    folder = world_tables(tmp_path / "tables", renamed=(formula, script))
    assert main(["report", str(folder), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    out = tmp_path / "out"
    for name in ("trials.csv", "curves.csv"):
        cells = (out / name).read_text()
        assert f"'{formula}" in cells and f"\n{formula}" not in cells and f",{formula}" not in cells, name
    markdown = (out / "summary.md").read_text()
    assert "alert(1)" in markdown and "<script" not in markdown
    assert "<script" not in (out / "summary.html").read_text()


def test_trial_names_are_no_live_markdown_in_summary_md(tmp_path, capsys):
    """A trial named as a javascript link, a remote image, or with a newline that starts a heading:
    summary.md shows each as text (the names are all there, no link, image or heading of theirs)."""
    link, image, heading = "[click](javascript:alert(1))", "![t](https://evil.example/t.png)", "x\n# Owned"
    folder = world_tables(tmp_path / "tables", renamed=(link, image))
    assert main(["report", str(folder), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    markdown = (tmp_path / "out" / "summary.md").read_text()
    assert "javascript:alert" in markdown and "evil.example" in markdown  # shown, as text
    assert "[click](" not in markdown and "![t](" not in markdown
    from orchestrator.reporting.report_format import to_markdown  # a name with a newline, rendered

    rendered = to_markdown([("p", f"best run {heading}"), ("table", ["trial"], [[heading]]), ("h2", heading)])
    assert "\n# Owned" not in rendered


def test_ui_of_a_sweep_name_no_filter_can_hold_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(mlflow_ui, "_serve_until_stopped", lambda cmd, env: 0)
    uri = sqlite_store(tmp_path)
    Store(uri, "orchestrator").ensure_experiment()  # the experiment `ui` searches (the default)
    capsys.readouterr()  # the store's own set-up lines
    code = cli(["ui", "--sweep", "q'uo\"te", "--port", str(free_ports(1)[0]), f"tracking.uri={uri}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--sweep" in err[0], err


def test_a_recorded_sweep_file_that_is_not_utf8_is_refused_in_one_line(tmp_path):
    """A parent run's recorded sweep file (the artifact `report` reads its settings from) that is
    not UTF-8: a refusal naming the artifact (exit 2; was a UnicodeDecodeError, exit 1)."""
    from mlflow.tracking import MlflowClient

    from orchestrator.core.errors import ConfigError
    from orchestrator.reporting import report_inputs

    uri = sqlite_store(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(
        Store(uri, "orchestrator").ensure_experiment(), tags={run_tags.ROLE_TAG: run_tags.SWEEP_ROLE}
    )
    recorded = tmp_path / "study.yaml"
    recorded.write_bytes(b"name: \xff\xfe study\n")
    client.log_artifact(run.info.run_id, str(recorded))
    with pytest.raises(ConfigError, match="study.yaml.*not UTF-8"):
        report_inputs.recorded_sweep(uri, run.info.run_id)


def test_ui_on_every_interface_warns_that_it_has_no_authentication(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(mlflow_ui, "_serve_until_stopped", lambda cmd, env: 0)
    uri = sqlite_store(tmp_path)
    for host, warned in (("0.0.0.0", "on every interface"), ("127.0.0.1", None)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="orchestrator"):
            assert main(["ui", "--host", host, "--port", str(free_ports(1)[0]), f"tracking.uri={uri}"]) == 0
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        if warned:
            assert len(warnings) == 1 and warned in warnings[0] and "no authentication" in warnings[0], warnings
        else:
            assert warnings == []


# ---------------------------------------------------------------- checks before Ray


def test_branch_from_a_run_the_store_does_not_hold_is_refused_before_ray(nothing_starts, capsys):
    uri = sqlite_store(nothing_starts.parent / "store")
    path = write_sweep(nothing_starts.parent, "branches.yaml", branch={**BRANCH, "from": "no-such-run"})
    before, _ = tree(nothing_starts.parent), capsys.readouterr()  # (MLflow's words when it made the store)
    code = cli(["sweep", path, f"tracking.uri={uri}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "branch.from" in err[0] and "no-such-run" in err[0], err
    assert tree(nothing_starts.parent) == before
    assert MlflowClient(tracking_uri=uri).search_runs(["0"]) == [], "no MLflow run"


def test_submit_names_a_malformed_address_before_the_sweep_file(nothing_starts, capsys):
    path = write_sweep(nothing_starts.parent)  # outside the project folder, which submit refuses too
    code = cli(["submit", path, "--address", "not-a-url"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--address" in err[0] and "not-a-url" in err[0], err


def test_a_checkpoint_that_would_unpickle_code_is_refused_before_ray(tmp_path, monkeypatch, capsys):
    """train.start_from_checkpoint naming a planted pickle: refused by run_life.preflight (its
    first check, before the corpus is read), not by a worker after Ray started and a FAILED run."""
    from tests.planted_pickle import plant

    state = tmp_path / "checkpoint_000001" / storage.CHECKPOINT_TAG
    state.mkdir(parents=True)
    torch.save({"tokens": 65536}, state / "mp_rank_00_model_states.pt")
    plant(state / "mp_rank_00_model_states.pt", tmp_path / "pwned")
    monkeypatch.setattr(ray_session, "ray_init", touched("Ray"))
    monkeypatch.setattr(Store, "create_run", touched("MLflow"))
    monkeypatch.setenv("ORCHESTRATOR_CACHE_DIR", str(tmp_path / "token-cache"))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    code = main(["train", str(TINY), f"train.start_from_checkpoint={state.parent}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "train.start_from_checkpoint" in err[0] and "refusing" in err[0], err
    assert not (tmp_path / "pwned").exists() and os.listdir(work) == []


# ---------------------------------------------------------------- report DIR on hostile tables

HOSTILE_TABLES = [  # (file, what replaces what in it, the row and column the one line names)
    ("curves.csv", ("a,train/loss,4096,4.0", "a,train/loss,inf,4.0"), "row 3, column 'tokens'"),
    ("curves.csv", ("a,train/loss,4096,4.0", "a,train/loss,1e400,4.0"), "row 3, column 'tokens'"),
    ("curves.csv", ("a,train/loss,4096,4.0", "a,train/loss,-4096,4.0"), "row 3, column 'tokens'"),
    ("curves.csv", ("a,train/loss,4096,4.0", "a,train/loss,nan,4.0"), "row 3, column 'tokens'"),
    (
        "curves.csv",
        ("a,train/loss,4096,4.0", "a,train/loss,0,4.0"),
        "row 3, column 'tokens'",
    ),  # (a, train/loss, 0) twice
    ("curves.csv", ("a,train/loss,4096,4.0", "a,train/loss,4096,four"), "row 3, column 'value'"),
    ("curves.csv", ("b,train/loss,0,5.0", "b,train/loss,0,5.0," + "9" * 140_000), "row 4"),  # a cell past the header
    ("curves.csv", ("b,train/loss", "b" * 140_000 + ",train/loss"), "row 4, column 'trial'"),  # over 128 KiB
    ("trials.csv", ("b,FINISHED", "a,FINISHED"), "row 3, column 'trial'"),  # trial names are unique
    ("trials.csv", ("a,FINISHED,4096", "a,FINISHED,-4096"), "row 2, column 'batch.tokens_per_update'"),
    ("trials.csv", ("a,FINISHED,4096", "a,FINISHED,1e400"), "row 2, column 'batch.tokens_per_update'"),
    ("trials.csv", ("a,FINISHED,4096", "a,FINISHED,4096.5"), "row 2, column 'batch.tokens_per_update'"),
    ("trials.csv", ("4096,0.001,\nb", "4096,-0.001,\nb"), "row 2, column 'optim.lr'"),
    ("trials.csv", ("4096,0.001,\nb", "4096,inf,\nb"), "row 2, column 'optim.lr'"),
    ("trials.csv", ("8192,0.001,", "8192,0.001,inf"), "row 3, column 'stopped_at'"),
    ("trials.csv", (b"a,FINISHED", b"\xff\xfe,FINISHED"), "row 2, column 'trial'"),  # not UTF-8
    # a ladder's model size (no config key: the workload derives it) is a count of parameters >= 1
    *(
        (
            "trials.csv",
            ("stopped_at\na,FINISHED,4096,0.001,", f"stopped_at,model.params\na,FINISHED,4096,0.001,,{v}"),
            "row 2, column 'model.params'",
        )
        for v in ("0", "-5", "1e400")  # ("nan" is how pandas writes a missing cell: an unknown size)
    ),
    # and its budget, which every run of a rung shares: a count of tokens >= 1 like every count
    *(
        (
            "trials.csv",
            ("stopped_at\na,FINISHED,4096,0.001,", f"stopped_at,train.total_tokens\na,FINISHED,4096,0.001,,{v}"),
            "row 2, column 'train.total_tokens'",
        )
        for v in ("0", "1e400", "1.5")
    ),
]


@pytest.mark.parametrize("file, change, where", HOSTILE_TABLES, ids=[f"{f}: {w}" for f, _, w in HOSTILE_TABLES])
def test_a_hostile_table_is_refused_in_one_line_naming_file_row_and_column(file, change, where, nothing_starts, capsys):
    folder = nothing_starts.parent / "tables"
    folder.mkdir()
    (folder / "trials.csv").write_text(TRIALS)
    (folder / "curves.csv").write_text(CURVES)
    text = (folder / file).read_bytes()
    old, new = (c if isinstance(c, bytes) else c.encode() for c in change)
    assert old in text
    (folder / file).write_bytes(text.replace(old, new, 1))
    before = tree(nothing_starts.parent)
    code = cli(["report", folder, "--out", nothing_starts.parent / "out"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"orchestrator report: error: {file}: {folder}: {where}")
    assert len(err[0]) < 400 and tree(nothing_starts.parent) == before


def test_curves_read_by_columns_are_the_row_readers(tmp_path):
    """The columnar reader of curves.csv (the fast path) gives the row reader's curves, non-finite
    values left out, columns it does not read ignored; it hands a file it would refuse to the row reader."""
    from orchestrator.analysis import tables

    folder = world_tables(tmp_path / "tables")
    lines = (folder / "curves.csv").read_text().splitlines()
    header = lines[0].split(",")
    at = {name: header.index(name) for name in ("metric", "value")}
    cells = lines[5].split(",")
    cells[at["value"]] = "inf"  # a diverged run's loss
    lines[5] = ",".join(cells)
    lines = [line + ",extra" for line in lines]  # a column the analysis does not read
    (folder / "curves.csv").write_text("\n".join(lines) + "\n")
    columnar = tables._curves_columnar(folder / "curves.csv")
    rows = tables._curves(tables._rows(folder / "curves.csv"), tables._Where("curves.csv", str(folder)))
    assert columnar is not None and set(columnar) == set(rows)
    for trial, metrics in rows.items():
        assert {m: sorted(c) for m, c in metrics.items()} == columnar[trial]
    (folder / "curves.csv").write_text("\n".join(lines[:3] + [lines[2]]) + "\n")  # a repeated point
    assert tables._curves_columnar(folder / "curves.csv") is None


def test_curves_held_in_memory_are_read_by_columns_as_the_row_reader_reads_them(tmp_path):
    """Rows held in memory with numbers as numbers (the known-truth worlds', a caller's) take the
    columnar path: the row reader's curves; a row it would refuse is still refused by the row
    reader, which names it."""
    from orchestrator.analysis import tables
    from orchestrator.core.errors import ConfigError

    folder = world_tables(tmp_path / "tables")
    text_rows = tables._rows(folder / "curves.csv")
    rows = [{**r, "tokens": int(r["tokens"]), "value": float(r["value"])} for r in text_rows]
    rows[3]["value"] = float("nan")  # a diverged run's loss: left out
    rows.append({"trial": rows[0]["trial"], "metric": "perf/mfu", "tokens": -1, "value": 0.5})  # not read
    by_rows = tables._curves(rows, tables._Where("curves.csv", "memory"))
    by_columns = tables._curves_in_memory(rows)
    assert by_columns is not None and set(by_columns) == set(by_rows)
    for trial, metrics in by_rows.items():
        assert {m: sorted(c) for m, c in metrics.items()} == by_columns[trial]
    trial_rows = tables._rows(folder / "trials.csv")
    assert [t.train for t in tables.trials_from(trial_rows, rows)] == [
        t.train
        for t in tables.trials_from(trial_rows, text_rows[:3] + [{**text_rows[3], "value": "nan"}] + text_rows[4:])
    ]
    repeated = rows[:-1] + [dict(rows[1])]
    assert tables._curves_in_memory(repeated) is None
    with pytest.raises(ConfigError, match=f"row {len(repeated) + 1}"):
        tables.trials_from(trial_rows, repeated)


# ---------------------------------------------------------------- plan on ramps: linear, and the same answers

SHORT_RAMPS = {  # overrides of the tiny config -> plan's answers before it was made linear (issue 38)
    "two": (
        [RAMP, "batch.ramp_lr_scaling=sqrt"],
        {
            "ramp": [(0, 4, 1.0, 0.00075), (16384, 30, 1.4142135623730951, 0.0042321819537997985)],
            "lr_at": [
                0.00075,
                0.0,
                0.003878018165523355,
                0.0025330168979652377,
                0.001055956046924907,
                0.0004242640687119286,
            ],
            "steps": (34, 4, 30, 262144),
        },
    ),
    "three": (
        [
            "batch.ramp=[{from_tokens: 0, tokens_per_update: 2048}, {from_tokens: 8192, tokens_per_update: 4096}, "
            "{from_tokens: 65536, tokens_per_update: 16384}]",
            "batch.ramp_lr_scaling=linear",
            "schedule.decay=wsd",
            "schedule.wsd_decay_share=0.25",
        ],
        {
            "ramp": [(0, 4, 1.0, 0.000375), (8192, 14, 2.0, 0.0045000000000000005), (65536, 12, 8.0, 0.024)],
            "lr_at": [0.000375, 0.0, 0.006, 0.024, 0.024, 0.0024000000000000002],
            # decay steps 4, not 24 as plan answered before issue 52: wsd decays over the last quarter
            # of the budget (from 196,608 tokens), 4 updates of 16,384; 24 was every update after warmup
            "steps": (30, 6, 4, 262144),
        },
    ),
    "five": (
        [
            "batch.ramp=[{from_tokens: 0, tokens_per_update: 4096}, {from_tokens: 8192, tokens_per_update: 8192}, "
            "{from_tokens: 24576, tokens_per_update: 4096}, {from_tokens: 32768, tokens_per_update: 12288}, "
            "{from_tokens: 69632, tokens_per_update: 8192}]",
            "batch.ramp_lr_scaling=0.7",
            "schedule.warmup_tokens=40960",
            "train.total_tokens=200000",
        ],
        {
            "ramp": [
                (0, 2, 1.0, 0.00030000000000000003),
                (8192, 2, 1.624504792712471, 0.0019494057512549653),
                (24576, 2, 1.0, 0.0021000000000000003),
                (32768, 3, 2.157669279974593, 0.006462514251715341),
                (69632, 15, 1.624504792712471, 0.004263741439897662),
            ],
            "lr_at": [
                0.00030000000000000003,
                0.0,
                0.006440911031806476,
                0.003583765903036008,
                0.001491205536546048,
                0.00048735143781374133,
            ],
            "steps": (24, 7, 17, 192512),
        },
    ),
}


@pytest.mark.parametrize("name", SHORT_RAMPS)
def test_plan_of_a_ramp_gives_the_answers_it_gave_before_it_was_linear(name):
    """Exactly (not approximately) what `plan` answered when it recomputed the segments for every
    lr it printed; the updates before each segment are the running sum of those before."""
    overrides, before = SHORT_RAMPS[name]
    cfg = config.load(TINY, overrides)
    info = plan.describe(cfg)
    assert [(s["from_tokens"], s["updates"], s["lr_factor"], s["lr_after_change"]) for s in info["ramp"]] == before[
        "ramp"
    ]
    assert list(info["lr_at"].values()) == before["lr_at"]
    assert (info["total_steps"], info["warmup_steps"], info["decay_steps"], info["total_tokens"]) == before["steps"]
    segments = derived.batch_segments(cfg)
    assert [s.start_update for s in segments] == [sum(s.updates for s in segments[:i]) for i in range(len(segments))]
