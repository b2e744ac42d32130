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

from typing import Optional, Tuple

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
    """Deterministic examples: update u's global batch depends only on (seed, u), never on
    how the update is split into micro-batches, workers and accumulation steps."""

    def __init__(self, dim: int, noise_std: float, w_star_norm: float, seed: int):
        self.dim, self.noise_std, self.seed = dim, noise_std, seed
        direction = torch.randn(dim, generator=_generator(seed, _W_STAR))
        self.w_star = direction / direction.norm() * w_star_norm
        self._cache: Optional[Tuple[Tuple[int, int], torch.Tensor, torch.Tensor]] = None

    def _examples(self, n: int, generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, self.dim, generator=generator)
        e = torch.randn(n, generator=generator) * self.noise_std
        return x, x @ self.w_star + e

    def update_batch(self, update_index: int, sequences_per_update: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """All examples (x [N, d], y [N]) of one update, from one generator seeded by (seed, update)."""
        key = (update_index, sequences_per_update)
        if self._cache is None or self._cache[0] != key:
            # d is small, so regenerating the whole update and slicing it is cheap; the cache
            # makes it once per update for the A micro-batches a worker draws from it.
            self._cache = (key, *self._examples(sequences_per_update, _generator(self.seed, _TRAIN, update_index)))
        return self._cache[1], self._cache[2]

    def micro_batch(self, update_index: int, sequences_per_update: int, slot_start: int, count: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Examples of global slots [slot_start, slot_start + count) of update `update_index`."""
        if not 0 <= slot_start <= slot_start + count <= sequences_per_update:
            raise ValueError(f"slots [{slot_start}, {slot_start + count}) outside the update's {sequences_per_update}")
        x, y = self.update_batch(update_index, sequences_per_update)
        return x[slot_start : slot_start + count], y[slot_start : slot_start + count]

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
