"""`orchestrator export`: a ZeRO-3 run of two workers, exported to one fp32 safetensors state
dict, reloads into a plain PyTorch GPT that gives the run's own eval losses (absolute 1e-5);
from an object store too, and a chosen checkpoint; bad targets exit 2 and write nothing. A pickle
planted in the run's checkpoint stops both `export` and a `train` re-run (a resume) with exit 2
naming the file, the re-run before Ray starts."""

import shutil

import pytest
import torch
from safetensors.torch import load_model

from orchestrator import cli
from orchestrator.core import config, storage
from orchestrator.core.derived import batch_plan
from orchestrator.driver import launch
from orchestrator.export import export
from orchestrator.tracking import run_tags
from orchestrator.tracking.store import Store
from tests.conftest import BUCKET, TINY, sqlite_store
from tests.planted_pickle import plant

pytestmark = pytest.mark.slow
TOLERANCE = 1e-5  # absolute, on losses of about 5


@pytest.fixture(scope="module")
def zero3_run(ray_session, tmp_path_factory):
    """(tracking uri, MLflow run id, {tokens: eval/loss}) of 2 updates at ZeRO 3 on 2 workers,
    with an evaluation and a checkpoint at 2,048 and at 4,096 tokens (the end)."""
    tmp = tmp_path_factory.mktemp("zero3")
    cfg = config.load(TINY, zero3_overrides(sqlite_store(tmp), tmp / "runs"))
    assert launch.train(cfg) == 0
    run_id = launch.recorded_run_id(cfg.train.storage_path, "zero3")
    evals = dict(Store(cfg.tracking.uri).metric_history(run_id, "eval/loss"))
    assert {2048, 4096} <= set(evals)
    return cfg.tracking.uri, run_id, evals


def zero3_overrides(uri, storage_path):
    return [
        "model.n_layers=1",
        "model.d_model=64",
        "model.max_seq_len=64",
        "data.seq_len=64",
        "cluster.num_workers=2",
        "cluster.cpus_per_worker=0.4",
        "deepspeed.zero_stage=3",
        "batch.tokens_per_update=2048",
        "train.total_tokens=4096",
        "train.report_every_tokens=2048",
        "train.eval_every_tokens=2048",
        "train.checkpoint_every_tokens=2048",
        "train.eval_tokens=2048",
        "schedule.warmup_tokens=0",
        "gns.enabled=false",
        "train.run_name=zero3",
        f"tracking.uri={uri}",
        "tracking.flush_every_s=0.2",
        f"train.storage_path={storage_path}",
    ]


def held_out_loss(folder) -> float:
    """What the trainer's evaluation computes (workloads/train/engine.py: evaluate over every rank's
    GPTWorkload.eval_batches), with a plain GPT built from the exported config and weights."""
    from workloads import data, model

    cfg = config.load(folder / "config.yaml", [])
    gpt = model.GPT(model.GPTConfig.of(cfg.model))
    load_model(gpt, folder / "model.safetensors")  # strict: every key, the tied head included
    gpt.eval()
    plan = batch_plan(cfg)
    eval_set = data.TokenDataset(cfg, "eval")
    loss_sum, count = 0.0, 0.0
    with torch.no_grad():
        for rank in range(plan.num_workers):
            for b in eval_set.eval_batches(cfg.train.eval_tokens, plan.micro_batch_size, rank, plan.num_workers):
                summed, n = model.token_losses(gpt(b.inputs, b.positions, b.doc_ids), b.targets, b.loss_mask)
                loss_sum, count = loss_sum + float(summed), count + float(n)
    return loss_sum / count


