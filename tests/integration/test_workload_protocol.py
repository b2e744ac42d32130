"""Workloads behind one protocol: docs/workloads.md's example workload (tests/fixtures/user_workload.py)
validates under a short name registered here and trains end to end by its import path through
`orchestrator.driver.launch.train`, like the built-in `gpt` and `linreg`."""

import subprocess
import sys

import pytest
import torch

from orchestrator.core import config, derived, workload_paths
from orchestrator.core.errors import ConfigError
from orchestrator.driver import launch
from orchestrator.tracking.store import Store
from tests.conftest import ROOT, TINY, sqlite_store, varied_corpus
from tests.fixtures import user_workload
from workloads.workload import GPTWorkload, LinRegWorkload, Workload, build

UPDATES = 8


Bigram = workload_paths.register("bigram")(user_workload.Bigram)  # docs/workloads.md's example, given a short name


def bigram_config(tmp_path, *extra):
    corpus = varied_corpus(tmp_path / "corpus")
    return config.load(
        TINY,
        [
            "model.name=bigram",
            "model.d_model=16",
            "model.max_seq_len=32",
            "data.seq_len=32",
            f"data.sources=[{{name: varied, kind: files, path: '{corpus}', weight: 1}}]",
            "data.eval_fraction=0.1",
            "batch.tokens_per_update=128",
            "batch.micro_batch_size=2",
            f"train.total_tokens={128 * UPDATES}",
            "train.report_every_tokens=128",
            "train.eval_every_tokens=512",
            "train.eval_tokens=256",
            f"train.checkpoint_every_tokens={128 * UPDATES}",
            "schedule.warmup_tokens=0",
            "schedule.decay=constant",
            "optim.lr=0.05",
            "gns.enabled=false",
            "cluster.cpus_per_worker=0.5",
            "train.run_name=bigram",
            f"tracking.uri={sqlite_store(tmp_path)}",
            "tracking.flush_every_s=0.2",
            f"train.storage_path={tmp_path}/runs",
            *extra,
        ],
    )


def test_registered_names_are_what_validation_accepts(tmp_path):
    assert {"gpt", "linreg", "bigram"} <= set(workload_paths.names())
    assert workload_paths.factory("gpt") is GPTWorkload and workload_paths.factory("linreg") is LinRegWorkload
    assert bigram_config(tmp_path).model.name == "bigram"
    with pytest.raises(ConfigError, match="model.name.*bigram") as err:
        config.load(TINY, ["model.name=trigram"])
    assert "gpt" in str(err.value) and "linreg" in str(err.value)


def test_build_returns_a_workload_and_names_what_a_broken_one_lacks(tmp_path, monkeypatch):
    cfg = bigram_config(tmp_path)
    work = build(cfg, derived.batch_plan(cfg), torch.device("cpu"))
    assert isinstance(work, Bigram) and isinstance(work, Workload)
    mb = work.micro_batch(0, derived.batch_plan(cfg), 0, 0)
    summed, count = work.summed_loss(work.model, mb)
    assert count == mb.real_tokens > 0 and summed.item() > 0

    monkeypatch.setattr(workload_paths, "_entries", dict(workload_paths._entries))  # forget "empty" afterwards
    workload_paths.register("empty", lambda cfg, plan, device: object())
    with pytest.raises(
        TypeError,
        match="'empty' lacks model, flops_per_token, source_names, param_groups, "
        "micro_batch, summed_loss, eval_batches of the Workload protocol",
    ):
        build(config.load(TINY, ["model.name=empty"]), derived.batch_plan(cfg), torch.device("cpu"))

    class OldSignature(Bigram):  # written before batch ramps: examples indexed by update
        def micro_batch(self, update, rank, accum_step):
            return super().micro_batch(update * self.plan.sequences_per_update, self.plan, rank, accum_step)

    workload_paths.register("old", OldSignature)
    with pytest.raises(TypeError, match=r"micro_batch\(update, rank, accum_step\) is the old signature; it is now"):
        build(config.load(TINY, ["model.name=old"]), derived.batch_plan(cfg), torch.device("cpu"))
    with pytest.raises(ValueError, match="'bigram' is already registered as tests.fixtures.user_workload:Bigram"):
        workload_paths.register("bigram", lambda cfg, plan, device: object())


