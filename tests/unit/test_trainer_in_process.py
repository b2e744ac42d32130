"""The worker's training function (`train_loop._train`, what every Ray Train worker runs) in this
process, on the linear-regression workload, with a real DeepSpeed engine, a real MLflow store and
a stand-in for Ray's report/checkpoint API (tests/worker_here.py), checked against plain PyTorch:

- every update's train/loss, train/grad_norm, train/lr and train/clipped sit at the tokens the
  weights had seen before it (the first at 0), with the values of a plain AdamW copy;
- the pre-clip norm DeepSpeed clips by is the logged one, at ZeRO 0 and 2;
- the stable-phase evaluation: an extra eval/loss point, `stable_loss` in every Ray report from
  there on, kept by the checkpoint; a resumed run logs each step once.
"""

from __future__ import annotations

import copy
import math
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from mlflow.tracking import MlflowClient

from orchestrator.core import config, derived, ds_config
from orchestrator.core.phases import Phases
from orchestrator.formulas import noise
from orchestrator.formulas.schedules import lr_at
from orchestrator.tracking import run_tags
from orchestrator.tracking.store import Store
from tests.conftest import ROOT, zero_stage
from tests.worker_here import FakeRay
from workloads import workload as workloads
from workloads.builtin.linreg import LinRegData
from workloads.train import train_loop
from workloads.train.engine import build_engine, ensure_process_group, release_process_group, set_adamw_constants
from workloads.train.handoff import FaultInjection, WorkerPayload
from workloads.workload import LinRegWorkload

LINREG = ROOT / "conf" / "train" / "linreg.yaml"
EXPERIMENT = "in-process"


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    """One MLflow store for the module, and one process group of size 1 that stays (DeepSpeed
    keeps its groups, so the runs here share it, as a Ray Train worker would)."""
    threads = torch.get_num_threads()
    ensure_process_group(config.load(LINREG))
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
    Store(uri, EXPERIMENT).ensure_experiment()
    yield uri
    torch.set_num_threads(threads)  # the worker sets its own thread count


def linreg(uri, tmp_path, *overrides):
    return config.load(
        LINREG,
        [
            "model.dim=8",
            "cluster.cpus_per_worker=2",
            "train.checkpoint_every_tokens=0",
            "train.eval_tokens=256",
            "tracking.flush_every_s=0.05",
            "tracking.system_metrics=false",
            f"tracking.uri={uri}",
            f"train.storage_path={tmp_path}/runs",
            *overrides,
        ],
    )


def four_updates(uri, tmp_path, *overrides, B=16):
    """linreg: 4 updates of B tokens, reported each, evaluated at 0 and at the end, checkpointed
    at 2 and 4 updates."""
    return linreg(
        uri,
        tmp_path,
        f"batch.tokens_per_update={B}",
        "batch.micro_batch_size=8",
        f"train.total_tokens={4 * B}",
        f"train.report_every_tokens={B}",
        f"train.eval_every_tokens={4 * B}",
        f"train.checkpoint_every_tokens={2 * B}",
        *overrides,
    )


def train(cfg, api, run_id=None):
    """One worker's run, as Ray Train starts it; returns the MLflow run id."""
    run_id = run_id or Store(cfg.tracking.uri, EXPERIMENT).create_run("run")
    payload = WorkerPayload(config=config.to_dict(cfg, redact=False), run_id=run_id)
    train_loop._train(config.from_dict(payload.config), payload, api)
    return run_id


def history(cfg, run_id, key):
    return Store(cfg.tracking.uri).metric_history(run_id, key)


def mean_loss(model, x, y) -> float:
    with torch.no_grad():
        return float(0.5 * (model(x) - y).square().mean())


# ---------------------------------------------------------------- loss at its true position


