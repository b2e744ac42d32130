"""Your tokenizer, your data, your model: a BPE tokenizer trained by `prepare` drives a sweep, a
`datasets` dataset mixes with a files source, a transformers Llama trains through the same
trainer with document masking, and a workload of your own runs by import path."""

import numpy as np
import pytest
import torch
import yaml

from orchestrator.cli import main
from orchestrator.core import config, derived
from orchestrator.core.errors import ConfigError
from orchestrator.driver import launch, ray_session
from orchestrator.tracking.store import Store
from tests.conftest import ROOT, TINY, sqlite_store, varied_corpus, zero_stage
from tests.worker_here import train_here
from workloads import workload
from workloads.text import tokenizer
from workloads.text.packing import TokenDataset
from workloads.workload import MicroBatch

SMALL = [
    "model.n_layers=1",
    "model.d_model=32",
    "model.n_heads=2",
    "model.max_seq_len=32",
    "data.seq_len=32",
    "data.eval_fraction=0.1",
    "batch.tokens_per_update=128",
    "train.total_tokens=768",
    "train.report_every_tokens=128",
    "train.eval_every_tokens=384",
    "train.eval_tokens=256",
    "train.checkpoint_every_tokens=384",
    "schedule.warmup_tokens=0",
    "schedule.decay=constant",
    "optim.lr=0.02",
    "optim.grad_clip=0",
    "cluster.cpus_per_worker=0.5",
    "tracking.flush_every_s=0.2",
]


def small(tmp_path, corpus, *extra):
    return config.load(
        TINY,
        [
            *SMALL,
            f"data.sources=[{{name: varied, kind: files, path: '{corpus}', weight: 0.75}}, "
            "{name: sums, kind: arithmetic, weight: 0.25}]",
            f"tracking.uri={sqlite_store(tmp_path)}",
            f"train.storage_path={tmp_path}/runs",
            *extra,
        ],
    )


# ---------------------------------------------------------------- tokenizer


@pytest.mark.slow
def test_a_bpe_tokenizer_trained_by_prepare_drives_a_sweep(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the sweep writes its report to reports/bpe here
    out = tmp_path / "prepared"
    overrides = ["data.max_documents_per_source=300"]
    assert main(["prepare", str(TINY), *overrides, "--train-tokenizer", "1000", "--out", str(out)]) == 0
    tok = tokenizer.load(str(out / "tokenizer.json"))
    assert tok.vocab_size == 1000 and tok.eos_id is not None

    sweep = {
        "name": "bpe",
        "base": {
            "config": str(TINY),
            "overrides": {
                "data.max_documents_per_source": 300,
                "data.tokenizer": str(out / "tokenizer.json"),
                "data.shard_dir": str(out),
                "model.n_layers": 1,
                "model.d_model": 64,
                "model.max_seq_len": 64,
                "data.seq_len": 64,
                "cluster.cpus_per_worker": 0.4,
                "train.total_tokens": 8192,
                "train.report_every_tokens": 2048,
                "train.eval_every_tokens": 4096,
                "train.eval_tokens": 2048,
                "train.checkpoint_every_tokens": 8192,
                "schedule.warmup_tokens": 0,
            },
        },
        "space": {"batch.tokens_per_update": {"grid": [2048]}, "optim.lr": {"grid": [3e-3]}},
    }
    path = tmp_path / "bpe.yaml"
    path.write_text(yaml.safe_dump(sweep))
    uri = sqlite_store(tmp_path)
    assert main(["sweep", str(path), f"tracking.uri={uri}", f"train.storage_path={tmp_path}/runs"]) == 0
    (run,) = Store(uri).child_runs(Store(uri, "orchestrator").find_sweep_run("bpe"))
    assert run.params["model.vocab_size"] == "1000"  # followed the tokenizer
    # 64-token sequences of BPE tokens: the batch arithmetic and throughput count those
    tokens = Store(uri).metric_history(run.run_id, "train/tokens")
    assert [s for s, _ in tokens] == [2048 * (i + 1) for i in range(4)]
    assert Store(uri).metric_history(run.run_id, "perf/tokens_per_s")
    cfg = config.load(TINY, [f"{k}={v}" for k, v in sweep["base"]["overrides"].items()])
    batch = TokenDataset(cfg, "train").micro_batch(0, derived.batch_plan(cfg), 0, 0)
    ids = torch.cat([batch.inputs.flatten(), batch.targets.flatten()])
    assert ids.max() < 1000 and (ids >= 257).any(), "merged tokens, beyond the bytes"
    assert (batch.targets == tok.eos_id).any(), "documents end with the tokenizer's EOS"


def test_a_tokenizer_that_does_not_match_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="data.tokenizer.*no such file"):
        config.load(TINY, [f"data.tokenizer={tmp_path}/missing.json"])
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError, match="data.tokenizer.*not a Hugging Face tokenizer.json"):
        config.load(TINY, [f"data.tokenizer={bad}"])
    with pytest.raises(ConfigError, match="model.vocab_size.*has 257 tokens"):
        config.load(TINY, ["model.vocab_size=1000"])


