"""Is B_simple the critical batch size of AdamW? Steps to a target loss at the best lr per batch
size on linear regression, simulated in numpy (the trainer's AdamW update, minibatch gradients),
fitted as the report fits them (orchestrator/analysis/critical_batch.py), beside the closed-form B_simple
at the target.

    python benchmarks/adam_linreg_bcrit.py [--json PATH] [--seeds 3]

Three optimizers x problems: AdamW as configured by default (beta 0.9 / 0.95, eps 1e-8) on the
workload's isotropic problem (x ~ N(0, I), d = 16, sigma = 1, |w*| = 1) and on a rotated one with
condition number 100; and AdamW with eps = 10, far above sqrt(v), which makes it SGD with
momentum, the optimizer McCandlish et al.'s B_crit ~ B_noise is derived for. Per batch size the
lr is the best of a log grid of 15 (mean steps over seeds). No Ray, no DeepSpeed, no MLflow.
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


def run_to(target, batch, lr, eps, h, root, w_star, seed, sigma=1.0, most=3000):
    """(updates AdamW took to reach `target`, or None; the weights then) on minibatches of `batch`."""
    rng, d = np.random.default_rng(seed), len(w_star)
    w, m, v = np.zeros(d), np.zeros(d), np.zeros(d)
    for t in range(1, most + 1):
        x = rng.standard_normal((batch, d)) @ root.T
        g = x.T @ (x @ (w - w_star) - sigma * rng.standard_normal(batch)) / batch
        m, v = 0.9 * m + 0.1 * g, 0.95 * v + 0.05 * g * g
        w = w - lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.95**t)) + eps)
        if 0.5 * ((w - w_star) @ h @ (w - w_star) + sigma**2) <= target:
            return t, w
    return None, w


def b_simple(w, h, w_star, sigma=1.0) -> float:
    """tr(Sigma) / |G|^2 at w: ((delta' H delta + sigma^2) tr(H) + |H delta|^2) / |H delta|^2."""
    delta = w - w_star
    grad = h @ delta
    return float(((delta @ h @ delta + sigma**2) * np.trace(h) + grad @ grad) / (grad @ grad))


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args(argv)

    from orchestrator.analysis import critical_batch as cb

    load_before, started = os.getloadavg()[0], time.perf_counter()
    rows, out = [("case", "target", "steps at B = 8 .. 256", "B_crit", "S_min", "B_simple at target")], {}
    for name, condition, eps, lr0, target in CASES:
        h, root, w_star = problem(condition)
        best = {}
        for b in BATCHES:
            for lr in np.geomspace(lr0, lr0 * 100, 15):
                steps = [run_to(target, b, lr, eps, h, root, w_star, seed)[0] for seed in range(args.seeds)]
                if all(s is not None for s in steps) and (b not in best or np.mean(steps) < best[b][0]):
                    best[b] = (float(np.mean(steps)), float(lr))
        sizes = sorted(best)
        fit = cb.fit(sizes, np.array([[best[b][0] for b in sizes]]))
        # The closed form where the largest batch's best run reaches the target.
        at_target = b_simple(run_to(target, sizes[-1], best[sizes[-1]][1], eps, h, root, w_star, 0)[1], h, w_star)
        out[name] = {
            "target": target,
            "steps": {b: best[b][0] for b in sizes},
            "lr": {b: best[b][1] for b in sizes},
            "b_crit": float(fit.b_crit[0]),
            "s_min": float(fit.s_min[0]),
            "b_simple": at_target,
        }
        steps = ", ".join(f"{best[b][0]:.0f}" for b in sizes)
        rows.append((name, f"{target}", steps, f"{fit.b_crit[0]:,.0f}", f"{fit.s_min[0]:.1f}", f"{at_target:,.0f}"))
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
