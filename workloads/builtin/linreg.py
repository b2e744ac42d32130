"""Linear regression: a workload whose gradient noise scale is known in closed form.

x ~ N(0, I_d), y = w*.x + e with e ~ N(0, sigma^2); loss per example (w.x - y)^2 / 2; w starts
at 0. Each example counts as one token, so B (tokens) = examples. With delta = w - w*, the
per-example gradient is g = x (x.delta - e), and for Gaussian x (Isserlis' theorem):

    E[g]      = E[x x^T] delta = delta
    E[g g^T]  = E[x x^T (x.delta)^2] + sigma^2 E[x x^T] = |delta|^2 I + 2 delta delta^T + sigma^2 I
    Sigma     = E[g g^T] - delta delta^T = (|delta|^2 + sigma^2) I + delta delta^T
    tr(Sigma) = d (|delta|^2 + sigma^2) + |delta|^2,   |G|^2 = |delta|^2

so B_simple = tr(Sigma) / |G|^2 is known at every w, and the measured gns/b_simple of a run
can be checked against it.
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import torch
import torch.nn as nn

# Separate random streams of one seed, so held-out data never overlaps training data.
_W_STAR, _TRAIN, _EVAL = 0, 1, 2


def _generator(seed: int, *stream: int) -> torch.Generator:
    """A torch Generator for (seed, stream...): SeedSequence mixes the integers well."""
    state = np.random.SeedSequence([seed, *stream]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class LinRegModel(nn.Module):
    """w in R^d, starting at 0; predicts w.x."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, 1, bias=False)
        nn.init.zeros_(self.linear.weight)

    @property
    def w(self) -> torch.Tensor:
        return self.linear.weight.detach().reshape(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, d] -> predictions [n]."""
        return self.linear(x).squeeze(-1)

    @staticmethod
    def token_losses(pred: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(sum over examples of (pred - y)^2 / 2, number of examples): one example, one token."""
        summed = 0.5 * (pred - y).square().sum()
        return summed, torch.tensor(float(y.numel()), device=y.device)


class LinRegData:
    """Deterministic examples: example k of the training stream depends only on (seed, k), so
    update u (examples [u N, (u+1) N)) holds the same examples however it is split into
    micro-batches, workers and accumulation steps, and runs at every batch size see the same
    examples at equal tokens."""

    BLOCK = 4096
    """Examples drawn per generator call: example k is in block k // BLOCK."""

    def __init__(self, dim: int, noise_std: float, w_star_norm: float, seed: int):
        self.dim, self.noise_std, self.seed = dim, noise_std, seed
        direction = torch.randn(dim, generator=_generator(seed, _W_STAR))
        self.w_star = direction / direction.norm() * w_star_norm
        self._blocks: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}

    def _examples(self, n: int, generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, self.dim, generator=generator)
        e = torch.randn(n, generator=generator) * self.noise_std
        return x, x @ self.w_star + e

    def _block(self, j: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if j not in self._blocks:
            # Keep only the neighbours: a worker walks the stream forwards.
            self._blocks = {k: v for k, v in self._blocks.items() if k >= j - 1}
            self._blocks[j] = self._examples(self.BLOCK, _generator(self.seed, _TRAIN, j))
        return self._blocks[j]

    def examples(self, first: int, count: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Examples [first, first + count) of the training stream: (x [count, d], y [count])."""
        if first < 0 or count < 1:
            raise ValueError(f"examples [{first}, {first + count}) are not a stretch of the stream")
        blocks = range(first // self.BLOCK, (first + count - 1) // self.BLOCK + 1)
        xs, ys = zip(*(self._block(j) for j in blocks))
        start = first - blocks.start * self.BLOCK
        return torch.cat(xs)[start : start + count], torch.cat(ys)[start : start + count]

    def update_batch(self, update_index: int, sequences_per_update: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """All examples (x [N, d], y [N]) of one update: stream examples [u N, (u+1) N)."""
        return self.examples(update_index * sequences_per_update, sequences_per_update)

    def micro_batch(
        self, update_index: int, sequences_per_update: int, slot_start: int, count: int
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Examples of global slots [slot_start, slot_start + count) of update `update_index`."""
        if not 0 <= slot_start <= slot_start + count <= sequences_per_update:
            raise ValueError(f"slots [{slot_start}, {slot_start + count}) outside the update's {sequences_per_update}")
        return self.examples(update_index * sequences_per_update + slot_start, count)

    def eval_batch(self, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """n fixed held-out examples (their own random stream; the same on every call)."""
        return self._examples(n, _generator(self.seed, _EVAL))


def closed_form(w, w_star, noise_std: float) -> Tuple[float, float, float]:
    """(|G|^2, tr(Sigma), B_simple) of the per-example gradient at w (see the module docstring).

    w, w_star: tensors or arrays of d numbers (any shape). Sigma is the per-example gradient
    covariance, so B_simple is in examples = tokens. At w = w* B_simple is infinite.
    """
    w = np.asarray(torch.as_tensor(w).detach().cpu(), dtype=np.float64).reshape(-1)
    w_star = np.asarray(torch.as_tensor(w_star).detach().cpu(), dtype=np.float64).reshape(-1)
    delta_sq = float(np.sum((w - w_star) ** 2))
    trace_sigma = w.size * (delta_sq + noise_std**2) + delta_sq
    b_simple = trace_sigma / delta_sq if delta_sq > 0 else float("inf")
    return delta_sq, trace_sigma, b_simple
