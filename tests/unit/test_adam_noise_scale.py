"""gns/b_simple_adam, the noise scale of the gradient as AdamW preconditions it, measured by the
real trainer (train_loop._train with a DeepSpeed engine, as in test_trainer_in_process.py)
against a brute-force computation from per-example gradients.

The brute force is independent of the trainer's code path: a plain torch AdamW copy of the model
on the same examples gives the weights and the second moment v before every update; the
per-example gradients x (x.w - y) at those weights (float64) give every micro-batch's mean and the
update's mean; P = 1 / (sqrt(v / (1 - beta2^t)) + eps) from the copy's state; the two
equations of McCandlish et al. on |P g|^2 written out here; the trainer's EMA (NoiseScaleEMA,
tested on its own in test_noise.py) over them. The trainer gets the same numbers from hooks on
local gradients, v where DeepSpeed keeps it (whole at ZeRO 0; flat partitions at ZeRO 2, split
between two workers) and the reduced gradient where it lives: agreement to 1e-4 pins all of it.

Cases: one worker accumulating A = 4 micro-batches at ZeRO 0 and 2 (forced through
deepspeed.extra) and 3, in this process; and two workers (two processes, a gloo group, no Ray)
without accumulation (A = 1) at ZeRO 0 and 2 and with it (A = 2) at ZeRO 2, with d = 9, so that
the weight vector straddles the two workers' partitions.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

from orchestrator.core import config, derived
from orchestrator.formulas import noise
from orchestrator.tracking.store import Store
from tests.conftest import ROOT, zero_stage
from tests.unit import test_trainer_in_process as in_process
from tests.unit.test_trainer_in_process import EXPERIMENT, FakeRay, history, linreg, train
from workloads import workload as workloads
from workloads.builtin.linreg import LinRegData
from workloads.train import train_loop
from workloads.train.handoff import FaultInjection, WorkerPayload

uri = in_process.uri  # the fixture: one MLflow store and a process group of one for the module

UPDATES = 24
B = 64  # examples per update
EMA_TOKENS = 4 * B  # a few updates' worth: every logged value averages several
KEYS = ("g_squared", "trace_sigma", "b_simple")


def run_config(uri, tmp_path, stage: int, workers: int, accum: int, *overrides):
    """linreg away from its optimum (|w*| = 3, sigma = 0.5: the signal is well measured at B),
    learning with AdamW at a constant lr, a report after every update."""
    return linreg(
        uri,
        tmp_path,
        "model.dim=9",
        "model.w_star_norm=3.0",
        "model.noise_std=0.5",
        f"batch.tokens_per_update={B}",
        f"batch.micro_batch_size={B // (workers * accum)}",
        f"batch.grad_accum_steps={accum}",
        f"cluster.num_workers={workers}",
        "cluster.cpus_per_worker=1",
        f"train.total_tokens={UPDATES * B}",
        f"train.report_every_tokens={B}",
        f"train.eval_every_tokens={UPDATES * B}",
        f"gns.ema_tokens={EMA_TOKENS}",
        "optim.lr=0.05",
        "optim.beta2=0.8",  # a memory of 5 updates: measured from the fifth on
        "optim.grad_clip=0",
        *zero_stage(stage),
        *overrides,
    )


def brute_force(cfg) -> Dict[int, Tuple[float, float, float]]:
    """(|P G|^2, tr(P Sigma P), B_simple_adam) of the EMA at each report, keyed by the step it
    is logged at (the EMA's centre of mass); none before AdamW's v has averaged its memory of
    1 / (1 - beta2) steps."""
    plan = derived.batch_plan(cfg)
    adamw = derived.adamw_constants(cfg)
    beta1, eps, lr = cfg.optim.beta1, cfg.optim.eps, cfg.optim.lr
    model = copy.deepcopy(workloads.build(cfg, plan, torch.device("cpu")).model)
    (weight,) = model.parameters()
    opt = torch.optim.AdamW([weight], lr=lr, betas=(beta1, adamw.beta2), eps=eps, weight_decay=adamw.weight_decay)
    data = LinRegData(cfg.model.dim, cfg.model.noise_std, cfg.model.w_star_norm, cfg.train.seed)
    small_batches = plan.micro_batches_per_update
    b_small, b_big = B / small_batches, float(B)
    ema, out = noise.NoiseScaleEMA(EMA_TOKENS), {}
    for u in range(UPDATES):
        x, y = data.update_batch(u, B)
        state = opt.state.get(weight)
        if state and noise.adam_memory_filled(float(state["step"]), adamw.beta2):  # P from v before this update
            v, t = state["exp_avg_sq"].double().reshape(-1), float(state["step"])
            p = 1 / (v.sqrt() / (1 - adamw.beta2**t) ** 0.5 + eps)
            w = weight.detach().double().reshape(-1)
            per_example = x.double() * (x.double() @ w - y.double())[:, None]
            micro = per_example.reshape(small_batches, -1, cfg.model.dim).mean(1)
            small = float((micro * p).square().sum(1).mean())
            big = float((per_example.mean(0) * p).square().sum())
            g_squared = (b_big * big - b_small * small) / (b_big - b_small)
            trace_sigma = (small - big) / (1 / b_small - 1 / b_big)
            ema.update(g_squared, trace_sigma, tokens=B, at=u * B)
            if ema.b_simple is not None:
                out[round(ema.centre)] = (ema.g_squared, ema.trace_sigma, ema.b_simple)
        opt.zero_grad()
        (0.5 * (model(x) - y).square().mean()).backward()
        opt.step()
    return out


def assert_matches(logged: Dict[str, List[Tuple[int, float]]], expected, rel: float = 1e-4) -> None:
    assert len(expected) >= UPDATES // 2, "the premise: most reports have a positive |P G|^2"
    for i, key in enumerate(KEYS):
        assert [s for s, _ in logged[key]] == sorted(expected), key
        for step, value in logged[key]:
            assert value == pytest.approx(expected[step][i], rel=rel), (key, step)


def adam_history(cfg, run_id) -> Dict[str, List[Tuple[int, float]]]:
    return {k: history(cfg, run_id, f"gns/{k}_adam") for k in KEYS}


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_one_worker_accumulating_matches_the_brute_force(uri, tmp_path, stage):
    cfg = run_config(uri, tmp_path, stage, workers=1, accum=4)
    run_id = train(cfg, FakeRay(tmp_path))
    logged = adam_history(cfg, run_id)
    expected = brute_force(cfg)
    assert_matches(logged, expected)
    assert logged["b_simple"][0][0] >= 5 * B, "nothing before v has averaged its memory of 5 steps"
    ratio = [a / b for (_, a), (_, b) in zip(logged["b_simple"][-6:], history(cfg, run_id, "gns/b_simple")[-6:])]
    print(f"ZeRO {stage}: B_simple_adam / B_simple over the last reports {[round(r, 2) for r in ratio]}")


WORKER = """
import json, os, sys
from pathlib import Path
import torch.distributed as dist
from orchestrator.core import config
from tests.unit.test_trainer_in_process import FakeRay
from workloads.train import train_loop
from workloads.train.handoff import WorkerPayload

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 2), rank=rank, world_size=2)
for payload, folder in json.loads(open(sys.argv[2]).read()):
    payload = WorkerPayload(**payload)
    train_loop._train(config.from_dict(payload.config), payload, FakeRay(Path(folder) / str(rank)))
    dist.barrier()