@pytest.mark.parametrize("stage", [0, 2])
def test_each_update_is_logged_at_the_tokens_its_weights_had_seen(uri, tmp_path, stage):
    """Two updates of 16 examples (A = 2 micro-batches), warming up over both, clipped at 0.5:
    the points at 0 and 16 tokens are the initial weights' loss and gradient norm on update 0's
    examples and the once-updated weights' on update 1's, as a plain AdamW copy computes them;
    the learning rate beside each is the one that update applied."""
    B, peak, clip = 16, 0.05, 0.5
    cfg = linreg(
        uri,
        tmp_path,
        f"batch.tokens_per_update={B}",
        "batch.micro_batch_size=8",
        f"train.total_tokens={2 * B}",
        f"train.report_every_tokens={B}",
        f"train.eval_every_tokens={2 * B}",
        f"schedule.warmup_tokens={2 * B}",
        f"optim.lr={peak}",
        f"optim.grad_clip={clip}",
        *zero_stage(stage),
    )
    api = FakeRay(tmp_path)
    run_id = train(cfg, api)

    # Plain PyTorch: a copy of the initial model, AdamW with the run's constants, clipped by hand.
    plan = derived.batch_plan(cfg)
    model = copy.deepcopy(workloads.build(cfg, plan, torch.device("cpu")).model)
    opt = torch.optim.AdamW(model.parameters(), lr=peak, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)  # defaults
    data = LinRegData(cfg.model.dim, cfg.model.noise_std, cfg.model.w_star_norm, cfg.train.seed)
    eval_x, eval_y = data.eval_batch(cfg.train.eval_tokens)
    expected = {"train/loss": [], "train/grad_norm": [], "train/lr": [], "train/clipped": []}
    evals = [(0, mean_loss(model, eval_x, eval_y))]
    for u in range(2):
        x, y = data.update_batch(u, plan.sequences_per_update)
        opt.zero_grad()
        loss = 0.5 * (model(x) - y).square().mean()
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))  # returns the pre-clip norm
        lr = lr_at((u + 1) * B, peak=peak, total_tokens=2 * B, warmup_tokens=2 * B, decay="constant")
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        for key, value in zip(expected, (loss.item(), norm, lr, float(norm > clip))):
            expected[key].append((u * B, value))
    evals.append((2 * B, mean_loss(model, eval_x, eval_y)))

    assert expected["train/clipped"] == [(0, 1.0), (B, 1.0)], "the premise: both updates are clipped"
    assert expected["train/lr"][0][1] == pytest.approx(peak / 2)
    for key, points in expected.items():
        logged = history(cfg, run_id, key)
        assert [s for s, _ in logged] == [0, B], (key, logged)
        assert [v for _, v in logged] == pytest.approx([v for _, v in points], rel=1e-5), key
    # eval/loss stays after the update: at the tokens the weights it scores had seen.
    logged = history(cfg, run_id, "eval/loss")
    assert [s for s, _ in logged] == [s for s, _ in evals]
    assert [v for _, v in logged] == pytest.approx([v for _, v in evals], rel=1e-5)
    (final, _), *_ = [r for r in api.reports if r[0]["tokens"] == 2 * B]
    assert final["stable_loss"] == pytest.approx(evals[-1][1], rel=1e-5), "constant decay: the whole run is stable"


def test_no_clipping_is_logged_as_zero(uri, tmp_path):
    cfg = linreg(
        uri,
        tmp_path,
        "batch.tokens_per_update=16",
        "batch.micro_batch_size=8",
        "train.total_tokens=16",
        "train.report_every_tokens=16",
        "train.eval_every_tokens=16",
        "optim.grad_clip=100",
    )
    run_id = train(cfg, FakeRay(tmp_path))
    assert history(cfg, run_id, "train/clipped") == [(0, 0.0)]
    assert 0 < history(cfg, run_id, "train/grad_norm")[0][1] < 100


# ---------------------------------------------------------------- stable_loss


def test_stable_loss_is_evaluated_reported_and_survives_a_resume(uri, tmp_path):
    """wsd over 4 updates decaying over the last half: the stable phase ends at 32 tokens. The
    update that reaches it is evaluated (an eval/loss point between the scheduled ones at 0 and
    64) without a Ray report of its own; every report from there on carries it as stable_loss,
    NaN before. A run resumed from the checkpoint at 32 replays updates 2 and 3: it reports the
    same stable_loss, and MLflow holds each step once."""
    B = 16
    cfg = four_updates(uri, tmp_path, "schedule.decay=wsd", "schedule.wsd_decay_share=0.5", "optim.lr=0.05", B=B)
    api = FakeRay(tmp_path / "first")
    run_id = train(cfg, api)
    evals = history(cfg, run_id, "eval/loss")
    assert [s for s, _ in evals] == [0, 2 * B, 4 * B], evals
    stable = evals[1][1]
    assert [m["tokens"] for m, _ in api.reports] == [2 * B, 4 * B], "the stable evaluation is no extra report"
    assert all("stable_loss" in m for m, _ in api.reports)
    assert [m["stable_loss"] for m, _ in api.reports] == [stable, stable]

    resumed = FakeRay(tmp_path / "again", resume_from=api.reports[0][1])
    train(cfg, resumed, run_id)
    assert [m["tokens"] for m, _ in resumed.reports] == [4 * B]
    assert resumed.reports[0][0]["stable_loss"] == stable, "kept in the checkpoint"
    for key in ("train/loss", "train/lr", "train/grad_norm", "train/clipped"):
        assert [s for s, _ in history(cfg, run_id, key)] == [0, B, 2 * B, 3 * B], key
    assert [s for s, _ in history(cfg, run_id, "eval/loss")] == [0, 2 * B, 4 * B]
    assert [s for s, _ in history(cfg, run_id, "train/tokens")] == [B, 2 * B, 3 * B, 4 * B]


# ---------------------------------------------------------------- where the fixed cost goes


