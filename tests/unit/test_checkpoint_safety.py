"""Nothing in a checkpoint is unpickled but tensors, plain data and DeepSpeed's few types: a real
checkpoint of the worker's training function (`train_loop._train`, in this process, a real DeepSpeed
engine) resumes at every ZeRO stage with every load weights-only; a pickle planted in its model
states or its optimizer shard (zip and legacy formats) is refused naming the file, and the file
its unpickling would create never appears, even when the check before the load is skipped
(DeepSpeed's own `torch.load(weights_only=False)` is overridden too)."""

from __future__ import annotations

import shutil

import pytest

from orchestrator.core.errors import ConfigError
from tests.conftest import zero_stage
from tests.planted_pickle import plant
from tests.unit import test_trainer_in_process as in_process
from tests.unit.test_trainer_in_process import FakeRay, four_updates, train
from workloads.train import checkpoint

B = 16
uri = in_process.uri  # the module's MLflow store and process group


def checkpointed_run(uri, tmp_path, stage):
    """(config, MLflow run id, the checkpoint at 2 of 4 updates) of a linear regression at `stage`."""
    cfg = four_updates(uri, tmp_path, *zero_stage(stage), B=B)
    api = FakeRay(tmp_path / "first")
    run_id = train(cfg, api)
    return cfg, run_id, api.reports[0][1]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_checkpoint_resumes_weights_only_and_a_planted_pickle_is_refused(uri, tmp_path, stage):
    cfg, run_id, saved = checkpointed_run(uri, tmp_path, stage)
    files = sorted((saved / "state").glob("*.pt"))
    assert any("model_states" in f.name for f in files) and (stage == 0 or any("optim_states" in f.name for f in files))

    resumed = FakeRay(tmp_path / "again", resume_from=saved)
    train(cfg, resumed, run_id)  # every DeepSpeed load inside weights_only_loads()
    assert [m["tokens"] for m, _ in resumed.reports] == [4 * B]

    for legacy in (False, True):
        for target in files:
            poisoned = tmp_path / f"poisoned-{legacy}-{target.stem}"
            marker = tmp_path / f"ran-{legacy}-{target.stem}"
            shutil.copytree(saved, poisoned)
            plant(poisoned / "state" / target.name, marker, legacy=legacy)
            with pytest.raises(ConfigError) as refused:
                train(cfg, FakeRay(tmp_path / f"never-{legacy}-{target.stem}", resume_from=poisoned), run_id)
            assert str(poisoned / "state" / target.name) in str(refused.value)
            assert "io.open" in str(refused.value) and "\n" not in str(refused.value)
            assert not marker.exists()


@pytest.mark.parametrize("stage", [0, 3])
def test_deepspeeds_own_load_is_weights_only_when_the_check_is_skipped(uri, tmp_path, stage, monkeypatch):
    """The file could change between the check and the load (shared storage): the load refuses it too."""
    cfg, run_id, saved = checkpointed_run(uri, tmp_path, stage)
    marker = tmp_path / "ran"
    for target in (saved / "state").glob("*.pt"):
        plant(target, marker)
    monkeypatch.setattr(checkpoint, "check_files", lambda folder, key: None)
    with pytest.raises(Exception, match="Weights only load failed"):
        train(cfg, FakeRay(tmp_path / "never", resume_from=saved), run_id)
    assert not marker.exists()
