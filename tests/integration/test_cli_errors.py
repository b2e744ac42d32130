"""Bad input through the real command line: exit code 2, one line naming the key, no traceback."""

import json

import pytest

from orchestrator import cli
from tests.conftest import ROOT, TINY, run_cli, run_main

CASES = [
    # (extra args, text the message must contain)
    (["optim.lrr=1"], "optim.lr"),  # unknown key, with a did-you-mean
    (["bogus.key=1"], "bogus.key"),  # unknown section
    (["optim.lr=abc"], "optim.lr"),  # wrong type
    (["train.total_tokens=lots"], "train.total_tokens"),
    (["optim.lr=-0.1"], "optim.lr"),  # negative lr (0 is allowed)
    (["data.seq_len=0"], "data.seq_len"),  # non-positive sizes
    (["batch.micro_batch_size=0"], "batch.micro_batch_size"),
    (["cluster.num_workers=-2"], "cluster.num_workers"),
    (["batch.tokens_per_update=0"], "batch.tokens_per_update"),
    (["batch.grad_accum_steps=0"], "batch.grad_accum_steps"),
    (["schedule.warmup_tokens=999999999"], "schedule.warmup_tokens"),  # warmup beyond budget
    (["schedule.warmup_tokens=100"], "schedule.warmup_tokens"),  # warmup within the first update
    (["gns.ema_tokens=0"], "gns.ema_tokens"),
    (["train.total_tokens=100", "schedule.warmup_tokens=0"], "train.total_tokens"),  # budget < 1 update
    (["batch.tokens_per_update=4000"], "batch.tokens_per_update"),  # no exact decomposition
    (["batch.grad_accum_steps=3"], "batch.tokens_per_update"),
    (["deepspeed.zero_stage=4"], "deepspeed.zero_stage"),
    (["deepspeed.zero_stage=-1"], "deepspeed.zero_stage"),
    (["deepspeed.extra.zero_optimization.stage=7"], "deepspeed.extra.zero_optimization.stage"),
    (["deepspeed.precision=fp16"], "deepspeed.precision"),  # fp16 on CPU
    (["deepspeed.precision=fp8"], "deepspeed.precision"),
    (["schedule.decay=step"], "schedule.decay"),
    (["schedule.min_lr_ratio=2"], "schedule.min_lr_ratio"),
    (["data.seq_len=512"], "data.seq_len"),  # beyond the model's positions
    (["model.n_heads=3"], "model.n_heads"),
    (["model.name=bert"], "model.name"),
    (["data.sources.0.kind=web"], "data.sources.0.kind"),
    (["data.sources=[{name: a, kind: code}, {name: a, kind: prose}]"], "data.sources.1.name"),
    (["data.eval_fraction=1.5"], "data.eval_fraction"),
    (["optim.beta2=1.0"], "optim.beta2"),
    (["not-an-override"], "not-an-override"),
    (["cluster.placement_strategy=pack"], "cluster.placement_strategy"),
    (["train.storage_path=ftp://host/runs"], "train.storage_path"),
]


def assert_one_clean_line(code, stderr, must_contain):
    assert code == 2, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert must_contain in lines[0]


