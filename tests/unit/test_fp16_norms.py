"""Under fp16 the gradients DeepSpeed leaves are those of the loss times the loss scale: the noise
scale's small-batch norms (the probe's hooks) and big-batch norm (what DeepSpeed reports, or
p.grad) must be divided by the scale of the update's own backwards, at every ZeRO stage.

`orchestrator train` refuses fp16 on CPU, but DeepSpeed 0.19.8 builds fp16 engines on CPU
tensors: ZeRO 0 wraps the torch AdamW in FP16_UnfusedOptimizer, whose reported norm is of the
scaled gradients; ZeRO 3 divides its norm by the scale after the step has updated it. Here the
real `engine.train_update` runs on such engines, and its norms are compared with the same fp16
gradients, captured beside it, divided by the scale.
"""

from __future__ import annotations

import math

import deepspeed
import pytest
import torch
from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

from orchestrator.core import config, derived
from tests.conftest import ROOT, zero_stage
from workloads.train import engine as trainer
from workloads.train.engine import build_engine, ensure_process_group, train_update
from workloads.train.gns_probe import GradNormProbe
from workloads.workload import LinRegWorkload

LINREG = ROOT / "conf" / "train" / "linreg.yaml"
B, MICRO = 64, 16  # A = 4 micro-batches of 16 examples


