"""Is B_simple, or B_simple_adam, the critical batch size of AdamW? Steps to a target loss at the
best lr per batch size on linear regression, simulated in numpy (the trainer's AdamW update,
minibatch gradients), fitted as the report fits them (orchestrator/analysis/critical_batch.py),
beside the closed-form noise scales of the raw gradient (B_simple) and of the gradient as AdamW
preconditions it (B_simple_adam = tr(P Sigma P) / |P G|^2, P = 1 / (sqrt(v_hat) + eps) from the
run's own v: gns/b_simple_adam), at the target and averaged along the runs.

    python benchmarks/adam_linreg_bcrit.py [--json PATH] [--seeds 3]

Three optimizers x problems: AdamW as configured by default (beta 0.9 / 0.95, eps 1e-8) on the
workload's isotropic problem (x ~ N(0, I), d = 16, sigma = 1, |w*| = 1) and on a rotated one with
condition number 100; and AdamW with eps = 10, far above sqrt(v), which makes it SGD with
momentum, the optimizer McCandlish et al.'s B_crit ~ B_noise is derived for. Per batch size the
lr is the best of a log grid of 15 (mean steps over seeds). The noise scales are those of seed 0's
run at the best lr of each batch size: where it reaches the target, and averaged over its steps
from the one at which AdamW's v has averaged its memory (where the trainer starts measuring
gns/b_simple_adam); the median over the batch sizes (as the report reads B_simple), and at the
largest batch. No Ray, no DeepSpeed, no MLflow.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402

CASES = [  # name, condition number, eps, lowest lr of the grid, target loss (floor 0.5)
    ("adamw, isotropic", 1.0, 1e-8, 0.002, 0.55),
    ("adamw, condition 100", 100.0, 1e-8, 0.002, 0.53),
    ("adamw eps=10 (sgd + momentum), isotropic", 1.0, 10.0, 0.1, 0.55),
]
BATCHES = (8, 16, 32, 64, 128, 256)


def problem(condition: float, d: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    lam = np.geomspace(1.0, 1.0 / condition, d)
    lam *= d / lam.sum()  # mean eigenvalue 1, as the isotropic problem
    rotation, _ = np.linalg.qr(rng.standard_normal((d, d)))
    w_star = rng.standard_normal(d)
    return rotation @ np.diag(lam) @ rotation.T, rotation @ np.diag(np.sqrt(lam)), w_star / np.linalg.norm(w_star)


BETA2, MEMORY = 0.95, 20  # AdamW's beta2 and its memory 1 / (1 - beta2), in updates


def run_to(target, batch, lr, eps, h, root, w_star, seed, sigma=1.0, most=3000, watch=None):
    """Updates AdamW took to reach `target` (None: not within `most`) on minibatches of `batch`;
    `watch(w, v, t)` sees the weights and the second moment before every update t + 1."""
    rng, d = np.random.default_rng(seed), len(w_star)
    w, m, v = np.zeros(d), np.zeros(d), np.zeros(d)
    for t in range(1, most + 1):
        if watch:
            watch(w, v, t - 1)
        x = rng.standard_normal((batch, d)) @ root.T
        g = x.T @ (x @ (w - w_star) - sigma * rng.standard_normal(batch)) / batch
        m, v = 0.9 * m + 0.1 * g, BETA2 * v + (1 - BETA2) * g * g
        w = w - lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - BETA2**t)) + eps)
        if 0.5 * ((w - w_star) @ h @ (w - w_star) + sigma**2) <= target:
            if watch:
                watch(w, v, t)
            return t
    return None


def noise_scales(w, v, t, eps, h, w_star, sigma=1.0):
    """(B_simple, B_simple_adam) at w, with P from v after t updates. For x ~ N(0, H) the
    per-example gradient's covariance is Sigma = (delta' H delta + sigma^2) H + H delta delta' H
    (Isserlis), so tr(Sigma) = (delta' H delta + sigma^2) tr(H) + |G|^2 and tr(P Sigma P) =
    (delta' H delta + sigma^2) sum_i P_i^2 H_ii + |P G|^2, with G = H delta."""
    delta = w - w_star
    grad, spread = h @ delta, delta @ h @ delta + sigma**2
    p = 1 / (np.sqrt(v / (1 - BETA2**t)) + eps)
    b_simple = (spread * np.trace(h) + grad @ grad) / (grad @ grad)
    b_adam = (spread * (p * p * np.diag(h)).sum() + (p * grad) @ (p * grad)) / ((p * grad) @ (p * grad))
    return float(b_simple), float(b_adam)


def scales_along(target, batch, lr, eps, h, root, w_star) -> np.ndarray:
    """[(B_simple, B_simple_adam), ...] of seed 0's run before each of its updates from AdamW's
    memory on, and where it reaches the target (the last)."""
    path = []
    run_to(target, batch, lr, eps, h, root, w_star, 0, watch=lambda w, v, t: path.append((w.copy(), v.copy(), t)))
    return np.array([noise_scales(w, v, t, eps, h, w_star) for w, v, t in path[MEMORY:] or path[-1:]])


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args(argv)

    from orchestrator.analysis import critical_batch as cb

    load_before, started = os.getloadavg()[0], time.perf_counter()
    header = ("case", "target", "steps at B = 8 .. 256", "B_crit", "S_min")
    rows = [(*header, "B_simple at target: largest B, median", "along", "B_simple_adam at target", "along")]
    out = {}
    for name, condition, eps, lr0, target in CASES:
        h, root, w_star = problem(condition)
        best = {}
        for b in BATCHES:
            for lr in np.geomspace(lr0, lr0 * 100, 15):
                steps = [run_to(target, b, lr, eps, h, root, w_star, seed) for seed in range(args.seeds)]
                if all(s is not None for s in steps) and (b not in best or np.mean(steps) < best[b][0]):
                    best[b] = (float(np.mean(steps)), float(lr))
        sizes = sorted(best)
        fit = cb.fit(sizes, np.array([[best[b][0] for b in sizes]]))
        scales = {}  # per batch size: (B_simple, B_simple_adam) at the target and averaged along
        for b in sizes:
            values = scales_along(target, b, best[b][1], eps, h, root, w_star)
            scales[b] = {"at_target": values[-1].tolist(), "along": values.mean(0).tolist()}
        median = {k: np.median([scales[b][k] for b in sizes], axis=0).tolist() for k in ("at_target", "along")}
        out[name] = {
            "target": target,
            "steps": {b: best[b][0] for b in sizes},
            "lr": {b: best[b][1] for b in sizes},
            "b_crit": float(fit.b_crit[0]),
            "s_min": float(fit.s_min[0]),
            "b_simple": scales[sizes[-1]]["at_target"][0],  # at the largest batch, as first recorded
            "noise_scales": scales,
            "median": median,  # over batch sizes: [B_simple, B_simple_adam]
        }
        steps = ", ".join(f"{best[b][0]:.0f}" for b in sizes)
        largest = scales[sizes[-1]]["at_target"]
        rows.append(
            (
                name,
                f"{target}",
                steps,
                f"{fit.b_crit[0]:,.0f}",
                f"{fit.s_min[0]:.1f}",
                f"{largest[0]:,.0f}, {median['at_target'][0]:,.0f}",
                f"{median['along'][0]:,.0f}",
                f"{largest[1]:,.0f}, {median['at_target'][1]:,.0f}",
                f"{median['along'][1]:,.0f}",
            )
        )
    common.print_table(rows)
    result = {
        "benchmark": "adam_linreg_bcrit",
        "cases": out,
        "seeds": args.seeds,
        "wall_s": time.perf_counter() - started,
        "machine": common.machine(load_before),
    }
    return common.finish(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
