"""AdamW's critical batch size on a noisy quadratic, simulated, beside the two noise scales the
trainer measures (gns/b_simple and gns/b_simple_adam), for testing which of them is closer.

The problem is the noisy quadratic of tests/branch_truth.py: L(w) = 1/2 sum_i h_i e_i^2 (e = w -
w*), Hessian eigenvalues h_i log-spaced over `decades` (an anisotropic Hessian), and per-example
gradient noise of variance noise x h_i along eigenvector i (the gradient covariance is
proportional to the Hessian, as a Fisher is), so a batch of B examples (tokens) sees the exact
gradient H e plus Gaussian noise of variance noise x h_i / B. AdamW (the trainer's update: beta1,
beta2, eps, bias corrections, no weight decay) runs on such minibatch gradients, many seeds at
once; its expected loss is the mean over the seeds.

The truth: per batch size, the fewest steps for the expected loss to reach the target over a
fine lr grid (a factor 2^(1/lr_per_octave) apart), fitted as the report fits them
(orchestrator/analysis/critical_batch.py: S = S_min (1 + B_crit / B)). The noise scales are taken
exactly, not estimated: on the run at the best lr, at the step where it reaches the target,

    B_simple      = tr(Sigma) / E|G|^2                        (Sigma = noise x H, G = H e)
    B_simple_adam = E tr(P Sigma P) / E|P G|^2                (P = 1 / (sqrt(v_hat) + eps), v before the step)
    B_noise_adam  = E tr(P H P Sigma) / E (G' P H P G)       (McCandlish's B_noise of the preconditioned step)

with E the mean over seeds (ratios of means, as the trainer's EMAs). The third needs the Hessian,
which a trainer does not have: it is the theory's answer for SGD preconditioned by P, beside the
two the trainer measures. Pure numpy.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import List, Optional, Sequence

import numpy as np

from orchestrator.analysis import critical_batch


@dataclass(frozen=True)
class AdamQuadratic:
    dims: int = 32
    decades: float = 2.0
    """The Hessian's condition number is 10^decades."""
    noise: float = 64.0
    """Per-example gradient variance along eigenvector i is noise x h_i."""
    target: float = 0.1
    """The loss to reach, as a share of the initial loss."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    seeds: int = 64
    lr_low: float = 1e-3
    lr_high: float = 1.0
    lr_per_octave: int = 4
    max_steps: int = 4000
    distance: float = 1.0
    """The start's e_i are Gaussian with this spread (one draw for every seed and batch size)."""
    seed: int = 0

    @property
    def curvatures(self) -> np.ndarray:
        return np.logspace(-self.decades, 0, self.dims)

    @property
    def lrs(self) -> np.ndarray:
        octaves = np.log2(self.lr_high / self.lr_low)
        return self.lr_low * 2.0 ** (np.arange(int(round(octaves * self.lr_per_octave)) + 1) / self.lr_per_octave)

    def initial(self) -> np.ndarray:
        """e at the start: a Gaussian draw along every eigenvector (not all alike: AdamW's first
        steps are nearly sign steps, which would zero equal e_i in one step of the right lr)."""
        return self.distance * np.random.default_rng([self.seed, 1 << 20]).standard_normal(self.dims)

    def loss(self, e: np.ndarray) -> np.ndarray:
        return 0.5 * (self.curvatures * e * e).sum(-1)


@dataclass(frozen=True)
class Scales:
    """The three noise scales (tokens), each a ratio of means over the seeds."""

    b_simple: float
    b_simple_adam: float
    b_noise_adam: float


@dataclass(frozen=True)
class Run:
    """AdamW at one batch size and its best lr."""

    batch: float
    lr: float
    steps: int
    """Steps for the expected loss to reach the target (the fewest over the lr grid)."""
    at_edge: bool
    """The best lr is the lowest or highest of the grid (the steps are then an upper bound)."""
    at_target: Scales
    """Where the run reaches the target."""
    along: Scales
    """Averaged over the run's steps to the target, from the one at which AdamW's v has
    averaged its memory (where the trainer starts measuring gns/b_simple_adam)."""


