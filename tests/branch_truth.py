"""Branch studies whose critical batch size is known: SGD on a noisy quadratic, its expected loss
from the exact second-moment recursion (no simulation error), for testing what
orchestrator/analysis/branch_cbs.py and branch_ramp.py conclude.

The loss is L(w) = 1/2 sum_i h_i e_i^2 (e = w - w*), with Hessian eigenvalues h_i log-spaced over
three decades; each example's gradient carries noise of variance sigma_i^2 = noise x h_i along
eigenvector i, so a batch of B examples (tokens) averages it to sigma_i^2 / B. One SGD step at lr
and batch B maps the second moment m_i = E[e_i^2] to (1 - lr h_i)^2 m_i + lr^2 sigma_i^2 / B, so
after n steps m_i = a^n m_i + c (1 - a^n) / (1 - a), a = (1 - lr h_i)^2, c = lr^2 sigma_i^2 / B: an
exact expected loss for any real n, so for any real batch.

A base run at B0 and lr0 reaches the branch point t; a branch at k x B0 trains `share` x t more
tokens at lr0 x k^alpha (alpha 1: linear scaling; 0.5: sqrt). The truth is the smallest real k at
which the branch's expected end loss exceeds the factor-1 branch's by the tolerance, found by
bisection; a measured branch end is the expected loss plus noise of a stated standard error (an
eval set's), drawn per draw and seed. Pure numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import List, Optional, Sequence

import numpy as np

from orchestrator.analysis.branch_cbs import BranchEnd


@dataclass(frozen=True)
class QuadraticBranches:
    dims: int = 64
    noise: float = 1.0
    base_batch: int = 4
    lr: float = 0.05
    alpha: float = 1.0
    """The branches' lr scaling exponent: lr0 x k^alpha."""
    share: float = 0.05
    """Branch length as a share of the tokens at the branch point."""
    se: float = 0.0
    """Standard error of a measured end loss, relative to the factor-1 branch's expected loss."""

    @property
    def curvatures(self) -> np.ndarray:
        return np.logspace(-3, 0, self.dims)

    def _moments(self, m: np.ndarray, lr: float, batch: float, steps: float) -> np.ndarray:
        h = self.curvatures
        a = (1 - lr * h) ** 2
        c = lr * lr * self.noise * h / batch
        decay = a**steps
        return decay * m + c * (1 - decay) / (1 - a)

    def expected_loss(self, tokens: float, factor: float) -> float:
        """The expected loss at the end of the branch at `factor` x B0 from the branch point `tokens`
        (inf where its lr is past the stability edge lr h = 2 of the stiffest direction)."""
        lr = self.lr * factor**self.alpha
        if lr * self.curvatures.max() >= 2:
            return math.inf
        base = self._moments(np.ones(self.dims), self.lr, self.base_batch, tokens / self.base_batch)
        batch = factor * self.base_batch
        end = self._moments(base, lr, batch, self.share * tokens / batch)
        return float(0.5 * (self.curvatures * end).sum())

    def truth(self, tokens: float, tolerance: float = 0.01, absolute: bool = False) -> Optional[float]:
        """The critical batch size (tokens per update) at `tokens`: the smallest real factor whose
        excess over factor 1 passes the tolerance (relative, or absolute in loss), by bisection
        in log factor after a scan for the first crossing; None below a factor of 64."""
        reference = self.expected_loss(tokens, 1.0)
        threshold = tolerance if absolute else tolerance * reference

        def beyond(log_k: float) -> bool:
            return self.expected_loss(tokens, math.exp(log_k)) - reference > threshold

        grid = np.linspace(0.0, math.log(64), 400)
        hits = [x for x in grid if beyond(x)]
        if not hits:
            return None
        hi = hits[0]
        lo = grid[max(0, int(np.searchsorted(grid, hi)) - 1)]
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if beyond(mid) else (mid, hi)
        return self.base_batch * math.exp(0.5 * (lo + hi))

    def ends(self, tokens: int, factors: Sequence[int], draw: int, seeds: int = 1) -> List[BranchEnd]:
        """The branches' measured end losses at one branch point: expected loss plus N(0, se)."""
        rng = np.random.default_rng([draw, int(tokens)])
        scale = self.se * self.expected_loss(tokens, 1.0)
        return [
            BranchEnd(
                int(tokens),
                int(k * self.base_batch),
                self.expected_loss(tokens, k) + scale * rng.standard_normal(),
                scale,
                s,
            )
            for k in factors
            for s in range(seeds)
        ]

    def with_(self, **changes) -> "QuadraticBranches":
        return replace(self, **changes)
