"""The trainer end to end on Ray Train + DeepSpeed (CPU, gloo): decomposition invariance over
splits and ZeRO stages, the naive mean as a negative control, resume after a fault.

The one-worker splits (the reference, D = 1 with accumulation, the naive mean) run their worker's
training function in this process (tests/worker_here.py): a worker trains the same whichever
process runs it, and the fault test runs the reference's split on Ray Train against it; the
splits over two workers and the ZeRO stages run on Ray Train."""

import copy
import time

import pytest

from orchestrator.core import config, derived
from orchestrator.driver import launch, run_life
from orchestrator.tracking import run_tags
from orchestrator.tracking.store import Store
from tests.conftest import TINY, run_main, sqlite_store, varied_corpus
from tests.worker_here import train_here

pytestmark = pytest.mark.slow
UPDATES = 6


def small_overrides(tmp_path, corpus, *extra):
    """1-layer model, S=32, 4 sequences per update, token budget of UPDATES updates."""
    return [
        "model.n_layers=1",
        "model.d_model=32",
        "model.n_heads=2",
        "model.max_seq_len=32",
        "data.seq_len=32",
        f"data.sources=[{{name: varied, kind: files, path: '{corpus}', weight: 0.75}}, "
        "{name: sums, kind: arithmetic, weight: 0.25}]",
        "data.eval_fraction=0.1",
        "batch.tokens_per_update=128",
        f"train.total_tokens={128 * UPDATES}",
        "train.report_every_tokens=128",
        "train.eval_every_tokens=384",
        "train.eval_tokens=256",
        "train.checkpoint_every_tokens=256",
        "schedule.warmup_tokens=0",
        "schedule.decay=constant",
        "optim.lr=0.02",
        "optim.grad_clip=0",
        "gns.enabled=false",
        "cluster.cpus_per_worker=0.5",
        f"tracking.uri={sqlite_store(tmp_path)}",
        "tracking.flush_every_s=0.2",
        f"train.storage_path={tmp_path}/runs",
        *extra,
    ]


def small_config(tmp_path, corpus, *extra):
    return config.load(TINY, small_overrides(tmp_path, corpus, *extra))


def train_curve(cfg):
    assert launch.train(cfg) == 0
    run_id = launch.recorded_run_id(cfg.train.storage_path, cfg.train.run_name)
    return run_id, Store(cfg.tracking.uri).metric_history(run_id, "train/loss")


def train_curve_here(cfg, folder):
    """A one-worker run's worker in this process (module docstring)."""
    run_id = train_here(cfg, folder)
    return run_id, Store(cfg.tracking.uri).metric_history(run_id, "train/loss")


def assert_same_curve(a, b, rel=1e-4):
    assert [s for s, _ in a] == [s for s, _ in b]
    for (step, x), (_, y) in zip(a, b):
        assert abs(x - y) <= rel * abs(x), f"step {step}: {x} vs {y}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return varied_corpus(tmp_path_factory.mktemp("corpus"))


# (micro-batch size b, workers D, accumulation steps A, ZeRO stage): 4 sequences per update each.
REFERENCE = (4, 1, 1, 0)
SPLITS = [(2, 1, 2, 0), (1, 1, 4, 0), (2, 2, 1, 1), (1, 2, 2, 0), (1, 2, 2, 2), (1, 2, 2, 3)]


def split_config(tmp_path, corpus, split, *extra):
    b, d, a, stage = split
    return small_config(
        tmp_path,
        corpus,
        f"batch.micro_batch_size={b}",
        f"cluster.num_workers={d}",
        f"batch.grad_accum_steps={a}",
        f"deepspeed.zero_stage={stage}",
        *extra,
    )


@pytest.fixture(scope="module")
def reference_run(corpus, tmp_path_factory):
    """(config, MLflow run id, train/loss curve) of the split (4, 1, 1) at ZeRO 0."""
    tmp = tmp_path_factory.mktemp("reference")
    cfg = split_config(tmp, corpus, REFERENCE, "train.run_name=ref")
    return (cfg, *train_curve_here(cfg, tmp / "ray"))


@pytest.fixture(scope="module")
def reference(reference_run):
    return reference_run[2]


def source_shares(cfg, run_id):
    return Store(cfg.tracking.uri).metric_history(run_id, "data/share/sums")