def simulate(world: AdamQuadratic, batch: float) -> Run:
    """The steps to the target at every lr of the grid at once; then the best lr's run again,
    with its noise scales at every step."""
    steps = _steps_to_target(world, batch, world.lrs)
    best = int(np.argmin(steps))
    if steps[best] > world.max_steps:
        raise ValueError(f"no lr reached the target within {world.max_steps} steps at B = {batch}")
    lr = float(world.lrs[best])
    path = []
    _steps_to_target(world, batch, np.array([lr]), lambda e, v, t: path.append(noise_scales(world, e[0], v[0], t)))
    memory = int(np.ceil(1 / (1 - world.beta2)))
    later = np.array([astuple(p) for p in path[memory:]] or [astuple(path[-1])])
    return Run(batch, lr, int(steps[best]), best in (0, len(steps) - 1), path[-1], Scales(*later.mean(0)))


def _steps_to_target(world: AdamQuadratic, batch: float, lrs: np.ndarray, watch=None) -> np.ndarray:
    """AdamW on minibatch gradients at each lr (the same noise for every lr, so lrs are compared
    on equal luck) until its expected loss reaches the target: the steps per lr (max_steps + 1
    where it did not). `watch(e, v, t)` sees the state before every step t + 1."""
    h = world.curvatures
    rng = np.random.default_rng([world.seed, int(batch)])
    e = np.broadcast_to(world.initial(), (len(lrs), world.seeds, world.dims)).copy()
    m, v = np.zeros_like(e), np.zeros_like(e)
    target = world.target * float(world.loss(world.initial()))
    sigma = np.sqrt(world.noise * h / batch)
    reached = np.full(len(lrs), world.max_steps + 1)
    for t in range(world.max_steps + 1):
        if watch:
            watch(e, v, t)
        reached = np.where((world.loss(e).mean(-1) <= target) & (reached > t), t, reached)
        if (reached <= t).all():
            break
        g = h * e + sigma * rng.standard_normal((world.seeds, world.dims))
        m = world.beta1 * m + (1 - world.beta1) * g
        v = world.beta2 * v + (1 - world.beta2) * g * g
        m_hat, v_hat = m / (1 - world.beta1 ** (t + 1)), v / (1 - world.beta2 ** (t + 1))
        e = e - lrs[:, None, None] * m_hat / (np.sqrt(v_hat) + world.eps)
        e = np.where(np.isfinite(e), e, np.inf)  # a diverged lr never reaches the target
    return reached


def noise_scales(world: AdamQuadratic, e: np.ndarray, v: np.ndarray, steps: int) -> Scales:
    """The noise scales over the seeds' e [seeds, d] and v [seeds, d] after `steps` AdamW steps
    (P from v before the next step; 1 before the first)."""
    h = world.curvatures
    sigma = world.noise * h  # the diagonal of Sigma
    g = h * e
    b_simple = sigma.sum() / (g * g).sum(-1).mean()
    p = 1 / (np.sqrt(v / (1 - world.beta2**steps)) + world.eps) if steps else np.ones_like(v)
    b_adam = (p * p * sigma).sum(-1).mean() / ((p * g) ** 2).sum(-1).mean()
    b_noise_adam = (p * p * h * sigma).sum(-1).mean() / (p * p * h * g * g).sum(-1).mean()
    return Scales(float(b_simple), float(b_adam), float(b_noise_adam))


@dataclass(frozen=True)
class Comparison:
    runs: List[Run]
    b_crit: float
    s_min: float

    def median(self, key: str, where: str = "at_target") -> float:
        """A noise scale (at the target, or `along` the runs), the median over batch sizes (as
        the report reads B_simple)."""
        return float(np.median([getattr(getattr(r, where), key) for r in self.runs]))

    def ratio(self, key: str, where: str = "at_target") -> float:
        """The median noise scale over B_crit."""
        return self.median(key, where) / self.b_crit


def compare(world: AdamQuadratic, batches: Sequence[float], runs: Optional[List[Run]] = None) -> Comparison:
    runs = runs or [simulate(world, b) for b in batches]
    fit = critical_batch.fit([r.batch for r in runs], np.array([[float(r.steps) for r in runs]]))
    return Comparison(runs, float(fit.b_crit[0]), float(fit.s_min[0]))
