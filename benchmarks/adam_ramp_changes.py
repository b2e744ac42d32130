"""What a batch change costs AdamW, and which way of making it costs least (issue 54, "changes that
do not shock Adam"): on an anisotropic noisy quadratic, a ramp that doubles the batch twice against
the fixed batches it passes through, with each change made four ways.

    python benchmarks/adam_ramp_changes.py [--draws 3] [--seeds 512] [--json PATH]

The world: L(w) = 1/2 sum_i h_i e_i^2 over 32 directions, curvatures h_i log-spaced over 3.5
decades, per-example gradient noise of variance s_i^2 drawn log-uniformly over 2 decades
independently of h_i (not proportional to curvature, as a Fisher would be), so a batch of B
examples sees H e plus Gaussian noise of variance s_i^2 / B. AdamW as the trainer runs it (beta1
0.9, beta2 0.95, eps 1e-8, bias corrections, no weight decay), a linear warmup over 5 % of the
budget then a constant lr, many seeds at once; a schedule's loss is the mean over the seeds of the
loss at the budget (the seeds share their noise draws across schedules: common random numbers).

The arms, on one token budget: fixed B0, 2 B0 and 4 B0 from the start, and the ramp B0 -> 2 B0 at a
third of the budget -> 4 B0 at two thirds; every batch at the lr B0's best lr x sqrt(B / B0)
(the branch study's sqrt scaling). The ramp's change made as:

- `jump`: the lr steps to its new value at the change, Adam's state carried (what the trainer does);
- `rewarm`: the lr moves linearly from the old value to the new over 1 / (1 - beta2) updates;
- `restart_v`: Adam's second moment restarted at the change (zeroed, with its bias correction
  counted from the change), so it averages the new batch's gradients only;
- `half_life`: beta2 re-resolved at the change from a half-life in tokens (the one beta2 0.95 has
  at B0), as optim.beta2_half_life_tokens would be if it were resolved at each change: beta2 =
  0.95^(B / B0), the same memory in tokens.

Prints per draw and arm the loss over the best fixed batch's (in %) and the steps; the question is
which change closes the ramp's gap to the fixed batch it ends at. Numpy; about 5 minutes at the
defaults on 2 cores (each draw's lr grid is most of it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from orchestrator.studies.branch_study import settling_updates  # noqa: E402

BETA1, BETA2, EPS = 0.9, 0.95, 1e-8
B0 = 16.0
BUDGET = 16.0 * 4096  # 4,096 updates at B0
WARMUP_SHARE = 0.05
CHANGES = (1 / 3, 2 / 3)
WAYS = ("jump", "rewarm", "restart_v", "half_life")


@dataclass(frozen=True)
class World:
    draw: int
    dims: int = 32
    decades: float = 3.5
    noise_decades: float = 2.0
    seeds: int = 512

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.draw, 7])
        object.__setattr__(self, "h", np.logspace(-self.decades, 0, self.dims))
        object.__setattr__(self, "s2", 10.0 ** rng.uniform(0, self.noise_decades, self.dims))
        object.__setattr__(self, "e0", rng.standard_normal(self.dims))

    def loss(self, e: np.ndarray) -> float:
        return float((0.5 * (self.h * e * e).sum(-1)).mean())


def run(world: World, steps: Sequence[Tuple[float, float]], lr0: float, way: str = "jump") -> Tuple[float, int]:
    """The expected loss at the budget and the updates taken, for a schedule of (from_tokens,
    batch) steps, at lr lr0 x sqrt(B / B0) after a linear warmup."""
    rng = np.random.default_rng([world.draw, 11])
    e = np.tile(world.e0, (world.seeds, 1))
    m, v = np.zeros_like(e), np.zeros_like(e)
    beta2, t1, t2 = BETA2, 0, 0  # t1, t2: the updates each moment's bias correction counts
    tokens, updates, index = 0.0, 0, 0
    lr_from, change_update = None, 0
    rewarm = settling_updates(BETA2)
    while tokens < BUDGET - 1e-9:
        if index + 1 < len(steps) and tokens >= steps[index + 1][0] - 1e-9:
            index += 1
            lr_from, change_update = lr0 * np.sqrt(steps[index - 1][1] / B0), updates
            if way == "restart_v":
                v[:], t2 = 0.0, 0
            if way == "half_life":
                beta2 = BETA2 ** (steps[index][1] / B0)
        batch = steps[index][1]
        lr = lr0 * np.sqrt(batch / B0) * min(1.0, (tokens + batch) / (WARMUP_SHARE * BUDGET))
        if way == "rewarm" and lr_from is not None and updates - change_update < rewarm:
            share = (updates - change_update + 1) / rewarm
            lr = lr_from + (lr - lr_from) * share
        g = world.h * e + rng.standard_normal(e.shape) * np.sqrt(world.s2 / batch)
        t1, t2 = t1 + 1, t2 + 1
        m = BETA1 * m + (1 - BETA1) * g
        v = beta2 * v + (1 - beta2) * g * g
        m_hat = m / (1 - BETA1**t1)
        v_hat = v / (1 - beta2**t2)
        e = e - lr * m_hat / (np.sqrt(v_hat) + EPS)
        tokens += batch
        updates += 1
    return world.loss(e), updates


def best_lr(world: World) -> float:
    """B0's best lr over a grid a quarter octave apart (its fixed run's loss at the budget)."""
    grid = 1e-3 * 2.0 ** (np.arange(0, 33) / 4)
    losses = [run(world, [(0.0, B0)], lr)[0] for lr in grid]
    best = int(np.argmin(losses))
    if best in (0, len(grid) - 1):
        raise ValueError(f"draw {world.draw}: B0's best lr {grid[best]:.3g} is at the grid's edge")
    return float(grid[best])


def arms(world: World, lr0: float) -> Dict[str, Tuple[float, int]]:
    ramp = [
        (0.0, B0),
        (CHANGES[0] * BUDGET // (2 * B0) * 2 * B0, 2 * B0),
        (CHANGES[1] * BUDGET // (4 * B0) * 4 * B0, 4 * B0),
    ]
    out = {f"fixed {int(k)} B0": run(world, [(0.0, k * B0)], lr0) for k in (1, 2, 4)}
    out.update({f"ramp, {way}": run(world, ramp, lr0, way) for way in WAYS})
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=3)
    p.add_argument("--seeds", type=int, default=512)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    results: Dict[str, List[Tuple[float, int]]] = {}
    for draw in range(args.draws):
        world = World(draw, seeds=args.seeds)
        lr0 = best_lr(world)
        measured = arms(world, lr0)
        best = min(loss for name, (loss, _) in measured.items() if name.startswith("fixed"))
        print(f"draw {draw}: B0's best lr {lr0:.3g}; the best fixed batch's loss {best:.5g}")
        for name, (loss, steps) in measured.items():
            results.setdefault(name, []).append((100 * (loss / best - 1), steps))
            print(f"  {name:22s} {100 * (loss / best - 1):+7.3f} %  {steps:5d} steps")
    print("over the draws (loss over the best fixed batch's, median; steps):")
    for name, rows in results.items():
        print(f"  {name:22s} {statistics.median(r[0] for r in rows):+7.3f} %  {rows[0][1]:5d} steps")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