def test_reference_curve_is_complete_and_micro_batches_differ(reference, corpus):
    assert [s for s, _ in reference] == [128 * i for i in range(UPDATES)], "each update at the tokens before it"
    # The premise of the test: micro-batches hold different numbers of real tokens.
    from workloads.text.packing import TokenDataset

    cfg = small_config(corpus.parent, corpus, "batch.micro_batch_size=1", "batch.grad_accum_steps=4")
    plan = derived.batch_plan(cfg)
    counts = {TokenDataset(cfg).micro_batch(0, plan, 0, a).real_tokens for a in range(4)}
    assert len(counts) > 1, counts


@pytest.mark.parametrize("split", SPLITS, ids=[f"b{b}-D{d}-A{a}-zero{z}" for b, d, a, z in SPLITS])
def test_decomposition_invariance(ray_session, reference_run, corpus, tmp_path, split):
    """Every split of the update over micro-batches, workers and accumulation steps, and every ZeRO
    stage (1 on the split without accumulation, 2 and 3 on the one with both), gives the
    reference's curve and logs the same mixture of sources."""
    cfg = split_config(tmp_path, corpus, split, "train.run_name=split")
    run_id, curve = train_curve(cfg) if cfg.cluster.num_workers > 1 else train_curve_here(cfg, tmp_path / "ray")
    assert_same_curve(reference_run[2], curve)
    # The logged mixture is the whole update's, whichever worker logs it.
    shares, expected = source_shares(cfg, run_id), source_shares(reference_run[0], reference_run[1])
    assert len(expected) == UPDATES and len({v for _, v in expected}) > 1, "shares vary between updates"
    assert [s for s, _ in shares] == [s for s, _ in expected]
    assert [v for _, v in shares] == pytest.approx([v for _, v in expected], rel=1e-9)


def test_naive_micro_batch_mean_fails_the_invariance(reference, corpus, tmp_path):
    """Negative control: the per-micro-batch mean is not invariant, and the test can tell."""
    cfg = split_config(tmp_path, corpus, (1, 1, 4, 0), "train.loss_normalization=micro_batch", "train.run_name=naive")
    _, curve = train_curve_here(cfg, tmp_path / "ray")
    with pytest.raises(AssertionError):
        assert_same_curve(reference, curve)


@pytest.fixture(scope="module")
def faulty_run(ray_session, corpus, tmp_path_factory):
    """(config, MLflow run id, train/loss curve) of the reference's split on Ray Train, failing
    once at 640 tokens, after its second checkpoint (256, 512 tokens) with steps logged past it."""
    tmp = tmp_path_factory.mktemp("faulty")
    cfg = split_config(tmp, corpus, REFERENCE, "train.run_name=faulty")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORCHESTRATOR_FAULT_AT_TOKENS", str(128 * 5))
        run_id, curve = train_curve(cfg)
    assert (tmp / "runs" / "faulty" / ".fault_injected").exists(), "the fault never fired"
    return cfg, run_id, curve


def test_resume_after_fault_matches_unbroken_run(faulty_run, reference):
    """Ray Train restarts the worker group from the checkpoint: the reference's curve (the same
    split, trained in this process), each step once."""
    cfg, run_id, curve = faulty_run
    assert_same_curve(reference, curve)
    for key, first in (("train/loss", 0), ("train/lr", 0), ("train/tokens", 128)):  # before / after the update
        steps = [s for s, _ in Store(cfg.tracking.uri).metric_history(run_id, key)]
        assert steps == [first + 128 * i for i in range(UPDATES)], (key, steps)


def test_rerunning_a_finished_run_trains_nothing_and_starts_no_ray(faulty_run, monkeypatch, capsys):
    """A finished run (the faulty one, resumed to its end) re-run under its name with the same
    config is found by its record and starts nothing; under that name with another config (a
    longer budget) it would resume from its checkpoint instead."""
    from orchestrator.driver import ray_session

    cfg, run_id, first = faulty_run

    def started(*args, **kwargs):
        raise AssertionError("a finished run started Ray again")

    monkeypatch.setattr(ray_session, "ray_init", started)
    monkeypatch.setattr(run_life, "build_trainer", started)
    capsys.readouterr()
    assert launch.train(copy.deepcopy(cfg)) == 0
    out = capsys.readouterr().out
    assert "run 'faulty' finished already with this config: final eval loss" in out and run_id in out, out
    assert Store(cfg.tracking.uri).metric_history(run_id, "train/loss") == first
    longer = copy.deepcopy(cfg)
    longer.train.total_tokens *= 2
    record = launch.run_record(cfg.train.storage_path, "faulty")
    assert launch.finished_already(longer, record, run_life.config_digest(longer)) is None
    assert launch.finished_already(cfg, record, run_life.config_digest(cfg)).run_id == run_id