def test_the_startup_and_teardown_phases_add_up_to_the_runs_own_clock(uri, tmp_path):
    """The launcher's phases travel in the payload (here: a process that started 2 s ago and a
    1.5-s phase before that); the worker carries them on. Each startup/* value is logged once,
    at step 0, their sum is startup/total_s, and it lies between the time before the call and
    MLflow's timestamp of the first update's loss; teardown/final_report_s is at the last step
    and shorter than the time from the last update's loss to the call's return."""
    cfg = four_updates(uri, tmp_path)
    started = time.time() - 2.0
    run_id = Store(cfg.tracking.uri, EXPERIMENT).create_run("phases")
    payload = WorkerPayload(config=config.to_dict(cfg, redact=False), run_id=run_id)
    carried = {"prefix": "startup", "since": started, "seconds": {"startup/process_s": 1.5}}
    called = time.time()
    train_loop._train(config.from_dict(payload.config), payload, FakeRay(tmp_path), Phases.from_payload(carried))
    returned = time.time()

    c = MlflowClient(tracking_uri=cfg.tracking.uri)
    metrics = c.get_run(run_id).data.metrics
    phases = {k: v for k, v in metrics.items() if k.startswith("startup/") and k != "startup/total_s"}
    assert set(phases) >= {f"startup/{p}_s" for p in ("process", "process_group", "workload", "engine", "tracking")}
    assert {"startup/restore_s", "startup/first_eval_s"} <= set(phases)
    for key in [*phases, "startup/total_s"]:
        assert [m.step for m in c.get_metric_history(run_id, key)] == [0], key
    assert phases["startup/process_s"] == 1.5
    assert phases["startup/process_group_s"] >= called - started  # the carried clock, not a new one
    assert metrics["startup/total_s"] == pytest.approx(sum(phases.values()), abs=1e-6)
    (first_loss,) = [m for m in c.get_metric_history(run_id, "train/loss") if m.step == 0]
    assert called - started + 1.5 <= metrics["startup/total_s"] <= first_loss.timestamp / 1000 - started + 1.5 + 1e-3
    (final,) = c.get_metric_history(run_id, "teardown/final_report_s")
    last_loss = max(c.get_metric_history(run_id, "train/loss"), key=lambda m: m.step)
    assert final.step == 64 and 0 <= final.value <= returned - last_loss.timestamp / 1000 + 1e-3


def test_a_reused_process_trains_each_next_run_as_the_first(uri, tmp_path):
    """A sweep trial's process runs the next trial (Tune's reuse_actors): the run that made the
    process group releases it with DeepSpeed's groups, so the next runs build theirs afresh and
    train exactly as the first did (torch's destroy alone leaves DeepSpeed with dead groups)."""
    cfg = four_updates(uri, tmp_path, *zero_stage(2))
    first = history(cfg, train(cfg, FakeRay(tmp_path / "first")), "train/loss")
    release_process_group()  # the module's group: from here on each run makes its own
    try:
        for again in ("second", "third"):
            assert not dist.is_initialized()
            assert history(cfg, train(cfg, FakeRay(tmp_path / again)), "train/loss") == first, again
    finally:
        ensure_process_group(cfg)  # the module's, for the tests after this one


