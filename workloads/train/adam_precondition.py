"""Adam's preconditioner, 1 / (sqrt(v_hat) + eps), where the noise scale's hooks can use it.

The noise scale of the gradient as AdamW uses it (`gns/b_simple_adam`, orchestrator/formulas/noise.py)
takes the squared norm of P g for every micro-batch's local gradient g, in the per-parameter
hooks (gns_probe.py), and of P G for the update's gradient G, with P = 1 / (sqrt(v_hat) + eps)
elementwise: the denominator torch's AdamW divides by, from the second moment v *before* the
update, bias-corrected by the optimizer's own step count. P must not depend on the update's own
samples, or E|P G_B|^2 = |P G|^2 + tr(P Sigma P) / B (what makes the estimator unbiased) fails;
v before the update is the newest state that does not.

Where v lives depends on the ZeRO stage (and precision): whole per parameter in torch's AdamW at
ZeRO 0 in fp32; in flat fp32 partitions at ZeRO 1 and 2 (and DeepSpeed's bf16 optimizer at
ZeRO 0), each rank a stretch of the flattened parameters; per parameter, each rank a slice, at
ZeRO 3. A hook sees the whole local gradient, so every rank keeps a whole fp32 copy of P
(4 bytes per parameter), filled from the stretches it holds and summed over the ranks (one
all-reduce of the model's size per update, only where v is partitioned). The update's gradient
is reduced (and partitioned) by DeepSpeed before the step: its preconditioned norm is summed
where each stretch of it lives, beside v, and the ranks' parts are added with the update's other
totals (engine.train_update), so it costs no collective of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.formulas import noise


@dataclass(frozen=True)
class Fragment:
    """A stretch of one parameter whose Adam state this rank holds."""

    index: int
    """The parameter's position among the trainable ones (the probe's order)."""
    start: int
    """Where the stretch begins in the flattened parameter."""
    exp_avg_sq: torch.Tensor
    """v over the stretch, flat."""
    step: torch.Tensor
    """The optimizer's own step count behind v (a tensor, on the device where torch keeps it there)."""
    beta2: float
    eps: float
    grad: Callable[[], torch.Tensor]
    """The update's reduced gradient over the stretch, flat: valid between the accumulation
    boundary's backward and the optimizer's step."""


def full_shape(p: nn.Parameter) -> torch.Size:
    """A parameter's shape as its gradient has it (ZeRO 3 leaves p itself empty between uses)."""
    return p.ds_shape if hasattr(p, "ds_shape") else p.shape


class AdamPreconditioner:
    """A whole copy of 1 / (sqrt(v_hat) + eps) per trainable parameter on this rank, refreshed
    once per update from the optimizer state (`refresh`, before the update's first backward)."""

    def __init__(self, engine, params: List[nn.Parameter]):
        self.engine, self.params = engine, params
        shapes = [full_shape(p) for p in params]
        self._flat = torch.zeros(sum(s.numel() for s in shapes), dtype=torch.float32, device=engine.device)
        self._views = list(self._flat.split([s.numel() for s in shapes]))  # flat, per parameter
        self.scales = [view.view(shape) for view, shape in zip(self._views, shapes)]
        """Per parameter, shaped as its gradient: P, valid while `ready`."""
        self.ready = False
        self._fragments: List[Fragment] = []
        self._outs: List[torch.Tensor] = []  # P over each fragment
        zero = engine.zero_optimization_stage()
        # Where v is partitioned the copy is assembled from every rank's stretches; at ZeRO 0 in
        # fp32 every rank holds all of v, and the update's norm is counted on rank 0 alone.
        self._partitioned = zero > 0 or any(hasattr(p, "_hp_mapping") for p in params)

    @property
    def nbytes(self) -> int:
        return self._flat.numel() * self._flat.element_size()

    def refresh(self) -> bool:
        """P from the optimizer state before this update; False (and not ready) until v has
        averaged over its memory (noise.adam_memory_filled)."""
        frags = self._fragments = local_fragments(self.engine, self.params)
        steps = torch.stack([f.step for f in frags]).tolist() if frags else []  # one read of the device
        self.ready = bool(frags) and all(noise.adam_memory_filled(t, f.beta2) for t, f in zip(steps, frags))
        if not self.ready:
            return False
        if self._partitioned:
            self._flat.zero_()
        # torch's AdamW divides by exp_avg_sq.sqrt() / sqrt(1 - beta2^step) + eps: P is its inverse.
        # One call per operation for all the fragments (per-tensor calls cost more than the arithmetic).
        outs = self._outs = [self._views[f.index].narrow(0, f.start, f.exp_avg_sq.numel()) for f in frags]
        torch._foreach_copy_(outs, [f.exp_avg_sq for f in frags])
        torch._foreach_sqrt_(outs)
        torch._foreach_div_(outs, [math.sqrt(1 - f.beta2**t) for t, f in zip(steps, frags)])
        torch._foreach_add_(outs, [f.eps for f in frags])
        torch._foreach_reciprocal_(outs)
        if self._partitioned and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(self._flat)  # each element is held by one rank: the sum assembles it
        return True

    def update_sq_norm(self) -> float:
        """This rank's part of |P G|^2 for the update's reduced gradient G (of the loss as scaled
        in backward), between the boundary backward and the step: summed over ranks, the whole."""
        if not self.ready or (not self._partitioned and dist.is_initialized() and dist.get_rank() > 0):
            return 0.0
        norms = torch._foreach_norm(torch._foreach_mul([f.grad().float() for f in self._fragments], self._outs))
        return float(torch.stack(norms).double().square().sum())


