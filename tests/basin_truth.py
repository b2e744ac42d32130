"""Known-truth ladders whose final loss has an interior minimum in batch size at fixed tokens and
whose best lr moves with B, as published language-model sweeps do (../shared/data): for testing
the loss surface (orchestrator/analysis/loss_surface.py), the laws of B* and of the penalty curve,
and the trade-off at a target (orchestrator/analysis/tradeoff.py) on worlds that are not the model
they fit.

The final loss of a run at model size N, budget D, batch B (tokens per update) and peak lr is

    L = L*(N, D) x (1 + P_B(ln(B / B*(N, D)); D)) x (1 + P_lr(ln(lr / lr*(N, D, B))))

- L*(N, D) = E + A N^-0.34 + G D^-0.28, a Chinchilla form (no power law in N and D);
- B*(N, D) = b D^0.5 N^-0.15 tokens, the loss-optimal batch;
- lr*(N, D, B) = a N^-0.713 D^0.307 (B / B*)^eta, the best lr at each B (eta = 0.35, as the
  published grids' basins tilt);
- P_B(u) = c_B (e^(s u) - 1 - s u) 2 / s^2, a "linex": c_B u^2 near B*, but exponential on one
  side and linear on the other (s > 0: steeper towards large batches), neither a quadratic nor a
  cubic in ln B; its skew s = skew - skew_d ln(D / D_ref) may drift with the budget (the published
  runs hint at a turn towards small batches at large budgets, within their noise), and its
  curvature c_B (D / D_ref)^curvature_d too: the shape is the same at every rung by default, the
  drifts are variants benchmarks/ladder_coverage.py measures;
- P_lr(v) = c_lr (e^(r v) - 1 - r v) 2 / r^2 with r = 1: steeper above the best lr than below.

So the truth at any (N, D) is in closed form: B*, lr*(B*), L*, and the penalty of a batch B at its
best lr, P_B(ln(B / B*)). Each configuration's final loss carries log-normal noise (`noise`, a
share of the loss, as a seed's; `seeds` replicates). Per rung, batch sizes in powers of two from
below B* / 4 to above 4 B*, and nine lrs a factor sqrt(2) apart around lr*(B*): a grid like the
published ones. A ladder writes what a trainer would: trials.csv rows (`model.params`,
`train.total_tokens`, `batch.tokens_per_update`, `optim.lr`, `train.seed`), each run's final loss as
its eval/loss at the budget, read back through orchestrator/analysis/tables. Pure numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Dict, List, Tuple

import numpy as np

from tests.known_truth import Series, curve_rows, read_back


@dataclass(frozen=True)
class BasinWorld:
    params: Tuple[int, ...] = (100_000_000, 200_000_000, 400_000_000)
    tokens_per_param: Tuple[float, ...] = (10.0, 20.0, 40.0)
    target_decades: float = 1.5
    """The target's compute is this many decades above the largest rung's (N and D alike)."""
    floor: float = 1.7
    a_n: float = 400.0
    a_d: float = 410.0
    b_star_at_ref: float = 300_000.0
    """B* in tokens at (N_ref, D_ref), the rungs' geometric means."""
    b_star_d: float = 0.5
    b_star_n: float = -0.15
    lr_at_ref: float = 6e-4
    lr_n: float = -0.713
    lr_d: float = 0.307
    eta: float = 0.35
    c_b: float = 0.006
    """P_B's curvature at B*: a factor 2 away costs about 0.29 %."""
    curvature_d: float = 0.0
    """c_B scales as (D / D_ref)^curvature_d."""
    skew: float = 0.4
    """s at D_ref: at 4 B* the penalty is 1.4 %, at B* / 4 1.0 %."""
    skew_d: float = 0.0
    """s falls by this per unit of ln D."""
    c_lr: float = 0.012
    lr_skew: float = 1.0
    noise: float = 0.001
    """Log-normal spread of a configuration's final loss per seed (0.1 % of it)."""
    seeds: int = 2
    draw: int = 0

    # ---------------------------------------------------------------- the design

    def rungs(self) -> List[Tuple[int, int]]:
        return [(n, int(round(n * r))) for n in self.params for r in self.tokens_per_param]

    @property
    def n_ref(self) -> float:
        return float(np.exp(np.mean(np.log(self.params))))

    @property
    def d_ref(self) -> float:
        return float(np.exp(np.mean([math.log(d) for _, d in self.rungs()])))

    @property
    def target(self) -> Tuple[float, float]:
        """(N, D): both the largest rung's times 10^(decades / 2)."""
        n, d = max(self.rungs(), key=lambda r: r[0] * r[1])
        k = 10 ** (self.target_decades / 2)
        return n * k, d * k

    def with_(self, **changes) -> "BasinWorld":
        return replace(self, **changes)

    # ---------------------------------------------------------------- the truth

    def loss_star(self, n: float, d: float) -> float:
        return self.floor + self.a_n * n**-0.34 + self.a_d * d**-0.28

    def b_star(self, n: float, d: float) -> float:
        return self.b_star_at_ref * (d / self.d_ref) ** self.b_star_d * (n / self.n_ref) ** self.b_star_n

    def lr_star(self, n: float, d: float, b: float = None) -> float:
        at_b_star = self.lr_at_ref * (n / self.n_ref) ** self.lr_n * (d / self.d_ref) ** self.lr_d
        return at_b_star if b is None else at_b_star * (b / self.b_star(n, d)) ** self.eta

    def s(self, d: float) -> float:
        return self.skew - self.skew_d * math.log(d / self.d_ref)

    def penalty(self, n: float, d: float, b) -> np.ndarray:
        """The true share of the loss lost at batch b (at its best lr) against B*."""
        curvature = self.c_b * (d / self.d_ref) ** self.curvature_d
        return _linex(np.log(np.asarray(b, np.float64) / self.b_star(n, d)), curvature, self.s(d))

    def final_loss(self, n: float, d: float, b, lr) -> np.ndarray:
        """Noise-free."""
        v = np.log(np.asarray(lr, np.float64) / self.lr_star(n, d, np.asarray(b, np.float64)))
        return self.loss_star(n, d) * (1 + self.penalty(n, d, b)) * (1 + _linex(v, self.c_lr, self.lr_skew))

    # ---------------------------------------------------------------- runs

    def batches(self, n: float, d: float) -> List[int]:
        b = self.b_star(n, d)
        low, high = math.floor(math.log2(b / 4)), math.ceil(math.log2(4 * b))
        return [2**k for k in range(low, high + 1)]

    def lrs(self, n: float, d: float) -> List[float]:
        centre = round(math.log(self.lr_star(n, d)) / math.log(math.sqrt(2)))
        return [math.sqrt(2) ** k for k in range(centre - 4, centre + 5)]

    def rows(self, rungs=()) -> List[Dict[str, object]]:
        """One row per run: its params and final loss."""
        out = []
        for n, d in rungs or self.rungs():
            rng = np.random.default_rng([self.draw, n, d])
            for b in self.batches(n, d):
                for lr in self.lrs(n, d):
                    clean = float(self.final_loss(n, d, b, lr))
                    for seed in range(self.seeds):
                        loss = clean * math.exp(self.noise * rng.standard_normal())
                        out.append(
                            {
                                "trial": f"N={n} D={d} B={b} lr={lr:.4g} seed={seed}",
                                "status": "FINISHED",
                                "model.params": n,
                                "train.total_tokens": d,
                                "batch.tokens_per_update": b,
                                "optim.lr": lr,
                                "train.seed": seed,
                                "final": loss,
                            }
                        )
        return out

    def series(self, rungs=()) -> Tuple[List[Dict[str, object]], List[Series]]:
        """(rows of trials.csv, each run's logged curves): its final loss as its one eval/loss point
        at the budget, and a train/loss of two points (a published grid has no curves)."""
        rows, series = self.rows(rungs), []
        for r in rows:
            d, b, loss = int(r["train.total_tokens"]), int(r["batch.tokens_per_update"]), float(r.pop("final"))
            series += [
                (r["trial"], "train/loss", [(0, 2 * loss), (d - b, loss)]),
                (r["trial"], "eval/loss", [(d, loss)]),
            ]
        return rows, series

    def tables(self, rungs=()) -> Tuple[List[Dict[str, object]], List[tuple]]:
        """(rows of trials.csv, rows of curves.csv), as a trainer writes them."""
        rows, series = self.series(rungs)
        return rows, curve_rows(series)

    def trials(self, rungs=()):
        """The ladder as the analysis reads it, through the tables' own reader."""
        return read_back(*self.series(rungs))


def _linex(u: np.ndarray, curvature: float, skew: float) -> np.ndarray:
    """curvature u^2 near 0; (e^(s u) - 1 - s u) 2 / s^2 (s = skew)."""
    u = np.asarray(u, np.float64)
    if abs(skew) < 1e-9:
        return curvature * u * u
    return curvature * (np.expm1(skew * u) - skew * u) * 2 / skew**2


WORLDS = {
    "basin": BasinWorld(),
    "basin-one-seed": BasinWorld(seeds=1),
}
"""(a) two seeds per configuration; (b) one, as most published grids."""