# ---------------------------------------------------------------- datasets


def test_a_datasets_source_mixes_with_files_at_its_weight(tmp_path):
    import datasets

    hf_docs = [f"zebra {i} " + "quagga " * (i % 7) for i in range(300)]
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"body": hf_docs}),
            "validation": datasets.Dataset.from_dict({"body": ["okapi"] * 10}),
        }
    ).save_to_disk(str(tmp_path / "ds"))
    corpus = varied_corpus(tmp_path / "corpus")
    sources = (
        f"data.sources=[{{name: hub, kind: hf, path: '{tmp_path / 'ds'}', text_field: body, weight: 0.75}}, "
        f"{{name: files, kind: files, path: '{corpus}', weight: 0.25}}]"
    )
    cfg = config.load(
        TINY, [*SMALL, sources, "batch.tokens_per_update=1280", "train.total_tokens=2560"]
    )  # 40 sequences an update
    data = TokenDataset(cfg, "train")
    batch = data.micro_batch(0, derived.batch_plan(cfg), 0, 0)
    counts = np.bincount(batch.source_ids.numpy(), minlength=2)
    assert abs(counts[0] - 0.75 * counts.sum()) <= 1 and abs(counts[1] - 0.25 * counts.sum()) <= 1
    from workloads.text.corpus import decode

    text = decode(batch.inputs[batch.source_ids == 0].flatten())
    assert "zebra" in text and "okapi" not in text  # the train split, its text field

    with pytest.raises(ConfigError, match=r"data.sources.0.split.*train, validation"):
        TokenDataset(config.load(TINY, [*SMALL, sources.replace("weight: 0.75", "split: test, weight: 0.75")]))
    hub_name = sources.replace(str(tmp_path / "ds"), "wikitext/wikitext-2")
    with pytest.raises(ConfigError, match="data.sources.0.path.*nothing is downloaded"):
        TokenDataset(config.load(TINY, [*SMALL, hub_name]))


# ---------------------------------------------------------------- a transformers model

HF = ["model.name=hf", "model.hf.architecture=llama", "model.hf.extra={num_key_value_heads: 1}"]


def test_a_packed_sequence_loses_what_its_documents_lose_one_by_one():
    cfg = config.load(TINY, [*SMALL, *HF, "model.n_layers=2"])
    work = workload.build(cfg, derived.batch_plan(cfg), torch.device("cpu"))
    assert type(work.model).__name__ == "LlamaForCausalLM"
    lengths = [7, 12, 13]  # three documents packed into one sequence of 32
    g = torch.Generator().manual_seed(0)
    inputs, targets = torch.randint(0, 257, (1, 32), generator=g), torch.randint(0, 257, (1, 32), generator=g)
    doc_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    ones = torch.ones(1, 32)

    def summed(inp, tgt, pos, doc, mask):
        tensors = {"inputs": inp, "targets": tgt, "positions": pos, "doc_ids": doc, "loss_mask": mask}
        return work.summed_loss(work.model, MicroBatch(tensors, int(mask.sum()), mask.numel(), {}))[0].item()

    packed = summed(inputs, targets, positions, doc_ids, ones)
    alone, start = 0.0, 0
    for n in lengths:
        part = slice(start, start + n)
        alone += summed(inputs[:, part], targets[:, part], positions[:, part], doc_ids[:, part] * 0, ones[:, part])
        start += n
    assert abs(packed - alone) <= 1e-5 * abs(alone), (packed, alone)