def local_fragments(engine, params: List[nn.Parameter]) -> List[Fragment]:
    """The stretches of `params` whose AdamW state this rank holds, or [] where the optimizer
    has no second moment (before its first step; SGD)."""
    basic = engine.basic_optimizer
    fragments, groups = [], _groups_by_tensor(basic)
    for index, p in enumerate(params):
        if hasattr(p, "ds_id"):
            found = _zero3(engine.optimizer, basic, index, p)
        elif hasattr(p, "_hp_mapping"):
            found = _flat_partition(basic, index, p)
        else:
            found = _whole(basic, index, p, groups)
        if found is _NO_STATE:
            return []
        if found is not None:
            fragments.append(found)
    return fragments


_NO_STATE = object()


def _adam_state(basic, key: torch.Tensor, group: Dict):
    """(v, step, beta2) of `key` in torch's optimizer, or None before its first step (torch
    makes the state at the first step)."""
    state = basic.state.get(key, {})
    if "exp_avg_sq" not in state:
        return None
    return state["exp_avg_sq"].reshape(-1), torch.as_tensor(state["step"], dtype=torch.float64), group["betas"][1]


def _groups_by_tensor(basic) -> Dict[int, Dict]:
    return {id(t): g for g in basic.param_groups for t in g["params"]}


def _whole(basic, index: int, p: nn.Parameter, groups: Dict[int, Dict]):
    """ZeRO 0 with torch's optimizer: the parameter's own state, whole; p.grad holds the
    update's gradient after the boundary backward (all-reduced over the workers)."""
    group = groups[id(p)]
    found = _adam_state(basic, p, group)
    if found is None:
        return _NO_STATE
    v, step, beta2 = found
    return Fragment(index, 0, v, step, beta2, group["eps"], lambda: p.grad.reshape(-1))


def _flat_partition(basic, index: int, p: nn.Parameter):
    """ZeRO 1 and 2 (and DeepSpeed's bf16 optimizer): the torch optimizer steps one flat fp32
    partition per group; DeepSpeed's tensor-fragment map says which stretch of p it holds, and
    where, and where the reduced gradient of that stretch is."""
    m = p._hp_mapping
    if m is None:  # no element of p in this rank's partition
        return None
    group = basic.param_groups[m.param_group_index]
    (flat,) = group["params"]
    found = _adam_state(basic, flat, group)
    if found is None:
        return _NO_STATE
    v, step, beta2 = found
    hp, lp = m.hp_fragment_address, m.lp_fragment_address

    def grad() -> torch.Tensor:
        g = m.get_lp_grad_fragment(p._index_in_param_group).reshape(-1)
        # the bf16 optimizer keeps a whole accumulation buffer per rank
        return g.narrow(0, lp.start, lp.numel) if g.numel() == p.numel() and g.numel() != lp.numel else g

    return Fragment(index, lp.start, v.narrow(0, hp.start, hp.numel), step, beta2, group["eps"], grad)


def _zero3(optimizer, basic, index: int, p: nn.Parameter):
    """ZeRO 3: rank r holds elements [r k, (r + 1) k) of every flattened parameter (k its
    partition size, the last one padded), in the flat fp32 partition of its sub-group."""
    from deepspeed.utils import safe_get_local_grad

    sub_group, offset, k = optimizer.grad_position[optimizer.get_param_id(p)]
    flat = optimizer.fp32_partitioned_groups_flat[sub_group]
    group = basic.param_groups[optimizer.sub_group_to_group_id[sub_group]]
    found = _adam_state(basic, flat, group)
    if found is None:
        return _NO_STATE
    v, step, beta2 = found
    start = dist.get_rank(group=p.ds_process_group) * k
    count = min(k, p.ds_numel - start)
    if count <= 0:  # only padding here
        return None
    return Fragment(
        index,
        start,
        v.narrow(0, offset, count),
        step,
        beta2,
        group["eps"],
        lambda: safe_get_local_grad(p).reshape(-1).narrow(0, 0, count),
    )
