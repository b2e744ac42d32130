"""`orchestrator sweep SWEEP --dry-run` through the real command line, in a process where importing
Ray or MLflow fails: every trial with its cost, the totals and the ETA; no file written anywhere,
no corpus read (no token cache), exit 0; bad options exit 2 with one line."""

import os
import subprocess
import sys

import pytest
import yaml

from orchestrator.core import derived
from orchestrator.formulas import cost
from orchestrator.studies import kinds, search_space
from tests.conftest import ROOT, run_cli, run_main

DEMO = ROOT / "conf" / "sweep" / "demo.yaml"
CLUSTER = ROOT / "conf" / "sweep" / "gpt-350m-cluster.yaml"
NO_RAY = (
    "import sys\n"
    "sys.modules['ray'] = None\n"  # any import of them now fails
    "sys.modules['mlflow'] = None\n"
    "from orchestrator import cli\n"
    "code = cli.main(sys.argv[1:])\n"
    "assert 'workloads.text.packing' not in sys.modules, 'read a corpus'\n"
    "assert 'workloads.text.corpus' not in sys.modules, 'read a corpus'\n"
    "sys.exit(code)\n"
)


@pytest.fixture
def dry_run(tmp_path):
    """Run `orchestrator sweep ... --dry-run` from an empty working directory with an empty token
    cache; check that neither gains a file; (stdout, stderr)."""
    cwd, cache = tmp_path / "cwd", tmp_path / "cache"
    cwd.mkdir()
    cache.mkdir()

    def run(*args, expect=0):
        env = {**os.environ, "ORCHESTRATOR_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
        env.pop("RAY_ADDRESS", None)
        proc = subprocess.run(
            [sys.executable, "-c", NO_RAY, "sweep", *map(str, args), "--dry-run"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert list(cwd.rglob("*")) == [] and list(cache.rglob("*")) == []
        return proc.stdout, proc.stderr

    return run


def expected_eta(path, use_gpu):
    """What cost.py computes for the sweep's trials: its own tokens, FLOPs per token and devices."""
    from workloads import workload

    sweep = kinds.load(path)
    trials, _ = search_space.split_feasible(sweep, kinds.expand(sweep))
    walls = []
    for t in trials:
        c = t.cfg.cluster
        devices = c.num_workers * (c.gpus_per_worker if use_gpu else max(1, int(c.cpus_per_worker)))
        rate = cost.throughput(use_gpu)
        walls.append(
            cost.trial_cost(derived.rounded_budget(t.cfg), workload.costs(t.cfg).flops_per_token, devices, 1, rate)
        )
    return trials, cost.makespan([w.wall_s for w in walls], sweep.search.max_concurrent)


def test_demo(dry_run):
    out, err = dry_run(DEMO)
    trials, eta = expected_eta(DEMO, use_gpu=False)
    assert len(trials) == 24  # the bracket's first round: 3 lrs x 4 batch sizes x 2 seeds
    for t in trials:
        assert t.name in out
    assert "effective 63.2 GFLOP/s per CPU thread, measured with tiny.yaml" in out
    assert "start-up 15 s per trial" in out
    assert "first round total: 24 trials, 2.17e13 FLOPs" in out and "CPU-hours" in out
    (eta_line,) = [line for line in out.splitlines() if line.startswith("first round ETA: ")]
    assert f"{cost.format_duration(eta)} ({eta:,.0f} s) with 2 trials at a time" in eta_line
    assert "cost range: 24 .. 32 trials" in out  # search.max_lrs_per_batch 4 bounds the later rounds
    assert "Traceback" not in err


def test_gpt_350m_cluster(dry_run):
    out, _ = dry_run(CLUSTER)
    trials, eta = expected_eta(CLUSTER, use_gpu=True)
    assert len(trials) == 30
    for t in trials:
        assert t.name in out
    assert "MFU 40% of 989 TFLOP/s per GPU" in out and "start-up 60 s per trial" in out
    row = next(line for line in out.splitlines() if line.startswith(trials[0].name))
    # B=256Ki: b 8, A 2, D 8, 12,800 steps, 8.11e18 FLOPs, 15.7 GiB per worker (14.5 and, with
    # gns.adam, the whole fp32 copy of Adam's preconditioner a worker assembles, 4 bytes per
    # parameter), 43m 43s, 5.83 GPU-hours
    assert row.split()[-10:] == ["8", "2", "8", "12,800", "8.11e18", "15.7", "GiB", "43m", "43s", "5.83"]
    assert "total: 30 trials, 2.43e20 FLOPs, 174.9 GPU-hours" in out
    (eta_line,) = [line for line in out.splitlines() if line.startswith("ETA: ")]
    assert f"({eta:,.0f} s) with 4 trials at a time (search.max_concurrent; up to 32 GPUs at once)" in eta_line
    assert "ASHA stops some trials early" in eta_line


def test_auto_micro_batch_from_the_memory_model(dry_run):
    out, _ = dry_run(DEMO, "batch.micro_batch_size=auto", "--device-memory", "2GiB")
    lines = out.splitlines()
    b2k = next(line for line in lines if line.startswith("B=2Ki lr=5e-4 wu=2.5% seed=0"))
    # half the update (32 sequences) in a micro-batch: it would fit 2 GiB whole, but gns.enabled
    # splits every update in at least two micro-batches to measure B_simple
    assert b2k.split()[6:9] == ["16*", "2", "1"]
    assert "* batch.micro_batch_size auto: the memory model's largest b for 2.0 GiB per worker" in out
    _, eta = expected_eta(DEMO, use_gpu=False)  # b does not change the FLOPs, so not the ETA either
    assert f"({eta:,.0f} s)" in out


def test_optuna_shows_space_trials_and_cost_range(dry_run, tmp_path):
    sweep = tmp_path / "optuna.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "opt",
                "base": {"config": str(ROOT / "conf" / "train" / "tiny.yaml")},
                "space": {
                    "batch.tokens_per_update": {"choice": [1024, 2048, 8192]},
                    "model.d_model": {"choice": [64, 128]},
                    "optim.lr": {"loguniform": [1e-4, 1e-2]},
                },
                "search": {"algorithm": "optuna", "num_samples": 6, "max_concurrent": 2},
            }
        )
    )
    out, _ = dry_run(sweep)
    assert "Optuna search, 6 trials (search.num_samples), 2 at a time" in out
    assert "  batch.tokens_per_update  choice [1024, 2048, 8192]" in out
    assert "  optim.lr                 loguniform [0.0001, 0.01]" in out
    assert "corners of the keys that change cost (batch.tokens_per_update, model.d_model;" in out
    (per_trial,) = [line for line in out.splitlines() if line.startswith("per trial: ")]
    (total,) = [line for line in out.splitlines() if line.startswith("total (6 trials): ")]
    (eta,) = [line for line in out.splitlines() if line.startswith("ETA: ")]
    low, high = [float(x) for x in per_trial.split()[2:5:2]]  # "per trial: LOW .. HIGH FLOPs"
    assert low < high  # d_model 64 costs less than 128
    assert [float(x) for x in total.split()[3:6:2]] == pytest.approx([6 * low, 6 * high], rel=1e-2)
    assert " .. " in eta and "with 2 trials at a time" in eta