def test_the_driver_runs_a_workloads_own_preflight_else_builds_it_once(tmp_path, monkeypatch):
    """run_life.preflight asks the workload: a static `preflight(cfg, plan)` on its factory is
    the check (its ConfigError the one line; the workload is not built), and one without is built
    once on the CPU, a failure there a ConfigError naming model.name."""
    from orchestrator.driver import run_life

    monkeypatch.setattr(workload_paths, "_entries", dict(workload_paths._entries))
    built = []

    class Checked(Bigram):
        def __init__(self, cfg, plan, device):
            built.append(cfg.model.name)
            super().__init__(cfg, plan, device)

        @staticmethod
        def preflight(cfg, plan):
            if plan.tokens_per_update > 64:
                raise ConfigError("batch.tokens_per_update", f"got {plan.tokens_per_update}; this corpus takes 64")

    class Broken(Bigram):
        def __init__(self, cfg, plan, device):
            built.append(cfg.model.name)
            raise RuntimeError("no such vocabulary")

    workload_paths.register("checked", Checked)
    workload_paths.register("broken", Broken)
    with pytest.raises(ConfigError, match="batch.tokens_per_update: got 128; this corpus takes 64"):
        run_life.preflight(bigram_config(tmp_path, "model.name=checked"))
    run_life.preflight(bigram_config(tmp_path, "model.name=checked", "batch.tokens_per_update=64"))
    assert built == [], "a workload with its own preflight is not built by the driver"
    run_life.preflight(bigram_config(tmp_path))
    assert built == []  # Bigram has no preflight of its own: built, but not through these classes
    with pytest.raises(ConfigError, match="model.name: got 'broken'; no such vocabulary"):
        run_life.preflight(bigram_config(tmp_path, "model.name=broken"))
    assert built == ["broken"]


@pytest.mark.parametrize(
    "code",
    [
        # the model file stands alone, like nanoGPT's
        "import sys, workloads.builtin.gpt; assert not [m for m in sys.modules if m.startswith('orchestrator')]",
        # the schema, its validation and the workload names need no torch
        "import sys, orchestrator.core.config, orchestrator.core.validation, workloads.registry as r; "
        "assert 'torch' not in sys.modules and r.names() == ('gpt', 'linreg', 'hf')",
    ],
    ids=["model-without-orchestrator", "config-without-torch"],
)
def test_imports_stay_light(code):
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.slow
def test_a_workload_of_your_own_trains_end_to_end_by_import_path(ray_session, tmp_path):
    path = "tests.fixtures.user_workload:Bigram"
    cfg = bigram_config(tmp_path, "batch.grad_accum_steps=2", f"model.name={path}")
    assert launch.train(cfg) == 0  # the Ray worker imported it from the path in its config
    uri, run_id = cfg.tracking.uri, launch.recorded_run_id(cfg.train.storage_path, "bigram")
    run = Store(uri).get_run(run_id)
    assert run.status == "FINISHED" and run.params["model.name"] == path
    loss = Store(uri).metric_history(run_id, "train/loss")
    assert [s for s, _ in loss] == [128 * i for i in range(UPDATES)]
    assert loss[-1][1] < loss[0][1] - 1.0, loss  # from about ln 257 towards the corpus's bigram entropy
    assert Store(uri).metric_history(run_id, "eval/loss")
    # The weights the workers trained and checkpointed are the bigram's, not a GPT's.
    states = sorted((tmp_path / "runs").rglob("mp_rank_00_model_states.pt"))
    assert states, list((tmp_path / "runs").rglob("*"))
    module = torch.load(states[-1], map_location="cpu", weights_only=False)["module"]
    assert set(module) == {"0.weight", "1.weight", "1.bias"}
