"""batch.schedule=adaptive through the worker's training function (`train_loop._train`, in this
process, as tests/unit/test_trainer_in_process.py runs it): linear regression with plain SGD, whose
noise scale is known in closed form from the weights (B_noise = d + 1 + d sigma^2 / |w - w*|^2,
conf/train/linreg.yaml), grows its batch where the closed form says; a run killed and resumed
from its checkpoint makes the same decisions and logs the same curve, each step once; the
realised ramp, replayed as a fixed `batch.ramp`, trains the same curve."""

from __future__ import annotations

import copy
import dataclasses
from unittest import mock

import pytest
import torch

from orchestrator.analysis import branch_analysis, branch_ramp
from orchestrator.analysis.trials import Trial
from orchestrator.core import config, derived
from orchestrator.core.errors import ConfigError
from orchestrator.core.yaml_files import parse_overrides
from orchestrator.driver import launch, run_life
from orchestrator.formulas import adaptive_batch, batching, noise
from orchestrator.reporting import report
from orchestrator.tracking.run_tags import (
    ONLINE_CALIBRATION_METRIC,
    ONLINE_CALIBRATION_TAG,
    PARENT_TAG,
    REALISED_RAMP_TAG,
    ROLE_TAG,
    SWEEP_ROLE,
    SWEEP_TAG,
)
from orchestrator.tracking.store import Store
from tests.unit.test_branch_analysis import study_trials
from tests.unit.test_trainer_in_process import EXPERIMENT, FakeRay, history, linreg, train, uri  # noqa: F401
from workloads import workload as workloads
from workloads.builtin.linreg import LinRegData
from workloads.train import train_loop
from workloads.train.handoff import FaultInjection, WorkerPayload

B0, TOP, UPDATES_OF_TOP, LR = 16, 256, 24, 0.05


def adaptive(uri, tmp_path, *overrides):  # noqa: F811
    """Linear regression, d = 8, SGD at lr 0.05 from 16 examples per update (A = 4) up to 256."""
    return linreg(
        uri,
        tmp_path,
        "optim.name=sgd",
        f"optim.lr={LR}",
        f"batch.tokens_per_update={B0}",
        "batch.micro_batch_size=4",
        "batch.schedule=adaptive",
        f"batch.max_tokens_per_update={TOP}",
        f"train.total_tokens={TOP * UPDATES_OF_TOP}",
        f"train.report_every_tokens={TOP}",
        f"train.eval_every_tokens={TOP * UPDATES_OF_TOP}",
        f"train.checkpoint_every_tokens={4 * TOP}",
        "gns.ema_tokens=256",
        "deepspeed.zero_stage=0",
        *overrides,
    )


@pytest.fixture(scope="module")
def grown(uri, tmp_path_factory):  # noqa: F811
    """The adaptive run, trained once for the module: (config, run id, realised ramp)."""
    folder = tmp_path_factory.mktemp("adaptive")
    cfg = adaptive(uri, folder)
    run_id = train(cfg, FakeRay(folder / "ray"))
    tag = Store(cfg.tracking.uri).get_run(run_id).tags[REALISED_RAMP_TAG]
    ((key, steps),) = parse_overrides([tag])
    assert key == "batch.ramp"
    return cfg, run_id, [(s["from_tokens"], s["tokens_per_update"]) for s in steps]