def test_zero_3_asked_of_one_worker_runs_as_zero_0_and_trains_as_zero_3_would(uri, tmp_path):
    """fp32 on one worker: the stage holding the least memory is 0 (derived.zero_stage), so that
    is what DeepSpeed runs when ZeRO 3 is asked (its checkpoint's config says so); the loss curve,
    the gradient norms and the weights are those of ZeRO 3 run as such (forced through
    deepspeed.extra), to float rounding."""
    from orchestrator.export.export import consolidate

    runs = {}
    for name, overrides in {"asked": ["deepspeed.zero_stage=3"], "forced": zero_stage(3)}.items():
        cfg = four_updates(uri, tmp_path / name, *overrides)
        api = FakeRay(tmp_path / name)
        run_id = train(cfg, api)
        weights, info = consolidate(api.reports[-1][1])
        runs[name] = {
            "stage": info["zero_stage"],
            "curves": [history(cfg, run_id, key) for key in ("train/loss", "train/grad_norm")],
            "weights": weights,
        }
    asked, forced = runs["asked"], runs["forced"]
    assert (asked["stage"], forced["stage"]) == (0, 3)
    for mine, theirs in zip(asked["curves"], forced["curves"]):
        assert [s for s, _ in mine] == [s for s, _ in theirs] == [16 * u for u in range(4)]
        assert [v for _, v in mine] == pytest.approx([v for _, v in theirs], rel=1e-5)
    assert asked["weights"].keys() == forced["weights"].keys()
    for name, w in asked["weights"].items():
        torch.testing.assert_close(w, forced["weights"][name], rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- batch.ramp

RAMP = [(0, 8), (16, 16), (48, 32)]  # (from_tokens, tokens_per_update): 2 updates at each


def ramp_config(uri, tmp_path, stage, *overrides):
    steps = ", ".join(f"{{from_tokens: {t}, tokens_per_update: {b}}}" for t, b in RAMP)
    return linreg(
        uri,
        tmp_path,
        f"batch.ramp=[{steps}]",
        "batch.ramp_lr_scaling=sqrt",
        "batch.micro_batch_size=8",
        "train.total_tokens=112",
        "train.report_every_tokens=16",
        "train.eval_every_tokens=112",
        "train.checkpoint_every_tokens=32",
        "schedule.warmup_tokens=24",
        "optim.lr=0.05",
        *zero_stage(stage),
        *overrides,
    )


HALF_LIFE = 40.0
"""optim.beta2_half_life_tokens of the token-form case: beta2 0.5^(B / 40), 0.87 at 8 tokens per update, 0.57 at 32."""


@pytest.mark.parametrize("stage, tokens_form", [(0, False), (2, False), (2, True)])
def test_a_ramp_trains_as_a_plain_loop_and_resumes_within_its_second_segment(uri, tmp_path, stage, tokens_form):
    """batch.ramp 8 -> 16 -> 32 tokens per update (b and A change: 4x2, 8x2, 8x4) with sqrt lr
    scaling: the run is a plain AdamW loop over consecutive examples of the one stream, each
    update at the schedule's lr times sqrt(B / 8); train/tokens_per_update and
    train/optimizer_step are logged per update. A run killed at 40 tokens and resumed from its
    checkpoint at 32 (within the second segment) gives the same curve, each step once. With beta2
    given in tokens (optim.beta2_half_life_tokens) it holds in tokens: each segment's updates use
    0.5^(B / half-life), the resumed one too; the weight decay given in tokens leaves a parameter
    group's own (linreg's 0) alone."""
    tokens_form_keys = (
        ["optim.beta2=null", f"optim.beta2_half_life_tokens={HALF_LIFE}"]
        + ["optim.weight_decay=null", "optim.weight_decay_timescale_share=0.5"]
        if tokens_form
        else []
    )
    cfg = ramp_config(uri, tmp_path, stage, *tokens_form_keys)
    assert cfg.batch.tokens_per_update == 8, "the ramp's first batch size"
    segments = derived.batch_segments(cfg)
    plans = [(s.plan.micro_batch_size, s.plan.grad_accum_steps) for s in segments]
    assert plans == [(4, 2), (8, 2), (8, 4)], plans
    run_id = train(cfg, FakeRay(tmp_path / "unbroken"))

    model = copy.deepcopy(workloads.build(cfg, segments[0].plan, torch.device("cpu")).model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    data = LinRegData(cfg.model.dim, cfg.model.noise_std, cfg.model.w_star_norm, cfg.train.seed)
    expected, tokens, step = {"train/loss": [], "train/lr": [], "train/tokens_per_update": []}, 0, []
    for start, B in RAMP:
        end = dict(zip([t for t, _ in RAMP], [t for t, _ in RAMP[1:]] + [112]))[start]
        while tokens < end:
            x, y = data.examples(tokens, B)  # one stream: the examples right after the last update's
            opt.zero_grad()
            loss = 0.5 * (model(x) - y).square().mean()
            loss.backward()
            lr = lr_at(tokens + B, peak=0.05, total_tokens=112, warmup_tokens=24, decay="constant") * (B / 8) ** 0.5
            for group in opt.param_groups:
                group["lr"] = lr
                group["betas"] = (0.9, 0.5 ** (B / HALF_LIFE) if tokens_form else 0.95)
            opt.step()
            for key, value in zip(expected, (loss.item(), lr, B)):
                expected[key].append((tokens, value))
            step.append((tokens, len(step)))
            tokens += B
    assert cfg.schedule.decay == "constant" and cfg.optim.grad_clip == 0
    for key, points in expected.items():
        logged = history(cfg, run_id, key)
        assert [t for t, _ in logged] == [t for t, _ in points], key
        assert [v for _, v in logged] == pytest.approx([v for _, v in points], rel=1e-5), key
    assert history(cfg, run_id, "train/optimizer_step") == step

    killed = FakeRay(tmp_path / "killed")
    resumed_id = Store(cfg.tracking.uri, EXPERIMENT).create_run("killed")
    fault = FaultInjection(at_tokens=40, marker=str(tmp_path / "fault-marker"))
    payload = WorkerPayload(config=config.to_dict(cfg, redact=False), run_id=resumed_id, fault=fault)
    with pytest.raises(RuntimeError, match="injected fault at 48 tokens"):
        train_loop._train(cfg, payload, killed)
    (checkpoint,) = [kept for m, kept in killed.reports if kept is not None]
    assert checkpoint.name == "checkpoint-32"
    train_loop._train(cfg, payload, FakeRay(tmp_path / "resumed", resume_from=checkpoint))
    for key in ("train/loss", "train/lr", "train/tokens_per_update", "train/optimizer_step", "eval/loss"):
        unbroken, again = history(cfg, run_id, key), history(cfg, resumed_id, key)
        assert [t for t, _ in again] == [t for t, _ in unbroken], (key, "each step once")
        assert [v for _, v in again] == pytest.approx([v for _, v in unbroken], rel=1e-4), key


# ---------------------------------------------------------------- branches from a checkpoint


@pytest.mark.parametrize("stage, decay", [(0, "constant"), (2, "constant"), (0, "wsd"), (2, "wsd")])
def test_a_factor_one_branch_continues_the_base_run(uri, tmp_path, stage, decay):
    """A base run of 8 updates of 16 examples, checkpointed every 32 tokens; branches from its
    checkpoint at 32 train to 96 tokens (train.stop_at_tokens) on the base's schedule, with
    batch.ramp switching to factor x 16 at 32 and sqrt lr scaling. Factor 1 is the base run's
    own continuation: the same train/loss and eval/loss at every shared token count, in a run of
    its own that holds only the steps from 32 on. Factor 2 trains at 32 examples per update from
    32 on, at sqrt(2) times the base's lr there."""
    B, at, stop = 16, 32, 96
    common = [
        "batch.micro_batch_size=8",
        "train.total_tokens=128",
        "train.report_every_tokens=16",
        "train.eval_every_tokens=32",
        f"schedule.decay={decay}",
        "schedule.wsd_decay_share=0.5",
        "optim.lr=0.05",
        *zero_stage(stage),
    ]
    base_cfg = linreg(uri, tmp_path, f"batch.tokens_per_update={B}", "train.checkpoint_every_tokens=32", *common)
    api = FakeRay(tmp_path / "base")
    base = train(base_cfg, api)
    (checkpoint,) = [kept for m, kept in api.reports if kept is not None and m["tokens"] == at]

    def branch(factor):
        steps = f"{{from_tokens: 0, tokens_per_update: {B}}}, {{from_tokens: {at}, tokens_per_update: {factor * B}}}"
        ramp = f"batch.ramp=[{steps}]"
        cfg = linreg(
            uri,
            tmp_path,
            ramp,
            "batch.ramp_lr_scaling=sqrt",
            f"train.start_from_checkpoint={checkpoint}",
            f"train.stop_at_tokens={stop}",
            "train.checkpoint_every_tokens=0",
            *common,
        )
        return cfg, train(cfg, FakeRay(tmp_path / f"branch{factor}"))

    cfg, one = branch(1)
    for key in ("train/loss", "train/lr", "eval/loss"):
        # train points at the tokens before each update, eval points after one: none at 32 itself
        low, high = (at, stop - B) if key != "eval/loss" else (at + 1, stop)
        shared = [(t, v) for t, v in history(base_cfg, base, key) if low <= t <= high]
        got = history(cfg, one, key)
        assert [t for t, _ in got] == [t for t, _ in shared], key
        assert [v for _, v in got] == pytest.approx([v for _, v in shared], rel=1e-5), key
    assert [t for t, _ in history(cfg, one, "eval/loss")] == [64, 96], "no eval at the branch point: the base has it"

    cfg, two = branch(2)
    assert history(cfg, two, "train/tokens_per_update") == [(32, 32.0), (64, 32.0)]
    schedule = [
        lr_at(t + 2 * B, peak=0.05, total_tokens=128, warmup_tokens=0, decay=decay, wsd_decay_share=0.5)
        for t in (32, 64)
    ]
    assert [v for _, v in history(cfg, two, "train/lr")] == pytest.approx([2**0.5 * v for v in schedule], rel=1e-9)


def test_stable_loss_is_nan_before_the_stable_phase_ends(uri, tmp_path):
    """cosine: the trusted part is the first half; a report at a quarter has no stable_loss yet."""
    cfg = linreg(
        uri,
        tmp_path,
        "batch.tokens_per_update=16",
        "batch.micro_batch_size=8",
        "train.total_tokens=64",
        "train.report_every_tokens=16",
        "train.eval_every_tokens=16",
        "schedule.decay=cosine",
    )
    api = FakeRay(tmp_path)
    run_id = train(cfg, api)
    stable = dict(history(cfg, run_id, "eval/loss"))[32]
    reported = {m["tokens"]: m["stable_loss"] for m, _ in api.reports}
    assert math.isnan(reported[16]) and reported[32] == reported[48] == reported[64] == stable


# ---------------------------------------------------------------- optimizer constants


class PassThrough(LinRegWorkload):
    """Decays its weights with optim.weight_decay as given (None unless given per step), as the
    GPT and hf workloads do."""

    def param_groups(self):
        return [{"params": list(self.model.parameters()), "weight_decay": self.cfg.optim.weight_decay}]


def test_the_engines_adamw_and_the_deepspeed_config_use_the_resolved_constants(uri, tmp_path):
    """Given in tokens, beta2 and the run's weight decay are resolved at the first batch for the
    engine and the DeepSpeed config, and at a later batch.ramp segment's batch and lr factor
    (4x the batch, sqrt: 2x the lr) for the trainer to set there."""
    cfg = linreg(
        uri,
        tmp_path,
        "optim.weight_decay=null",
        "optim.beta2_half_life_tokens=2560",
        "optim.weight_decay_timescale_share=0.5",
        "batch.ramp=[{from_tokens: 0, tokens_per_update: 256}, {from_tokens: 25600, tokens_per_update: 1024}]",
        "batch.ramp_lr_scaling=sqrt",
    )
    plan = derived.batch_plan(cfg)
    B, T = cfg.batch.tokens_per_update, cfg.train.total_tokens
    beta2, weight_decay = 0.5 ** (B / 2560), B / (cfg.optim.lr * 0.5 * T)
    engine = build_engine(cfg, plan, PassThrough(cfg, plan, torch.device("cpu")))
    (group,) = engine.optimizer.param_groups
    assert group["betas"] == (cfg.optim.beta1, pytest.approx(beta2)) and group["weight_decay"] == pytest.approx(
        weight_decay
    )
    adamw = ds_config.build(cfg, plan)["optimizer"]["params"]
    assert adamw["betas"][1] == group["betas"][1] and adamw["weight_decay"] == group["weight_decay"]

    later = derived.batch_segments(cfg)[-1]
    assert (later.plan.tokens_per_update, later.lr_factor) == (4 * B, 2.0)
    set_adamw_constants(engine, derived.adamw_constants(cfg, later.plan.tokens_per_update, later.lr_factor))
    assert group["betas"] == (cfg.optim.beta1, pytest.approx(0.5 ** (4 * B / 2560)))
    assert group["weight_decay"] == pytest.approx(4 * B / (2 * cfg.optim.lr * 0.5 * T))


@pytest.mark.parametrize("stage, momentum", [(0, 0.0), (0, 0.9), (2, 0.0), (2, 0.9), (3, 0.9)])
def test_sgd_through_the_trainer_is_torch_sgd(uri, tmp_path, stage, momentum):
    """optim.name=sgd: four updates of 16 examples (A = 2) through the trainer and DeepSpeed (ZeRO 0,
    and ZeRO 2 and 3 stepping torch's SGD on their flat fp32 partitions) match torch.optim.SGD on
    a copy of the initial model and the same batches: the loss and gradient norm before every
    update (the weights after 0 to 3 updates) and the eval loss after the last."""
    B, updates, lr = 16, 4, 0.2
    cfg = linreg(
        uri,
        tmp_path,
        "optim.name=sgd",
        f"optim.momentum={momentum}",
        f"optim.lr={lr}",
        f"batch.tokens_per_update={B}",
        "batch.micro_batch_size=8",
        f"train.total_tokens={updates * B}",
        f"train.report_every_tokens={updates * B}",
        f"train.eval_every_tokens={updates * B}",
        *zero_stage(stage),
    )
    run_id = train(cfg, FakeRay(tmp_path))

    plan = derived.batch_plan(cfg)
    initial = workloads.build(cfg, plan, torch.device("cpu")).model
    data = LinRegData(cfg.model.dim, cfg.model.noise_std, cfg.model.w_star_norm, cfg.train.seed)
    eval_x, eval_y = data.eval_batch(cfg.train.eval_tokens)

    def plain(momentum):
        """(losses, gradient norms, final eval loss) of plain torch SGD."""
        model = copy.deepcopy(initial)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        losses, norms = [], []
        for u in range(updates):
            x, y = data.update_batch(u, plan.sequences_per_update)
            opt.zero_grad()
            loss = 0.5 * (model(x) - y).square().mean()
            loss.backward()
            losses.append(loss.item())
            norms.append(float(torch.linalg.vector_norm(model.linear.weight.grad)))
            opt.step()
        return losses, norms, mean_loss(model, eval_x, eval_y)

    losses, norms, final = plain(momentum)
    assert [v for _, v in history(cfg, run_id, "train/loss")] == pytest.approx(losses, rel=1e-5)
    assert [v for _, v in history(cfg, run_id, "train/grad_norm")] == pytest.approx(norms, rel=1e-5)
    assert history(cfg, run_id, "eval/loss")[-1] == (updates * B, pytest.approx(final, rel=1e-5))
    assert losses[-1] < 0.9 * losses[0], "the premise: the updates move the weights"
    other = plain(0.9 if momentum == 0 else 0.0)[2]
    assert abs(other / final - 1) > 0.01, "the premise: momentum changes the result beyond the tolerance"


def test_the_engines_sgd_uses_coupled_weight_decay_and_no_adamw_constants(uri, tmp_path):
    """optim.weight_decay is torch SGD's weight_decay (L2 added to the gradient) for the groups that
    pass it through, 0 when null; no betas or eps anywhere; MLflow gets no beta2_effective."""
    from orchestrator.driver import run_life

    for given, decay in (("0.01", 0.01), ("null", 0.0)):
        cfg = linreg(uri, tmp_path, "optim.name=sgd", "optim.momentum=0.5", f"optim.weight_decay={given}")
        plan = derived.batch_plan(cfg)
        engine = build_engine(cfg, plan, PassThrough(cfg, plan, torch.device("cpu")))
        assert type(engine.basic_optimizer) is torch.optim.SGD
        (group,) = engine.optimizer.param_groups
        assert (group["momentum"], group["weight_decay"], group["dampening"], group["nesterov"]) == (
            0.5,
            decay,
            0,
            False,
        )
        assert "betas" not in group and "eps" not in group
        section = ds_config.build(cfg, plan)["optimizer"]
        assert section == {"type": "SGD", "params": {"lr": cfg.optim.lr, "momentum": 0.5, "weight_decay": decay}}
        params = run_life.run_params(cfg)
        assert params["optim.weight_decay_effective"] == decay and "optim.beta2_effective" not in params


# ---------------------------------------------------------------- the noise scale's lag


def test_b_simple_tracks_the_closed_form_of_the_runs_own_weights(uri, tmp_path):
    """Linear regression learning with AdamW: B_simple climbs from 257 to about 1,800 examples as
    w nears w*. The closed form at each logged point comes from |w - w*| of the run's own weights
    there, recomputed in plain PyTorch (and tied to the run by its train/loss at every update).

    - lag: the trainer's EMA at the default gns.ema_tokens, replayed on the closed-form |G|^2 and
      tr(Sigma) at the weights of every update (no sampling noise), against the closed form at
      the logged step (its centre of mass): under 5 % everywhere. Logged after the report's
      update at the old default (a twentieth of the budget), it would be 10-20 % low.
    - measured: gns/b_simple within 10 % of the closed form while B_simple <= B / 12 (beyond,
      one update's |G|^2 is mostly noise; 8 seeds of this run in numpy: worst 2-7 %).
    """
    B, updates, dim, lr = 8192, 128, 128, 1e-3
    cfg = linreg(
        uri,
        tmp_path,
        f"model.dim={dim}",
        f"batch.tokens_per_update={B}",
        "batch.micro_batch_size=1024",  # A = 8
        f"train.total_tokens={B * updates}",
        f"train.report_every_tokens={8 * B}",
        f"train.eval_every_tokens={B * updates}",
        f"optim.lr={lr}",
        "deepspeed.zero_stage=0",
    )
    run_id = train(cfg, FakeRay(tmp_path))
    logged = history(cfg, run_id, "gns/b_simple")
    losses = history(cfg, run_id, "train/loss")
    assert len(logged) == updates // 8 and len(losses) == updates

    # The run's weights before every update, by plain AdamW on the same examples.
    plan = derived.batch_plan(cfg)
    data = LinRegData(dim, cfg.model.noise_std, cfg.model.w_star_norm, cfg.train.seed)
    model = workloads.build(cfg, plan, torch.device("cpu")).model
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    delta_sq = []
    for u in range(updates + 1):
        delta_sq.append(float((model.w - data.w_star).square().sum()))
        if u == updates:
            break
        x, y = data.update_batch(u, B)
        opt.zero_grad()
        loss = 0.5 * (model(x) - y).square().mean()
        loss.backward()
        opt.step()
        assert losses[u] == (u * B, pytest.approx(loss.item(), rel=1e-4)), u  # the trainer's trajectory

    sigma_sq = cfg.model.noise_std**2

    def closed_form(tokens):  # B_simple at the weights that had seen `tokens` (between two updates)
        u = min(int(tokens // B), updates - 1)
        d2 = delta_sq[u] + (tokens / B - u) * (delta_sq[u + 1] - delta_sq[u])
        return (dim * (d2 + sigma_sq) + d2) / d2

    def replay(ema_tokens):
        """(logged step, B_simple) at each report of the EMA of the noise-free inputs."""
        ema, out = noise.NoiseScaleEMA(ema_tokens), []
        for u in range(updates):
            d2 = delta_sq[u]
            ema.update(d2, dim * (d2 + sigma_sq) + d2, tokens=B, at=u * B)
            if (u + 1) % 8 == 0:
                out.append((round(ema.centre), ema.b_simple, (u + 1) * B))
        return out

    noise_free = replay(derived.gns_ema_tokens(cfg))
    assert [s for s, _ in logged] == [s for s, _, _ in noise_free], "logged at the EMA's centre of mass"
    lag = [b / closed_form(step) - 1 for step, b, _ in noise_free]
    old = [b / closed_form(after) - 1 for _, b, after in replay(B * updates // 20)]
    print(f"lag at the centre: worst {max(lag, key=abs):+.2%}; at the report, old default: worst {min(old):+.2%}")
    assert max(abs(x) for x in lag) < 0.05
    assert min(old) < -0.1, "the premise: the old default and position lag by more than 10 %"

    moderate = [(s, b) for s, b in logged if closed_form(s) <= B / 12]
    errors = [b / closed_form(s) - 1 for s, b in moderate]
    print("measured vs closed form:", ", ".join(f"{s}: {e:+.1%}" for (s, _), e in zip(moderate, errors)))
    assert len(moderate) >= 6 and max(abs(e) for e in errors) < 0.1
    assert closed_form(logged[-1][0]) > 1.5 * closed_form(logged[0][0]), "the premise: B_simple changes"


# ---------------------------------------------------------------- B_simple at every batch size


@pytest.mark.parametrize("examples, updates", [(16, 1000), (64, 500), (1024, 300)])
def test_one_micro_batch_updates_are_split_so_b_simple_is_measured(uri, tmp_path, examples, updates):
    """b = B holds the whole update of B examples: D x A would be 1 and B_simple unmeasured. With
    gns.enabled the solver splits it in two (b = B / 2, A = 2). At frozen weights (lr 0, w = 0)
    the logged B_simple meets the closed form (d (|w*|^2 + sigma^2) + |w*|^2) / |w*|^2 = 33 at
    every batch size: a small update's estimate is noisier (relative spread about 33 / B per
    update), so it is averaged over more updates (standard error 2 to 6 %)."""
    tokens = examples * updates
    cfg = linreg(
        uri,
        tmp_path,
        "model.dim=16",
        f"batch.tokens_per_update={examples}",
        f"batch.micro_batch_size={examples}",
        f"train.total_tokens={tokens}",
        f"train.report_every_tokens={tokens // 3}",
        f"train.eval_every_tokens={tokens}",
        "gns.ema_tokens=100000000",  # every update weighs almost alike
        "optim.lr=0",
    )
    plan = derived.batch_plan(cfg)
    assert (plan.micro_batch_size, plan.grad_accum_steps) == (examples // 2, 2)
    run_id = train(cfg, FakeRay(tmp_path))
    (*_, (_, b_simple)) = history(cfg, run_id, "gns/b_simple")
    print(f"B = {examples}: B_simple {b_simple:.1f} (closed form 33)")
    assert b_simple == pytest.approx(33.0, rel=0.1)


def test_the_split_leaves_the_loss_curve_as_it_was(uri, tmp_path):
    """The same run split in two for the probe (gns on) and whole (gns off): token-weighted
    accumulation makes the curves agree to float rounding."""
    curves = []
    for gns in ("true", "false"):
        cfg = linreg(
            uri,
            tmp_path / gns,
            "batch.tokens_per_update=64",
            "batch.micro_batch_size=64",
            "train.total_tokens=1024",
            "train.report_every_tokens=512",
            "train.eval_every_tokens=1024",
            f"gns.enabled={gns}",
        )
        assert derived.batch_plan(cfg).grad_accum_steps == (2 if gns == "true" else 1)
        curves.append(history(cfg, train(cfg, FakeRay(tmp_path / gns)), "train/loss"))
    assert [s for s, _ in curves[0]] == [s for s, _ in curves[1]] == [64 * u for u in range(16)]
    assert [v for _, v in curves[0]] == pytest.approx([v for _, v in curves[1]], rel=1e-5)


def test_eval_loss_comes_with_the_standard_error_of_its_micro_batches():
    """evaluate's standard error against the textbook one: with equal tokens per micro-batch the
    ratio estimator's is the standard deviation of the batch means over sqrt(k); an all-masked
    filler batch (a rank short of a batch) counts for nothing."""
    from workloads.train.engine import evaluate

    class Engine:
        def eval(self):
            pass

        def train(self):
            pass

    means = torch.tensor([2.0, 2.5, 1.5, 3.0, 2.2], dtype=torch.float64)
    batches = [SimpleNamespace(mean=float(m), n=64) for m in means] + [SimpleNamespace(mean=0.0, n=0)]
    work = SimpleNamespace(
        eval_batches=lambda rank, world: batches,
        summed_loss=lambda engine, mb: (torch.tensor(mb.mean * mb.n, dtype=torch.float64), torch.tensor(float(mb.n))),
    )
    loss, se = evaluate(Engine(), work, 0, 1)
    assert loss == pytest.approx(float(means.mean()))
    assert se == pytest.approx(float(means.std(unbiased=True)) / math.sqrt(len(means)), rel=1e-12)
    one = SimpleNamespace(eval_batches=lambda rank, world: batches[:1], summed_loss=work.summed_loss)
    assert math.isnan(evaluate(Engine(), one, 0, 1)[1])


def test_a_final_flush_that_fails_leaves_no_run_running(uri, tmp_path, monkeypatch):
    """The store takes no point for the whole run: the worker waits FINAL_FLUSH_S at the end (here
    1 s), then fails with TrackingError; the driver closes the MLflow run FAILED with that reason."""
    from orchestrator.driver import run_life
    from orchestrator.tracking import metric_logger

    cfg = linreg(
        uri,
        tmp_path,
        "batch.tokens_per_update=16",
        "batch.micro_batch_size=8",
        "train.total_tokens=32",
        "train.report_every_tokens=16",
        "train.eval_every_tokens=32",
    )

    def refused(logger):
        logger.last_error, logger.failed_sends = "ConnectionError: tracking server down", logger.failed_sends + 1
        return False

    monkeypatch.setattr(metric_logger, "FINAL_FLUSH_S", 1.0)
    monkeypatch.setattr(metric_logger, "REPORT_FLUSH_S", 0.1)
    monkeypatch.setattr(metric_logger.MetricLogger, "_send_some", refused)
    run_id = Store(cfg.tracking.uri, EXPERIMENT).create_run("final flush")
    with pytest.raises(
        metric_logger.TrackingError, match="within 1 s: ConnectionError: tracking server down"
    ) as failed:
        train(cfg, FakeRay(tmp_path / "ray"), run_id)
    monkeypatch.undo()
    reason = run_life.finish(Store.of(cfg), cfg, run_id, failed.value)
    run = Store(cfg.tracking.uri).get_run(run_id)
    assert run.status == "FAILED" and reason.startswith("TrackingError: could not send")
    assert run.tags[run_tags.FAILURE_TAG] == reason