@pytest.mark.slow
def test_a_llama_gives_one_curve_for_two_splits_at_zero_2_and_logs_the_noise_scale(tmp_path):
    """Two one-worker splits of the update, each trained by the worker's own function in this
    process (tests/worker_here.py; the Ray Train path of a llama is the export test's)."""
    corpus = varied_corpus(tmp_path / "corpus")
    curves = []
    for b, d, a in [(2, 1, 2), (1, 1, 4)]:
        cfg = small(
            tmp_path / f"b{b}d{d}a{a}",
            corpus,
            *HF,
            *zero_stage(2),
            f"batch.micro_batch_size={b}",
            f"cluster.num_workers={d}",
            f"batch.grad_accum_steps={a}",
            "train.run_name=llama",
        )
        run_id = train_here(cfg, tmp_path / f"b{b}d{d}a{a}" / "ray")
        curves.append(Store(cfg.tracking.uri).metric_history(run_id, "train/loss"))
        assert Store(cfg.tracking.uri).metric_history(run_id, "gns/b_simple"), "the noise scale is logged"
        assert Store(cfg.tracking.uri).get_run(run_id).params["model.name"] == "hf"
    (a, b) = curves
    assert [s for s, _ in a] == [s for s, _ in b] == [128 * i for i in range(6)]
    for (step, x), (_, y) in zip(a, b):
        assert abs(x - y) <= 1e-4 * abs(x), f"step {step}: {x} vs {y}"


@pytest.mark.slow
def test_an_exported_zero_3_llama_loads_in_transformers_with_the_run_s_eval_loss(ray_session, tmp_path):
    from transformers import AutoModelForCausalLM

    corpus = varied_corpus(tmp_path / "corpus")
    cfg = small(tmp_path, corpus, *HF, *zero_stage(3), "gns.enabled=false", "train.run_name=z3")
    assert launch.train(cfg) == 0
    run_id = launch.recorded_run_id(cfg.train.storage_path, "z3")
    out = tmp_path / "exported"
    assert main(["export", run_id, "--out", str(out), f"tracking.uri={cfg.tracking.uri}"]) == 0
    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    work = workload.build(cfg, derived.batch_plan(cfg), torch.device("cpu"))
    with torch.no_grad():
        losses = [work.summed_loss(model, mb) for mb in work.eval_batches(0, 1)]
    loss = sum(float(s) for s, _ in losses) / sum(float(n) for _, n in losses)
    last = Store(cfg.tracking.uri).metric_history(run_id, "eval/loss")[-1][1]
    assert abs(loss - last) <= 1e-5, (loss, last)
    # ... and model.init_from starts a new run from those weights
    again = small(tmp_path, corpus, *HF, f"model.init_from={out}")
    start = workload.build(again, derived.batch_plan(again), torch.device("cpu"))
    with torch.no_grad():
        losses = [start.summed_loss(start.model, mb) for mb in start.eval_batches(0, 1)]
    assert abs(sum(float(s) for s, _ in losses) / sum(float(n) for _, n in losses) - last) <= 1e-5


# ---------------------------------------------------------------- your own workload

USER = "tests.fixtures.user_workload"


@pytest.mark.parametrize(
    "name, says",
    [
        (f"{USER}:Trigram", "does not import (AttributeError"),
        ("tests.fixtures.nowhere:Bigram", "does not import (ModuleNotFoundError"),
        ("not a path", "valid: gpt, linreg, hf"),
        (f"{USER}:HalfDone", "lacks summed_loss, eval_batches of the Workload protocol"),
    ],
)
def test_a_wrong_path_or_a_broken_workload_is_exit_2(name, says, tmp_path, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("Ray must not start for bad input")

    monkeypatch.setattr(ray_session, "ray_init", never)
    code = main(["train", str(TINY), f"model.name={name}", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "model.name" in err[0] and says in err[0], err
    assert not (tmp_path / "mlflow.db").exists()


def test_the_documented_example_is_the_fixture():
    page, fixture = (ROOT / "docs/workloads.md").read_text(), (ROOT / "tests/fixtures/user_workload.py").read_text()
    body = fixture[fixture.index("class Bigram") : fixture.index("class HalfDone")].strip()
    assert body in page, "docs/workloads.md's example workload drifted from tests/fixtures/user_workload.py"