@pytest.fixture(autouse=True)
def fp16_on_this_cpu(monkeypatch):
    """DeepSpeed builds fp16 engines on CPUs whose oneDNN has fp16 kernels (avx512_fp16, AMX) and
    refuses elsewhere; torch computes in fp16 on any CPU, only slower, and speed is not what is
    tested here, so the check says yes on every CPU."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: True)


class HalfLinReg(LinRegWorkload):
    """linreg with the model in half precision (DeepSpeed casts it): inputs follow, the loss is fp32."""

    def summed_loss(self, engine, mb):
        return self._losses(engine(mb.tensors["x"].half()).float(), mb.tensors["y"])


def fp16_engine(stage: int, fp16: dict):
    cfg = config.load(
        LINREG,
        [
            "model.dim=16",
            f"batch.tokens_per_update={B}",
            f"batch.micro_batch_size={MICRO}",
            *zero_stage(stage),
            "optim.grad_clip=0",
            "optim.lr=0.01",
        ],
    )
    cfg.deepspeed.precision = "fp16"  # after validation, which refuses it on CPU
    cfg.deepspeed.extra = {**cfg.deepspeed.extra, "fp16": fp16}
    ensure_process_group(cfg)  # a world of one that stays (DeepSpeed keeps its groups)
    plan = derived.batch_plan(cfg)
    torch.manual_seed(0)
    work = HalfLinReg(cfg, plan, torch.device("cpu"))
    with torch.no_grad():  # away from w = 0, so that every example's gradient differs
        work.model.linear.weight.normal_()
    probe = GradNormProbe(work.model)
    return build_engine(cfg, plan, work), work, plan, probe


class Captured:
    """The fp16 gradient each backward gives every parameter (hooks beside the probe's), and
    p.grad at the accumulation boundary, just before DeepSpeed's step (ZeRO 0 only)."""

    def __init__(self, engine):
        self.micro, self.boundary, self._current = [], None, []
        params = [p for p in engine.module.parameters() if p.requires_grad]
        for p in params:
            p.register_hook(lambda g: self._current.append(g.detach().double().clone()))
        step = engine.step

        def step_and_capture(*args, **kwargs):
            self.micro.append(self._current)
            self._current = []
            if engine.is_gradient_accumulation_boundary() and engine.zero_optimization_stage() == 0:
                self.boundary = torch.cat([p.grad.double().reshape(-1) for p in params])
            return step(*args, **kwargs)

        engine.step = step_and_capture

    def take(self):
        micro, boundary = self.micro, self.boundary
        self.micro, self.boundary = [], None
        return [torch.cat([g.reshape(-1) for g in m]) for m in micro], boundary


def fp32_reference(work, plan, update):
    """Per-token-mean gradients of each micro-batch and of the whole update, by fp64 autograd of
    the plain loss at the engine's (fp16) weights, on the same examples as the fp16 model sees."""
    weight = work.model.linear.weight
    with deepspeed.zero.GatheredParameters([weight]):  # ZeRO 3 partitions it between forwards
        w = weight.detach().double().reshape(-1).clone()
    x, y = work.data.update_batch(update, plan.sequences_per_update)
    g = x.half().double() * (x.half().double() @ w - y.double())[:, None]  # per example: x (w.x - y)
    return g.reshape(plan.grad_accum_steps, -1, g.shape[1]).mean(1), g.mean(0)


def small_sq_mean(grads, applied, plan):
    """The mean squared norm of the micro-batches' per-token-mean gradients, from the fp16
    gradients of (summed loss x D / N x applied)."""
    token_scale = plan.num_workers / plan.tokens_per_update
    return sum(float((g / (token_scale * applied * MICRO)).square().sum()) for g in grads) / len(grads)


def power_of_two(ratio: float) -> float:
    return 2.0 ** round(math.log2(ratio))


def test_zero0_fp16_norms_are_of_the_unscaled_loss():
    """FP16_UnfusedOptimizer states a static loss scale of 1024. The factor the fp16 gradients
    really carry is measured here against fp64 autograd (DeepSpeed 0.19.8 does not scale the loss
    at ZeRO 0: it is 1); the trainer's small- and big-batch norms are the captured fp16 gradients
    over it to rounding (1e-6), and the plain loss's gradients to fp16 precision."""
    stated = 2.0**10
    engine, work, plan, probe = fp16_engine(0, {"loss_scale": stated})
    assert isinstance(engine.optimizer, FP16_UnfusedOptimizer) and engine.optimizer.loss_scale == stated
    captured = Captured(engine)
    micro, big = fp32_reference(work, plan, 0)

    stats = train_update(engine, work, plan, 0, 0, probe)
    grads, boundary = captured.take()
    applied = power_of_two(float(boundary.norm() / big.norm()))
    assert applied in (1.0, stated)
    assert stats.grad_norm == pytest.approx(float(boundary.norm()) / applied, rel=1e-6)
    assert stats.small_sq_mean == pytest.approx(small_sq_mean(grads, applied, plan), rel=1e-6)
    assert stats.grad_norm == pytest.approx(float(big.norm()), rel=1e-2)
    assert stats.small_sq_mean == pytest.approx(float(micro.square().sum(1).mean()), rel=1e-2)


def test_zero3_fp16_norm_uses_the_scale_of_the_backward_not_the_grown_one():
    """A dynamic scale that doubles after every clean step: ZeRO 3 divides its reported norm by
    the new scale; the trainer's is the update's fp16 gradient over the scale its backwards used,
    and the plain loss's gradient norm."""
    engine, work, plan, probe = fp16_engine(3, {"initial_scale_power": 8, "loss_scale_window": 1})
    captured = Captured(engine)
    grown = 0
    for update in range(3):
        micro, big = fp32_reference(work, plan, update)
        before = engine.optimizer.loss_scale
        stats = train_update(engine, work, plan, update * plan.sequences_per_update, 0, probe)
        after = engine.optimizer.loss_scale
        grads, _ = captured.take()
        summed = torch.stack(grads).sum(0)
        applied = power_of_two(float(summed.norm() / big.norm()))
        assert applied == before, "ZeRO 3 scales the loss by the stated scale"
        # DeepSpeed accumulates the fp16 gradients in fp16: rounding of about 1e-3
        assert stats.grad_norm == pytest.approx(float(summed.norm()) / applied, rel=2e-3), (update, before, after)
        assert stats.grad_norm == pytest.approx(float(big.norm()), rel=1e-2)
        assert stats.small_sq_mean == pytest.approx(small_sq_mean(grads, applied, plan), rel=1e-6)
        assert stats.small_sq_mean == pytest.approx(float(micro.square().sum(1).mean()), rel=1e-2)
        if after != before:
            grown += 1
            assert engine.get_global_grad_norm() == pytest.approx(stats.grad_norm * before / after, rel=1e-6), (
                "the premise: DeepSpeed divides by the grown scale"
            )
    assert grown >= 1, "the premise: the dynamic scale grew at a tested step"


@pytest.mark.parametrize(
    "stage, reported, expected",
    [
        (0, 80.0, 10.0),  # FP16_UnfusedOptimizer: the norm of the gradients, which carry the applied 8
        (1, 10.0, 10.0),  # divided by the scale before the step, the applied one
        (2, 10.0, 10.0),
        (3, 5.0, 10.0),  # divided by the scale after the step, which doubled 8 -> 16
    ],
)
def test_update_grad_norm_per_stage(stage, reported, expected):
    norm = trainer.update_grad_norm(reported, zero_stage=stage, applied_scale=8.0, scale_before=8.0, scale_after=16.0)
    assert norm == expected


def test_update_grad_norm_without_a_loss_scale_and_from_own_squares():
    assert trainer.update_grad_norm(3.0, zero_stage=3, applied_scale=1.0, scale_before=1.0, scale_after=1.0) == 3.0
    assert (
        trainer.update_grad_norm(None, zero_stage=0, applied_scale=1.0, scale_before=1.0, scale_after=1.0, own_sq=9.0)
        == 3
    )
    assert (
        trainer.update_grad_norm(None, zero_stage=0, applied_scale=4.0, scale_before=4.0, scale_after=8.0, own_sq=64.0)
        == 2
    )
    assert math.isnan(
        trainer.update_grad_norm(None, zero_stage=0, applied_scale=1.0, scale_before=1.0, scale_after=1.0)
    )