def test_bad_mfu_exits_2_with_one_line(tmp_path):
    code, out, err = run_cli("sweep", DEMO, "--dry-run", "--mfu", "1.5", cwd=tmp_path)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "orchestrator sweep: error: --mfu: got 1.5; must be in (0, 1], e.g. 0.4 for 40% of the peak"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args,message",
    [
        (["--dry-run", "--mfu", "0"], "--mfu: got 0"),
        (["--dry-run", "--startup-s", "-1"], "--startup-s: got -1"),
        (["--dry-run", "--device-memory", "lots"], "--device-memory: got 'lots'"),
        (["--mfu", "0.3"], "--mfu only with --dry-run"),
        (["--dry-run", "--resume"], "--resume and --dry-run"),
    ],
)
def test_bad_options_in_process(args, message, capsys):
    code, _, err = run_main(capsys, "sweep", DEMO, *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_bracket_shows_its_first_round_and_its_bound(dry_run, tmp_path):
    sweep = tmp_path / "bracket.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "bk",
                "base": {"config": str(ROOT / "conf" / "train" / "tiny.yaml")},
                "space": {"batch.tokens_per_update": {"grid": [1024, 2048, 4096]}, "optim.lr": {"grid": [1e-3, 3e-3]}},
                "search": {"algorithm": "bracket", "max_lrs_per_batch": 5, "max_concurrent": 2},
            }
        )
    )
    out, _ = dry_run(sweep)
    lines = out.splitlines()
    assert lines[0] == (
        "sweep 'bk': bracket search of the learning rate per batch size, criterion final_loss (search.criterion), "
        "step 2; first round 6 trials, at most 15 (search.max_lrs_per_batch 5 x 3 batch sizes x 1 group x 1 seed); "
        "nothing started"
    )
    first = kinds.expand(kinds.load(sweep))
    assert len(first) == 6 and all(t.name in out for t in first)
    assert any(line.startswith("first round total: 6 trials") for line in lines)
    (span,) = [line for line in lines if line.startswith("cost range: ")]
    assert span.startswith("cost range: 6 .. 15 trials, ")
    low, high = [float(x) for x in span.split()[6:9:2]]  # "..., LOW .. HIGH FLOPs"
    assert high == pytest.approx(low * 15 / 6, rel=1e-2)  # an lr changes no cost: 5 lrs per batch size, not 2
    assert "with 2 trials at a time" in span


def test_a_ladders_first_round_is_listed_as_a_grids_is(capsys):
    """conf/sweep/ladder.yaml's first round has 216 trials: listed as a grid's are (the first 55, a
    line counting the rest, the last 5; --all lists every one), not all 216 (the README says so)."""
    from orchestrator.driver import dry_run

    ladder = ROOT / "conf" / "sweep" / "ladder.yaml"
    code, out, _ = run_main(capsys, "sweep", ladder, "--dry-run")
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("d_model=")]
    assert len(rows) == dry_run.LISTED
    assert "... 156 trials more, counted in the totals below (--all lists every one)" in out
    assert "first round total: 216 trials" in out
    code, out, _ = run_main(capsys, "sweep", ladder, "--dry-run", "--all")
    assert code == 0 and len([line for line in out.splitlines() if line.startswith("d_model=")]) == 216