def test_it_grows_the_batch_where_the_closed_form_crosses_the_thresholds(grown):
    """The run's own weights before every update, by plain SGD on the same examples along the
    realised ramp (tied to the run by its train/loss at every update), give the closed-form noise
    scale there; the trainer's EMA of its closed-form inputs (no sampling noise) fed to the same
    rule gives the batch the closed form says at every update. The run's batch is within one
    change of it at every update (a measured B_simple is noisy where it passes 2B: one update's
    |G|^2 is then mostly noise), and the closed form grows the batch at least twice."""
    cfg, run_id, ramp = grown
    segments = derived.batch_segments(cfg, ramp)
    data = LinRegData(cfg.model.dim, cfg.model.noise_std, cfg.model.w_star_norm, cfg.train.seed)
    model = copy.deepcopy(workloads.build(cfg, segments[0].plan, torch.device("cpu")).model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, trained = history(cfg, run_id, "train/loss"), history(cfg, run_id, "train/tokens_per_update")
    d, sigma_sq = cfg.model.dim, cfg.model.noise_std**2
    rule, said = derived.adaptive_rule(cfg), adaptive_batch.AdaptiveState([(0, B0)])
    ema, batch, tokens, batches = noise.NoiseScaleEMA(derived.gns_ema_tokens(cfg)), B0, 0, []
    for u, ((at, loss), (_, realised)) in enumerate(zip(losses, trained)):
        assert at == tokens
        delta_sq = float((model.w - data.w_star).square().sum())
        ema.update(delta_sq, d * (delta_sq + sigma_sq) + delta_sq, tokens=realised, at=tokens)
        x, y = data.examples(tokens, int(realised))
        opt.zero_grad()
        plain = 0.5 * (model(x) - y).square().mean()
        plain.backward()
        opt.step()
        assert loss == pytest.approx(plain.item(), rel=1e-5), u  # the trainer's trajectory
        batches.append((realised, batch))
        tokens += int(realised)
        batch = adaptive_batch.decide(rule, said, tokens, batch, ema.b_simple) or batch
    print("realised:", ramp, "\nclosed form:", said.ramp)
    assert all(realised / closed in (0.5, 1, 2) for realised, closed in batches), batches
    assert len(said.ramp) >= 3 and len(ramp) >= 3, "the premise: the batch grows, twice at least"


CURVES = ("train/loss", "train/tokens_per_update", "train/optimizer_step", "train/lr", "eval/loss")


def assert_same_curves(cfg, run_id, other_id, keys=CURVES):
    for key in keys:
        first, again = history(cfg, run_id, key), history(cfg, other_id, key)
        assert [t for t, _ in again] == [t for t, _ in first], (key, "each step once")
        assert [v for _, v in again] == pytest.approx([v for _, v in first], rel=1e-4), key


def test_a_resumed_run_makes_the_same_decisions_and_logs_the_same_curve(grown, tmp_path):
    """Killed at 1,400 tokens (past two changes), resumed from its checkpoint at 1,024: the
    decisions so far and the count towards the next come back with it, so the ramp, the noise
    scale and every curve equal the unbroken run's, each step once in MLflow."""
    cfg, run_id, ramp = grown
    resumed_id = Store(cfg.tracking.uri, EXPERIMENT).create_run("killed")
    fault = FaultInjection(at_tokens=1400, marker=str(tmp_path / "fault-marker"))
    payload = WorkerPayload(config=config.to_dict(cfg, redact=False), run_id=resumed_id, fault=fault)
    killed = FakeRay(tmp_path / "killed")
    with pytest.raises(RuntimeError, match="injected fault"):
        train_loop._train(cfg, payload, killed)
    (checkpoint,) = [kept for _, kept in killed.reports if kept is not None]
    assert checkpoint.name == "checkpoint-1024" and sum(t < 1024 for t, _ in ramp) >= 3, "the premise"
    train_loop._train(cfg, payload, FakeRay(tmp_path / "resumed", resume_from=checkpoint))
    assert Store(cfg.tracking.uri).get_run(resumed_id).tags[REALISED_RAMP_TAG] == batching.ramp_override(ramp)
    assert_same_curves(cfg, run_id, resumed_id, CURVES + ("gns/b_simple",))


def test_the_realised_ramp_replays_as_a_fixed_ramp_to_the_same_curve(grown, tmp_path):
    """The tag's `batch.ramp`, given to the same config with the fixed schedule, trains the same
    curve: the adaptive run is a ramp decided as it went, on the same stream and lr schedule."""
    cfg, run_id, ramp = grown
    tag = Store(cfg.tracking.uri).get_run(run_id).tags[REALISED_RAMP_TAG]
    replay = adaptive(
        cfg.tracking.uri,
        tmp_path,
        tag,
        "batch.schedule=fixed",
        "batch.max_tokens_per_update=null",
    )
    assert derived.adaptive_rule(replay) is None and len(derived.batch_segments(replay)) == len(ramp)
    assert_same_curves(cfg, run_id, train(replay, FakeRay(tmp_path)))


def test_the_driver_prints_the_realised_ramp_from_the_runs_tag(grown):
    cfg, run_id, ramp = grown
    assert launch.realised_ramp(Store.of(cfg), cfg, run_id) == batching.ramp_override(ramp)


def test_the_calibration_is_the_median_ratio_at_resolved_points_and_a_missing_study_is_named(uri, tmp_path):  # noqa: F811
    """branched critical batch size / B_simple at the resolved points with both (bounds and points
    without B_simple left out), the median; a study not in the store is refused naming the key."""
    points = [
        {"status": "resolved", "cbs": 600.0, "b_simple": 300.0},
        {"status": "resolved", "cbs": 900.0, "b_simple": 300.0},
        {"status": "resolved", "cbs": 100.0, "b_simple": 400.0},
        {"status": "above", "cbs": 4096.0, "b_simple": 100.0},
        {"status": "resolved", "cbs": 500.0, "b_simple": None},
    ]
    assert branch_ramp.calibration(points) == 2.0 and branch_ramp.calibration(points[3:]) is None
    cfg = adaptive(uri, tmp_path, "batch.calibration_from=no-such-study")
    with pytest.raises(ConfigError) as err:
        run_life.resolve_calibration(cfg)
    assert err.value.key == "batch.calibration_from" and "no sweep named 'no-such-study'" in str(err.value)
    assert cfg.batch.calibration == 1.0


def test_the_calibration_is_resolved_only_when_it_exceeds_no_points_ratio_by_more_than_the_margin():
    """online_calibration: the median ratio x 1/4, its interval the lowest low end and the highest
    high end of the points' own (cbs_interval / B_simple, x 1/4), resolved when the setting is at
    most CALIBRATION_MARGIN (2) x that low end; a point whose interval is unbounded below leaves it
    not resolved. Computed here by hand from the points."""

    def point(cbs, low, high, b_simple=100.0):
        return {"status": "resolved", "cbs": cbs, "cbs_interval": [low, high], "b_simple": b_simple}

    agreeing = [point(200, 160, 250), point(220, 180, 270), point(180, 150, 230)]
    online = branch_ramp.online_calibration(agreeing)
    assert online.value == pytest.approx(2.0 * 0.25) and online.interval == pytest.approx((1.5 * 0.25, 2.7 * 0.25))
    assert online.resolved and online.why_not() == ""
    # one point's ratio 4x below the others: the setting (their median) is 2.67x its low end
    drifting = agreeing[:2] + [point(60, 50, 75), point(240, 200, 300)]
    online = branch_ramp.online_calibration(drifting)
    assert online.value == pytest.approx(2.1 * 0.25) and online.interval[0] == pytest.approx(0.5 * 0.25)
    assert not online.resolved and "4.2x the lowest the points allow" in online.why_not()
    assert branch_ramp.CALIBRATION_MARGIN == 2.0
    # exactly at the margin: resolved
    assert branch_ramp.online_calibration([point(200, 100, 250)]).resolved
    unbounded = branch_ramp.online_calibration([*agreeing, point(200, None, 250)])
    assert not unbounded.resolved and unbounded.interval[0] is None and "not bounded below" in unbounded.why_not()
    assert branch_ramp.online_calibration([{**agreeing[0], "status": "above"}]) is None


def test_an_adaptive_run_does_not_start_on_a_calibration_that_is_not_resolved(uri, tmp_path):  # noqa: F811
    """A study whose report recorded its calibration as not resolved (pipeline.answer_tags, from
    the status tested above) is refused, naming the key and the reason: the run would not adapt on it."""
    store = Store(uri, EXPERIMENT)
    parent = store.create_run("sweep drifting", {ROLE_TAG: SWEEP_ROLE, SWEEP_TAG: "drifting"})
    online = branch_ramp.online_calibration(
        [{"status": "resolved", "cbs": c, "cbs_interval": [c * 0.8, c * 1.25], "b_simple": 100.0} for c in (200, 60)]
    )
    assert not online.resolved, "the premise: ratios 2 and 0.6, the setting 1.3 / 4 is 2.7x the lowest low end / 4"
    store.log_metrics(parent, {ONLINE_CALIBRATION_METRIC: online.value}, step=0)
    store.set_tags(parent, {ONLINE_CALIBRATION_TAG: f"not resolved: {online.why_not()}"})
    store.finish_run(parent)
    cfg = adaptive(uri, tmp_path, "batch.calibration_from=drifting")
    with pytest.raises(ConfigError) as err:
        run_life.resolve_calibration(cfg)
    assert err.value.key == "batch.calibration_from"
    assert "calibration is not resolved: 0.325 is 2.7x the lowest the points allow" in str(err.value)
    assert cfg.batch.calibration == 1.0 and cfg.batch.calibration_from == "drifting"


def test_the_analysis_leaves_an_adaptive_run_out_as_it_does_a_ramped_one(grown):
    """The params the driver logs (run_life.run_params) say batch.schedule=adaptive and its first
    batch: it is no point of steps against one batch size, so the critical-batch analysis takes no
    batch from it."""
    cfg, run_id, _ = grown
    params = {k: str(v) for k, v in run_life.run_params(cfg).items()}
    assert params["batch.schedule"] == "adaptive" and int(params["batch.tokens_per_update"]) == B0
    trial = Trial(run_id, "adaptive", "FINISHED", params, [])
    assert trial.ramped and trial.batch is None
    assert Trial(run_id, "fixed", "FINISHED", {**params, "batch.schedule": "fixed"}, []).batch == B0


def test_calibration_from_reads_a_branch_study_in_the_store(uri, tmp_path, capsys):  # noqa: F811
    """A branch study written into the store as a sweep does it (parent run, children with their
    params and curves; test_branch_analysis's study, whose base logs B_simple 300 all along): until
    a report of it is written its answer holds no calibration, which is refused naming the key; then
    batch.calibration_from=STUDY becomes the median of its resolved points' cbs / 300 (computed
    here from the same runs in memory) times 2 / 8, so the run doubles where that passes 8x the
    batch as the suggested ramp does, and calibration_from is cleared for the workers."""
    grid_b_simple = [(t, 300.0) for t in range(0, 180224 + 1, 4096)]
    trials = study_trials()
    trials[0] = dataclasses.replace(trials[0], b_simple=grid_b_simple)
    store = Store(uri, EXPERIMENT)
    parent = store.create_run("sweep cal-study", {ROLE_TAG: SWEEP_ROLE, SWEEP_TAG: "cal-study"})
    for t in trials:
        child = store.create_run(t.name, {PARENT_TAG: parent})
        store.log_params(child, t.params)
        for key, curve in (("train/loss", t.train), ("eval/loss", t.eval), ("eval/loss_se", t.eval_se)):
            for tokens, value in curve:
                store.log_metrics(child, {key: value}, tokens)
        for tokens, value in t.b_simple:
            store.log_metrics(child, {"gns/b_simple": value}, tokens)
        store.finish_run(child)
    store.finish_run(parent)
    points = branch_analysis.study(trials).points
    resolved = sorted(p["cbs"] for p in points if p["status"] == "resolved")
    assert len(resolved) == 3, "the premise: three resolved points"
    unreported = adaptive(uri, tmp_path, "batch.calibration_from=cal-study")
    with pytest.raises(ConfigError) as err:
        run_life.resolve_calibration(unreported)
    assert err.value.key == "batch.calibration_from" and "`orchestrator report cal-study`" in str(err.value)
    overrides = [f"tracking.uri={uri}", f"tracking.experiment={EXPERIMENT}"]
    assert report.run("cal-study", overrides, out=str(tmp_path / "report"), target_losses=None) == 0
    cfg = adaptive(uri, tmp_path, "batch.calibration_from=cal-study")
    run_life.resolve_calibration(cfg)
    assert cfg.batch.calibration == pytest.approx(resolved[1] / 300.0 * 2 / 8, rel=1e-9)
    assert cfg.batch.calibration_from is None
    # Every trial of a sweep names the same study: read and said once in a process.
    capsys.readouterr()
    again = adaptive(uri, tmp_path, "batch.calibration_from=cal-study")
    with mock.patch.object(Store, "find_sweep_run_anywhere", side_effect=AssertionError("read twice")):
        run_life.resolve_calibration(again)
    assert again.batch.calibration == cfg.batch.calibration and capsys.readouterr().out == ""