"""


def train_on_two_workers(runs: List[Tuple[object, Path]], tmp_path: Path) -> List[str]:
    """Each config trained by two workers in two processes of one gloo group (what a Ray Train
    worker group is to the trainer), one after the other; their MLflow run ids."""
    payloads, ids = [], []
    for cfg, folder in runs:
        run_id = Store(cfg.tracking.uri, EXPERIMENT).create_run(folder.name)
        payloads.append(({"config": config.to_dict(cfg, redact=False), "run_id": run_id}, str(folder)))
        ids.append(run_id)
    plan = tmp_path / "runs.json"
    plan.write_text(json.dumps(payloads))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_SIZE": "2"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path / "store"), str(plan)],
            cwd=ROOT,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-4000:]
    return ids


def test_two_workers_with_and_without_accumulation_match_the_brute_force(uri, tmp_path):
    cases = {"zero0-A1": (0, 1), "zero2-A1": (2, 1), "zero2-A2": (2, 2)}
    runs = [(run_config(uri, tmp_path / n, s, workers=2, accum=a), tmp_path / n) for n, (s, a) in cases.items()]
    ids = train_on_two_workers(runs, tmp_path)
    for (cfg, _), run_id, name in zip(runs, ids, cases):
        assert_matches(adam_history(cfg, run_id), brute_force(cfg)), name


def test_sgd_and_gns_adam_off_log_no_adam_noise_scale(uri, tmp_path):
    for name, overrides in {"sgd": ["optim.name=sgd", "optim.beta2=null"], "off": ["gns.adam=false"]}.items():
        cfg = run_config(uri, tmp_path / name, 0, 1, 4, "train.total_tokens=256", *overrides)
        run_id = train(cfg, FakeRay(tmp_path / name))
        assert history(cfg, run_id, "gns/b_simple"), name
        assert not any(adam_history(cfg, run_id).values()), name


def test_a_resumed_run_logs_the_adam_noise_scale_of_an_unbroken_one(uri, tmp_path):
    """Killed after 12 updates and resumed from its checkpoint at 8: the EMA comes back from the
    checkpoint and v with the optimizer, so every value is the unbroken run's, each logged once."""
    cfg = run_config(uri, tmp_path, 2, 1, 4, f"train.checkpoint_every_tokens={8 * B}", f"train.total_tokens={16 * B}")
    unbroken = adam_history(cfg, train(cfg, FakeRay(tmp_path / "unbroken")))
    killed = FakeRay(tmp_path / "killed")
    run_id = Store(cfg.tracking.uri, EXPERIMENT).create_run("killed")
    fault = FaultInjection(at_tokens=12 * B, marker=str(tmp_path / "m"))
    payload = WorkerPayload(config=config.to_dict(cfg, redact=False), run_id=run_id, fault=fault)
    with pytest.raises(RuntimeError, match="injected fault"):
        train_loop._train(cfg, payload, killed)
    (checkpoint,) = [kept for _, kept in killed.reports if kept is not None]
    train_loop._train(cfg, payload, FakeRay(tmp_path / "resumed", resume_from=checkpoint))
    resumed = adam_history(cfg, run_id)
    for key in KEYS:
        assert [s for s, _ in resumed[key]] == [s for s, _ in unbroken[key]], (key, "each step once")
        assert [v for _, v in resumed[key]] == pytest.approx([v for _, v in unbroken[key]], rel=1e-5), key