def test_a_diverging_run_fails_with_its_reason_and_shows_its_worker_s_warning(
    ray_session, corpus, tmp_path, monkeypatch, capsys
):
    """lr 1e30 diverges at the first update: the run ends FAILED with the reason, and nothing
    non-finite is logged. The run also asks for B_simple (gns.enabled) with a given
    batch.grad_accum_steps=1 and one worker, which leaves no small batch to measure it with: rank 0
    warns in its Ray worker (whose output is not forwarded), and `orchestrator train` (in this
    process, the driver) still shows it, as it records it on the run."""
    monkeypatch.chdir(tmp_path)
    overrides = small_overrides(tmp_path, corpus, "optim.lr=1e30", "batch.micro_batch_size=4")
    extra = ["batch.grad_accum_steps=1", "gns.enabled=true", "train.run_name=nan"]
    code, out, err = run_main(capsys, "train", TINY, *overrides, *extra)
    assert code == 1, err[-3000:]
    uri = sqlite_store(tmp_path)
    run = Store(uri).get_run(launch.recorded_run_id(tmp_path / "runs", "nan"))
    assert run.status == "FAILED"
    assert "non-finite loss" in run.tags[run_tags.FAILURE_TAG]
    for key in ("train/loss", "eval/loss"):
        assert all(v == v and abs(v) != float("inf") for _, v in Store(uri).metric_history(run.run_id, key))
    message = "batch.grad_accum_steps=1 is given and D x A = 1, so there is no small batch to compare with"
    assert message in out + err
    assert [m for m in Store(uri).run_warnings(run.run_id).values() if message in m]


def test_tiny_config_through_the_cli(ray_session, tmp_path, monkeypatch, capsys):
    """The shipped tiny config: under 2 minutes here, and its eval loss clearly falls. The command
    runs in this process, on the tests' Ray (a command's own Ray start is test_sweep's)."""
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    code, out, err = run_main(
        capsys,
        "train",
        TINY,
        f"tracking.uri={sqlite_store(tmp_path)}",
        f"train.storage_path={tmp_path}/runs",
        "train.run_name=tiny",
    )
    elapsed = time.monotonic() - started
    assert code == 0, err[-3000:]
    assert "finished" in out and "workflowType=machine_learning" in out
    run_id = launch.recorded_run_id(tmp_path / "runs", "tiny")
    evals = Store(sqlite_store(tmp_path)).metric_history(run_id, "eval/loss")
    assert evals[0][0] == 0 and abs(evals[0][1] - 5.55) < 0.3, evals  # starts at ln(257)
    assert evals[-1][1] < 0.6 * evals[0][1], evals
    print(f"tiny train took {elapsed:.0f} s")  # the 2-minute goal is a benchmark, not an assertion


def test_a_train_stopped_by_sigterm_ends_its_run_killed_in_one_line(corpus, tmp_path):
    """A scheduler's stop (SIGTERM) mid-training: the command closes its MLflow run KILLED with the
    reason (it stayed RUNNING, with a Ray C++ stack dump on stderr) and says how to resume."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    overrides = small_overrides(tmp_path, corpus, "train.run_name=stopped", f"train.total_tokens={128 * 100_000}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "train", str(TINY), *overrides],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    training = threading.Event()
    out = []

    def read():
        for line in proc.stdout:
            out.append(line)
            if line.startswith("run 'stopped': MLflow run"):  # the run is open: the workers start
                training.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert training.wait(240), "".join(out)[-3000:]
        time.sleep(3)  # into the training
        proc.send_signal(signal.SIGTERM)
        err = proc.stderr.read()
        code = proc.wait(120)
    finally:
        proc.kill()
    reader.join(10)
    assert code == 143, err[-3000:]
    assert "stopped by SIGTERM" in err and "--resume" in err
    assert "SIGTERM received" not in err and "*** " not in err, err[-3000:]  # no C++ stack dump
    run = Store(sqlite_store(tmp_path)).get_run(launch.recorded_run_id(tmp_path / "runs", "stopped"))
    assert run.status == "KILLED" and run.tags[run_tags.FAILURE_TAG] == "stopped by SIGTERM"
