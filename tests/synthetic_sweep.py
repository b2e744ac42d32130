"""Synthetic sweeps whose critical batch size is known, for the report tests and the interval
coverage benchmark.

The loss curves follow the empirical model exactly: a trial with batch B, learning rate lr and
seed k at optimizer step s has loss g(x) with progress x = s * q(lr / lr_opt(B)) * r_k /
(1 + B_CRIT / B), g decreasing. At the best lr (q = 1) the steps to reach any loss L are
S = g^-1(L) (1 + B_CRIT / B) / r_k = (S_min + E_min / B) / r_k with E_min / S_min = B_CRIT, for
every L. r_k = exp(SEED_NOISE * N(0, 1)) is a seed's luck. Other learning rates progress more
slowly (q < 1), so they are worse at every point.
"""

from __future__ import annotations

import math
from typing import List, Tuple

import numpy as np

from orchestrator import analysis

B_CRIT = 5000.0  # tokens
ALPHA, LR_AT_4096 = 0.5, 3e-3  # lr_opt(B) = LR_AT_4096 * (B / 4096)^ALPHA
BATCHES = [2**k for k in range(10, 16)]
LR_FACTORS = [2**-0.5, 1.0, 2**0.5]  # on the same sqrt(2) grid as lr_opt, so lrs share heatmap rows
SEEDS, SEED_NOISE = 3, 0.05
TOTAL_TOKENS = 2**22
L_INF, AMP, X0, POWER = 2.0, 8.0, 5.0, 0.7


def g(x):
    return L_INF + AMP / (1 + x / X0) ** POWER


def g_inverse(loss):
    return X0 * ((AMP / (loss - L_INF)) ** (1 / POWER) - 1)


def lr_opt(b):
    return LR_AT_4096 * (b / 4096) ** ALPHA


def trial(b, factor, seed, luck, diverge=False, stop_at=None, decay="constant"):
    """(params, train, eval, b_simple, status, stopped_at, duration_s) of one synthetic run."""
    lr = lr_opt(b) * factor
    q = 1.0 / (1.0 + 2.0 * math.log2(factor) ** 2)
    steps = TOTAL_TOKENS // b
    params = {
        "batch.tokens_per_update": str(b),
        "optim.lr": str(lr),
        "schedule.warmup_tokens": "0",
        "schedule.decay": decay,
        "schedule.wsd_decay_share": "0.2",
        "train.total_tokens": str(TOTAL_TOKENS),
        "train.total_tokens_rounded": str(TOTAL_TOKENS),
        "train.seed": str(seed),
        "data.seq_len": "128",
        "train.total_steps": str(steps),
        "train.run_name": f"B{b}-lr{lr:.3g}-s{seed}",
    }
    stride = max(1, steps // 200)
    train, evals, b_simple = [], [], []
    last = steps if stop_at is None else stop_at // b
    for s in sorted(set(range(stride, last + 1, stride)) | {last}):
        loss = g(s * q * luck / (1 + B_CRIT / b))
        if diverge and s > steps // 3:
            loss = loss + (s - steps // 3) * 0.5
        train.append((s * b, loss))
        b_simple.append((s * b, 1000.0 / (loss - L_INF)))
        if not diverge and s % max(stride, steps // 8) < stride:
            evals.append((s * b, loss + 0.05))
    status = "FAILED" if diverge else "KILLED" if stop_at else "FINISHED"
    return (
        params,
        train,
        evals,
        b_simple,
        status,
        stop_at,
        TOTAL_TOKENS / (1e4 * math.log2(b)),
    )  # bigger batches run faster


def specs(
    rng: np.random.Generator, seeds: int = SEEDS, noise: float = SEED_NOISE
) -> List[Tuple[int, float, int, float]]:
    """The full grid with `seeds` replicates, as (B, lr factor, seed, luck)."""
    return [
        (b, f, k, float(np.exp(noise * rng.standard_normal())))
        for b in BATCHES
        for f in LR_FACTORS
        for k in range(seeds)
    ]


def in_memory(grid, **kw) -> List[analysis.Trial]:
    out = []
    for i, (b, f, k, luck) in enumerate(grid):
        params, train, evals, b_simple, status, stopped, duration = trial(b, f, k, luck, **kw)
        out.append(
            analysis.Trial(
                f"run{i}", params["train.run_name"], status, params, train, evals, b_simple, duration, stopped
            )
        )
    return out
