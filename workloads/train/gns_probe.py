"""Per-micro-batch gradient norms for the gradient noise scale, under any ZeRO stage.

A hook on every parameter sees the gradient that one backward produces for it, before
DeepSpeed accumulates, reduces or partitions anything: exactly the 'small batch' gradient of
McCandlish et al. The probe sums its squared norm over parameters for each micro-batch, and,
with an AdamPreconditioner ready (adam_precondition.py), the squared norm of the gradient as
AdamW scales it, P g; the math that turns these into B_simple lives in
orchestrator/formulas/noise.py.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import nn

from workloads.train.adam_precondition import AdamPreconditioner


def grad_squared_norm(grad: torch.Tensor) -> torch.Tensor:
    """The squared norm of one gradient, accumulated in fp32, left on its device."""
    return torch.linalg.vector_norm(grad.detach(), dtype=torch.float32).square()


class GradNormProbe:
    def __init__(self, model: nn.Module):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.adam: Optional[AdamPreconditioner] = None
        """Set once the engine exists (AdamW runs): the preconditioned norms too."""
        self._parts: List[torch.Tensor] = []
        self._adam_parts: List[torch.Tensor] = []
        self._handles = [p.register_hook(self._hook_for(i)) for i, p in enumerate(self.params)]

    def _hook_for(self, index: int):
        def hook(grad: torch.Tensor) -> None:
            # Norms, squared in squared_norms(): as few calls per parameter as can be, and they
            # stay on the gradient's device (one host sync per micro-batch, in squared_norms()).
            self._parts.append(torch.linalg.vector_norm(grad, dtype=torch.float32))
            if self.adam is not None and self.adam.ready:
                self._adam_parts.append(torch.linalg.vector_norm(grad * self.adam.scales[index], dtype=torch.float32))

        return hook

    def start(self) -> None:
        self._parts, self._adam_parts = [], []

    def squared_norms(self) -> Tuple[float, float]:
        """Squared norms of the gradient of the backward since start(): as it is, and as AdamW
        preconditions it (NaN while the preconditioner is not ready)."""
        if not self._parts:
            return 0.0, float("nan")
        raw = torch.stack(self._parts).double().square().sum()
        if not self._adam_parts:
            return float(raw), float("nan")
        adam = torch.stack(self._adam_parts).double().square().sum()
        raw, adam = torch.stack([raw, adam]).tolist()  # one host sync for both
        return raw, adam

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles: List = []