def test_export_of_a_zero3_run_reloads_with_its_last_eval_loss(zero3_run, tmp_path, capsys):
    uri, run_id, evals = zero3_run
    out = tmp_path / "exported"
    assert cli.main(["export", run_id, "--out", str(out), f"tracking.uri={uri}"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "model.safetensors"]
    assert "4,096 tokens (ZeRO 3)" in capsys.readouterr().out
    loss = held_out_loss(out)
    print(
        f"exported eval loss {loss!r}, the run's last eval/loss {evals[4096]!r}, |diff| {abs(loss - evals[4096]):.3g}"
    )
    assert abs(loss - evals[4096]) <= TOLERANCE
    # The tied head is stored once; load_state_dict restores it for a strict plain load.
    from workloads import model

    state = export.load_state_dict(out / "model.safetensors")
    assert state["lm_head.weight"] is state["wte.weight"]
    gpt = model.GPT(model.GPTConfig.of(config.load(out / "config.yaml", []).model))
    gpt.load_state_dict(state)
    assert all(p.dtype == torch.float32 for p in state.values())


def test_export_of_a_chosen_checkpoint_in_an_object_store(zero3_run, tmp_path, object_store, monkeypatch):
    uri, run_id, evals = zero3_run
    for key, value in object_store.items():
        monkeypatch.setenv(key, value)
    import pyarrow.fs as pafs

    local = Store(uri).get_run(run_id).tags[run_tags.CHECKPOINTS_TAG]
    remote = f"s3://{BUCKET}/{tmp_path.name}/zero3"
    fs, path = pafs.FileSystem.from_uri(remote)
    for name in storage.subfolders(local):
        pafs.copy_files(f"{local}/{name}", f"{path}/{name}", destination_filesystem=fs)
    out = tmp_path / "at-2048"
    args = ["export", "zero3", "--out", str(out), "--checkpoint", remote, "--tokens", "2048", f"tracking.uri={uri}"]
    assert cli.main(args) == 0
    assert abs(held_out_loss(out) - evals[2048]) <= TOLERANCE


def test_export_refuses_a_folder_that_is_not_empty(zero3_run, tmp_path, capsys):
    uri, run_id, _ = zero3_run
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert cli.main(["export", run_id, "--out", str(out), f"tracking.uri={uri}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("orchestrator export: error: --out:")
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # no half-written folder beside it


def test_export_of_an_unknown_run_exits_2(zero3_run, tmp_path, capsys):
    uri, _, _ = zero3_run
    out = tmp_path / "never"
    assert cli.main(["export", "0123456789abcdef0123456789abcdef", "--out", str(out), f"tracking.uri={uri}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("orchestrator export: error: RUN_OR_TRIAL:") and "0123456789abcdef" in err[-1]
    assert not out.exists()


def test_export_from_a_missing_checkpoint_creates_nothing(zero3_run, tmp_path, capsys):
    """--checkpoint that names nothing: exit 2 naming it, and not even the parents of --out exist."""
    uri, run_id, _ = zero3_run
    out = tmp_path / "new" / "deeper" / "exported"
    missing = tmp_path / "no-such-checkpoint"
    code = cli.main(["export", run_id, "--out", str(out), "--checkpoint", str(missing), f"tracking.uri={uri}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("orchestrator export: error: ") and "no-such-checkpoint" in err[-1], err
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "shard", ["zero_pp_rank_1_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
)
def test_a_planted_pickle_stops_export_and_a_resume_naming_the_file(zero3_run, tmp_path, capsys, shard):
    uri, run_id, _ = zero3_run
    runs = tmp_path / "runs"
    folder = Store(uri).get_run(run_id).tags[run_tags.CHECKPOINTS_TAG]  # <storage_path>/zero3
    shutil.copytree(storage.local_path(folder).parent, runs)
    last = sorted(p for p in (runs / "zero3").glob("checkpoint_*") if p.is_dir())[-1] / storage.CHECKPOINT_TAG / shard
    marker = tmp_path / "ran"
    plant(last, marker, legacy=shard.endswith("optim_states.pt"))

    out = tmp_path / "exported"
    code = cli.main(
        ["export", run_id, "--out", str(out), "--checkpoint", str(last.parent.parent), f"tracking.uri={uri}"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("orchestrator export: error: --checkpoint: ") and shard in err[-1], err
    assert not out.exists() and not marker.exists()

    code = cli.main(["train", str(TINY), *zero3_overrides(uri, runs)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("orchestrator train: error: train.storage_path: ") and shard in err[-1], err
    assert not marker.exists()
    assert Store(uri).get_run(run_id).status == "FINISHED", "the run was not re-opened"