@pytest.mark.parametrize("extra,key", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_override(extra, key, capsys):
    """In this process: the files below go through the real command line."""
    code, out, err = run_main(capsys, "plan", TINY, *extra)
    assert_one_clean_line(code, err, key)
    assert out == ""


def test_missing_config_file(tmp_path):
    code, _, err = run_cli("plan", tmp_path / "nope.yaml")
    assert_one_clean_line(code, err, "nope.yaml")


def test_yaml_syntax_error_names_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_layers: 2\n  d_model: [128\n")
    code, _, err = run_cli("plan", bad)
    assert_one_clean_line(code, err, "line")


def test_unknown_key_in_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  learning_rate: 0.1\n")
    code, _, err = run_cli("plan", bad)
    assert_one_clean_line(code, err, "optim.learning_rate")


def test_unknown_flag():
    code, _, err = run_cli("plan", TINY, "--jsn")
    assert code == 2 and "--jsn" in err and "Traceback" not in err


def test_plan_json_contract():
    code, out, err = run_cli(
        "plan",
        TINY,
        "data.seq_len=4096",
        "model.max_seq_len=4096",
        "batch.micro_batch_size=4",
        "cluster.num_workers=128",
        "batch.tokens_per_update=16777216",
        "train.total_tokens=167772160",
        "schedule.warmup_tokens=33554432",
        "--json",
    )
    assert code == 0, err
    info = json.loads(out)
    for key in (
        "seq_len",
        "micro_batch_size",
        "num_workers",
        "grad_accum_steps",
        "tokens_per_update",
        "total_tokens",
        "total_steps",
        "warmup_steps",
    ):
        assert key in info
    assert info["grad_accum_steps"] == 8 and info["total_steps"] == 10


def test_lr_zero_is_allowed():
    code, out, err = run_cli("plan", TINY, "optim.lr=0")
    assert code == 0, err


def test_prepare_writes_shards_that_training_uses(tmp_path):
    small = ["data.max_documents_per_source=40"]
    code, out, err = run_cli("prepare", TINY, *small, "--out", tmp_path / "shards", cwd=tmp_path)
    assert code == 0, err
    assert "data.shard_dir=" in out
    shards = sorted(p.name for p in (tmp_path / "shards").iterdir())
    assert shards == ["arithmetic", "code", "prose"]
    code, out, err = run_cli("plan", TINY, *small, f"data.shard_dir={tmp_path / 'shards'}", cwd=tmp_path)
    assert code == 0, err


def test_train_rejects_a_missing_corpus_before_ray(tmp_path):
    code, out, err = run_cli(
        "train",
        TINY,
        f"data.sources=[{{name: mine, kind: files, path: '{tmp_path}/nope/*.txt'}}]",
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        cwd=tmp_path,
        timeout=120,
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "data.sources.0.path" in lines[0], err
    assert not (tmp_path / "mlflow.db").exists(), "no MLflow run for bad input"


def test_train_rejects_an_empty_or_too_small_corpus(tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(
        "train", TINY, f"data.sources=[{{name: e, kind: files, path: '{tmp_path}/empty'}}]", cwd=tmp_path, timeout=120
    )
    assert code == 2 and "data.sources.0" in err and "Traceback" not in err, err
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "a.txt").write_text("a tiny corpus " * 300)
    code, _, err = run_cli(
        "train",
        TINY,
        f"data.sources=[{{name: s, kind: files, path: '{tmp_path}/small'}}]",
        "data.eval_fraction=0.5",
        cwd=tmp_path,
        timeout=120,
    )
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_train_rejects_seq_len_beyond_positions(tmp_path):
    code, _, err = run_cli("train", TINY, "data.seq_len=256", cwd=tmp_path, timeout=120)
    assert code == 2 and "data.seq_len" in err and "model.max_seq_len" in err


@pytest.mark.slow
@pytest.mark.parametrize(
    "verb,target,shape,hint",
    [
        (
            "sweep",
            ROOT / "conf" / "sweep" / "smoke.yaml",
            "4 x {CPU: 1} (PACK) + {CPU: 0.2} for the trial",
            "nearest that fits: cluster.cpus_per_worker=0.45 or cluster.num_workers=1",
        ),
        (
            "train",
            TINY,
            "4 x {CPU: 1} (PACK)",
            "nearest that fits: cluster.cpus_per_worker=0.5 or cluster.num_workers=2",
        ),
    ],
)
def test_a_shape_ray_can_never_place_exits_2_before_any_run(
    verb, target, shape, hint, ray_session, tmp_path, monkeypatch, capsys
):
    """4 workers of 1 CPU on the 2-CPU Ray: Ray Train would wait for them forever."""
    monkeypatch.chdir(tmp_path)
    code = cli.main(
        [
            verb,
            str(target),
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
            "cluster.num_workers=4",
            "cluster.cpus_per_worker=1",
        ]
    )
    err = capsys.readouterr().err
    assert_one_clean_line(code, err, shape)
    assert hint in err, err
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists(), "something was written"


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`orchestrator plan ... | head`: the reader closes the pipe before the table is written; the
    command exits 0 with nothing on stderr (it was a BrokenPipeError traceback)."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "plan", str(TINY)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # before the command has written anything
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and err == b"", err.decode()
