"""Per-micro-batch gradient norms for the gradient noise scale, under any ZeRO stage.

A hook on every parameter sees the gradient that one backward produces for it, before
DeepSpeed accumulates, reduces or partitions anything: exactly the 'small batch' gradient of
McCandlish et al. The probe sums its squared norm over parameters for each micro-batch; the
math that turns these into B_simple lives in orchestrator/formulas/noise.py.
"""

from __future__ import annotations

from typing import List

import torch
from torch import nn


def grad_squared_norm(grad: torch.Tensor) -> torch.Tensor:
    """The squared norm of one gradient, accumulated in fp32, left on its device."""
    return torch.linalg.vector_norm(grad.detach(), dtype=torch.float32).square()


class GradNormProbe:
    def __init__(self, model: nn.Module):
        self._parts: List[torch.Tensor] = []
        self._handles = [p.register_hook(self._hook) for p in model.parameters() if p.requires_grad]

    def _hook(self, grad: torch.Tensor) -> None:
        # Stays on the gradient's device: one host sync per micro-batch, in squared_norm().
        self._parts.append(grad_squared_norm(grad))

    def start(self) -> None:
        self._parts = []

    def squared_norm(self) -> float:
        """Squared norm of the gradient of the backward since start()."""
        return float(torch.stack(self._parts).double().sum()) if self._parts else 0.0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles: List = []
