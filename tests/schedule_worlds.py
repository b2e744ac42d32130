"""Worlds for judging a branch study's choice of batch schedule (orchestrator/analysis/branch_schedule.py)
against the best fixed batch, every schedule's final loss known: issue 54's acceptance worlds.

Each world is a noisy quadratic, L(w) = 1/2 sum_i h_i e_i^2 (e = w - w*), whose minibatch of B
examples (tokens) sees the exact gradient H e plus Gaussian noise of variance s_i^2 / B along
eigenvector i. A schedule is batch.ramp's [(from_tokens, tokens_per_update), ...]; each stretch
trains at the base lr times (B / B0)^alpha, as the branch study's branches and its suggested ramp do.
A world lays out conf/sweep/branches.yaml's study (branch points at 1/16, 1/4 and 11/16 of the
budget, branches 5/16 of it long, factors 1 to 16) and hands the analysis what the report reads:
the base run's train-loss curve and each branch's end loss with an eval standard error (drawn).

- `SGDWorld`: SGD; its expected loss is the exact second-moment recursion (tests/branch_truth.py's:
  m_i -> (1 - lr h_i)^2 m_i + lr^2 s_i^2 / B, in closed form for any real number of steps), so every
  schedule's loss is exact. s_i^2 = noise x h_i (a Fisher-like noise). The base lr is the best of a
  grid for the base batch at the budget. With alpha 1 the branches scale the lr linearly, with 0.5
  as its square root. `no_pay` has almost no noise (B_noise far under the base batch), so the base's
  best lr is at the stiffest direction's stability edge already: a larger batch cannot raise the
  lr, buys nothing per update and costs tokens.
- `AdamWorld`: Adam (beta1 0.9, beta2 0.95, bias corrections, a 5 % linear warmup then a constant
  lr) over 32 directions with curvatures across 3.5 decades and noise drawn log-uniformly over 2
  decades independently of them (not proportional to curvature). Its second moment v is an EMA of
  the gradient's expected square, so v lags a change of batch by its 1 / (1 - beta2) updates as
  Adam's does, but is not itself random (the mean-field Adam of SDE analyses, e.g. Malladi et al.
  2022); given v the update is linear, so the second moments of (e, m) follow an exact recursion
  and every schedule's expected loss is exact. A simulation over seeds cannot judge 0.1 %: its
  standard error at 1,024 seeds was about 1 % of the loss.

Branches end at their exact expected loss plus the eval noise and, with `branch_noise`, a training
noise of their own that no standard error holds (one seed per branch; on branches.yaml's study it
was about the eval's standard error, docs/branches.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

import numpy as np

from orchestrator.analysis.answer import ScheduleChoice
from orchestrator.analysis.branch_cbs import BranchEnd

Schedule = Sequence[Tuple[float, float]]

SHARES = (1 / 16, 1 / 4, 11 / 16)
"""conf/sweep/branches.yaml's branch points as shares of its budget (16k, 64k, 176k of 256k)."""
BRANCH_SHARE = 5 / 16
"""Its branches' length as a share of the budget (80k of 256k)."""
FACTORS = (1, 2, 4, 8, 16)
EVAL_SE = 0.003
"""A branch end's eval standard error, relative to its loss: the shipped study's (about 0.3 %)."""


def branch_study(world, rng: np.random.Generator, curve: Tuple[np.ndarray, np.ndarray]) -> Study:
    """branches.yaml's layout on `world` (its `loss(schedule, tokens)`): at each of SHARES a branch
    at every factor for BRANCH_SHARE of the budget, each end measured (measured_end)."""
    length = int(BRANCH_SHARE * world.total_tokens)
    ends, tokens = [], {}
    for share in SHARES:
        at = int(share * world.total_tokens)
        tokens[at] = length
        for k in FACTORS:
            true = world.loss([(0, world.base_batch), (at, k * world.base_batch)], at + length)
            ends.append(measured_end(at, k * world.base_batch, true, world.branch_noise, rng))
    return Study(ends, tokens, curve)


def measured_end(at: int, batch: int, true: float, branch_noise: float, rng: np.random.Generator) -> BranchEnd:
    """A branch's end as the report reads it: its exact loss plus the eval's noise (its standard
    error given) and, with `branch_noise`, a training noise of its own the standard error does not
    hold (a branch of one seed)."""
    if not math.isfinite(true):
        return BranchEnd(at, batch, true, 0.0)
    eval_noise, training_noise = rng.standard_normal(2)
    se = EVAL_SE * true
    return BranchEnd(at, batch, true + se * eval_noise + branch_noise * true * training_noise, se)


def stretches(schedule: Schedule, total: float) -> List[Tuple[float, float, float]]:
    """(start, end, batch) of each stretch of the schedule before `total`."""
    steps = sorted((float(t), float(b)) for t, b in schedule)
    ends = [t for t, _ in steps[1:]] + [total]
    return [(t, min(end, total), b) for (t, b), end in zip(steps, ends) if t < total]


@dataclass(frozen=True)
class Study:
    """What the report reads of a branch study in a world."""

    ends: List[BranchEnd]
    branch_tokens: Dict[int, int]
    curve: Tuple[np.ndarray, np.ndarray]
    """The base run's train loss: (tokens, loss)."""


@dataclass(frozen=True)
class SGDWorld:
    draw: int
    alpha: float = 1.0
    no_pay: bool = False
    branch_noise: float = 0.0
    """A branch's own training noise (sd, relative to its loss), in no standard error: one seed."""
    base_batch: int = 16
    total_tokens: int = 16 * 4096
    dims: int = 48
    lr: float = field(init=False)
    h: np.ndarray = field(init=False, repr=False)
    s2: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.draw, 54])
        decades = rng.uniform(2.5, 3.5)
        h = np.logspace(-decades, 0, self.dims)
        noise = 10 ** rng.uniform(-5, -4) if self.no_pay else 10 ** rng.uniform(-0.5, 0.5)
        object.__setattr__(self, "h", h)
        object.__setattr__(self, "s2", noise * h)
        grid = 2.0 ** np.arange(-8, 1, 0.25)
        losses = [self._run_with(lr, [(0, self.base_batch)]) for lr in grid]
        object.__setattr__(self, "lr", float(grid[int(np.argmin(losses))]))

    def _moments(self, m: np.ndarray, lr: float, batch: float, steps: float) -> np.ndarray:
        a = (1 - lr * self.h) ** 2
        c = lr * lr * self.s2 / batch
        decay = a**steps
        with np.errstate(divide="ignore", invalid="ignore"):
            floor = np.where(a == 1, c * steps, c * (1 - decay) / (1 - a))
        return decay * m + floor

    def _run_with(self, lr0: float, schedule: Schedule, tokens: float = None) -> float:
        m = np.ones(self.dims)
        for start, end, batch in stretches(schedule, self.total_tokens if tokens is None else tokens):
            lr = lr0 * (batch / self.base_batch) ** self.alpha
            if lr * self.h.max() >= 2:
                return math.inf
            m = self._moments(m, lr, batch, (end - start) / batch)
        return float(0.5 * (self.h * m).sum())

    def loss(self, schedule: Schedule, tokens: float = None) -> float:
        """The exact expected loss after `tokens` (default the budget)."""
        return self._run_with(self.lr, schedule, tokens)

    def study(self) -> Study:
        grid = np.arange(0, self.total_tokens + 1, self.total_tokens // 64)[1:]
        curve = (grid.astype(float), np.array([self.loss([(0, self.base_batch)], t) for t in grid]))
        return branch_study(self, np.random.default_rng([self.draw, 55]), curve)


BETA1, BETA2, EPS = 0.9, 0.95, 1e-8
WARMUP_SHARE = 0.05
REWARM = math.ceil(1 / (1 - BETA2))
"""`rewarm`'s updates: the second moment's settling time (studies/branch_study.settling_updates)."""
CHANGES = ("jump", "rewarm", "half_life", "restart_v", "rescale_v")
"""How a change of batch is made: `jump` the lr steps to its new peak, Adam's state carried (the
trainer's); `rewarm` the lr moves linearly from the old peak to the new over REWARM updates;
`half_life` beta2 re-resolved at the change to keep its memory in tokens (0.95^(B / B0));
`restart_v` the second moment zeroed and its bias correction counted from the change; `rescale_v`
the second moment times B_old / B_new, as its noise part scales."""


@dataclass(frozen=True)
class AdamWorld:
    draw: int
    alpha: float = 0.5
    base_batch: int = 16
    total_tokens: int = 16 * 2048
    dims: int = 32
    noise: float = 1.0
    """The per-example noise's scale: s_i^2 is `noise` x 10^U(0, 2)."""
    branch_noise: float = 0.0
    """As SGDWorld's."""
    lr: float = field(init=False)
    h: np.ndarray = field(init=False, repr=False)
    s2: np.ndarray = field(init=False, repr=False)
    e0: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.draw, 56])
        object.__setattr__(self, "h", np.logspace(-3.5, 0, self.dims))
        object.__setattr__(self, "s2", self.noise * 10.0 ** rng.uniform(0, 2, self.dims))
        object.__setattr__(self, "e0", rng.standard_normal(self.dims))
        grid = 1e-3 * 2.0 ** np.arange(0, 10.25, 0.25)
        losses = [self._run(lr, [(0, self.base_batch)]) for lr in grid]
        object.__setattr__(self, "lr", float(grid[int(np.argmin(losses))]))

    def _run(
        self, lr0: float, schedule: Schedule, until: float = None, every: float = None, way: str = "jump", trace=None
    ):
        """The expected loss at `until` (default the budget), or with `every` the (tokens, loss)
        after each update: the second moments of (e, m) per direction, updated exactly given v.
        `way`: how a change of batch is made (CHANGES); `trace`: a list that receives v after each
        update."""
        if way not in CHANGES:
            raise ValueError(f"way is one of {', '.join(CHANGES)}, got {way!r}")
        h, s2 = self.h, self.s2
        ee, em, mm, v = self.e0**2, np.zeros(self.dims), np.zeros(self.dims), np.zeros(self.dims)
        tokens, t1, t2, curve = 0.0, 0, 0, []
        a, beta2, previous, changed = 1 - BETA1, BETA2, None, 0
        for _, end, batch in stretches(schedule, self.total_tokens if until is None else until):
            peak = lr0 * (batch / self.base_batch) ** self.alpha
            if previous is not None:
                changed, old_peak = t1, lr0 * (previous / self.base_batch) ** self.alpha
                if way == "restart_v":
                    v, t2 = np.zeros(self.dims), 0
                elif way == "rescale_v":
                    v = v * previous / batch
                elif way == "half_life":
                    beta2 = BETA2 ** (batch / self.base_batch)
            previous, noise = batch, s2 / batch
            while tokens < end - 1e-9:
                lr = peak * min(1.0, (tokens + batch) / (WARMUP_SHARE * self.total_tokens))
                if way == "rewarm" and changed and t1 - changed < REWARM:
                    lr = old_peak + (lr - old_peak) * (t1 - changed + 1) / REWARM
                t1, t2 = t1 + 1, t2 + 1
                v = beta2 * v + (1 - beta2) * (h * h * ee + noise)  # E g^2, the second moment's mean
                if trace is not None:
                    trace.append(v)
                c = lr / (1 - BETA1**t1) / (np.sqrt(v / (1 - beta2**t2)) + EPS)
                keep = 1 - c * a * h  # e' = keep e - c beta1 m - c a xi;  m' = a h e + beta1 m + a xi
                ee, em, mm = (
                    keep**2 * ee + (c * BETA1) ** 2 * mm - 2 * keep * c * BETA1 * em + (c * a) ** 2 * noise,
                    keep * (a * h * ee + BETA1 * em) - c * BETA1 * (a * h * em + BETA1 * mm) - c * a * a * noise,
                    (a * h) ** 2 * ee + BETA1**2 * mm + 2 * a * h * BETA1 * em + a * a * noise,
                )
                tokens += batch
                if every is not None:
                    curve.append((tokens, float(0.5 * (h * ee).sum())))
        return curve if every is not None else float(0.5 * (h * ee).sum())

    def loss(self, schedule: Schedule, tokens: float = None, way: str = "jump") -> float:
        """The exact expected loss at `tokens` (default the budget), each change of batch made `way`."""
        loss = self._run(self.lr, schedule, tokens, way=way)
        return loss if math.isfinite(loss) else math.inf

    def study(self) -> Study:
        curve = np.array(self._run(self.lr, [(0, self.base_batch)], every=self.base_batch))
        return branch_study(self, np.random.default_rng([self.draw, 57]), (curve[:, 0], curve[:, 1]))


# ---------------------------------------------------------------- the study's choice, judged


@dataclass(frozen=True)
class Judged:
    """A world's study, its choice, and that choice's true loss against the best fixed batch."""

    chosen: str
    chosen_ramp: List[Tuple[int, int]]
    chosen_updates: int
    chosen_loss: float
    best_fixed_batch: int
    best_fixed_loss: float
    best_fixed_updates: int
    ramp: List[Tuple[int, int]]
    """The suggested ramp (branch_ramp.suggested_ramp), chosen or not."""
    ramp_loss: float
    choice: ScheduleChoice
    """branch_schedule.compare's record."""

    @property
    def excess(self) -> float:
        """The choice's true loss over the best fixed batch's, relative."""
        return self.chosen_loss / self.best_fixed_loss - 1

    def holds(self, tolerance: float) -> bool:
        """Within `tolerance` of the best fixed batch's loss at no more updates."""
        return self.excess <= tolerance and self.chosen_updates <= self.best_fixed_updates


def judge(world, trained: bool = False) -> Judged:
    """The branch study of `world` analysed as the report does, and its choice judged exactly.
    `trained`: the study compared with a sweep of every factor trained from the start to the budget
    (branch.compare_with), each run's and the base's final loss measured with the eval's noise."""
    from orchestrator.analysis import branch_cbs, branch_ramp, branch_schedule

    study = world.study()
    along = branch_cbs.critical_batch_along(study.ends)
    fit = branch_ramp.power_law_fit(along)
    ramp = branch_ramp.suggested_ramp(along, fit, world.base_batch, world.total_tokens, 1, 1)
    pairs = [(s["from_tokens"], s["tokens_per_update"]) for s in ramp]
    fixed = {k: world.loss([(0, k * world.base_batch)]) for k in FACTORS}
    runs = trained_runs(world, fixed, np.random.default_rng([world.draw, 58])) if trained else ()
    choice = branch_schedule.choice_of(
        study.ends, study.branch_tokens, study.curve, pairs, world.base_batch, world.total_tokens, trained=runs
    )
    best = min(fixed, key=lambda k: fixed[k])
    chosen = [tuple(s) for s in choice.chosen_ramp]
    return Judged(
        chosen=choice.chosen,
        chosen_ramp=chosen,
        chosen_updates=branch_schedule.updates(chosen, world.total_tokens),
        chosen_loss=world.loss(chosen),
        best_fixed_batch=best * world.base_batch,
        best_fixed_loss=fixed[best],
        best_fixed_updates=world.total_tokens // (best * world.base_batch),
        ramp=pairs,
        ramp_loss=world.loss(pairs),
        choice=choice,
    )


def trained_runs(world, fixed: Dict[int, float], rng: np.random.Generator) -> list:
    """Every factor above 1 trained from the start to the budget at the lr x k^alpha, its final loss
    and the base's measured as the study reads them (branch_analysis.trained_fixed)."""
    from orchestrator.analysis.branch_schedule import Trained

    l0 = fixed[1] * (1 + EVAL_SE * rng.standard_normal())
    runs = []
    for k in FACTORS[1:]:
        loss = fixed[k] * (1 + EVAL_SE * rng.standard_normal())
        runs.append(Trained.of(k * world.base_batch, world.lr * k**world.alpha, loss, EVAL_SE * loss, l0, EVAL_SE * l0))
    return runs


def true_critical_batch(world, at: int, tolerance: float = 0.01) -> float:
    """The critical batch size at branch point `at` in tokens per update, as the study defines it
    but on exact losses: the smallest real factor up to the largest branched whose branch ends more
    than `tolerance` (relative) above the factor-1 branch, by bisection in log k after a scan for the
    first crossing; infinite when none does."""
    length = int(BRANCH_SHARE * world.total_tokens)
    reference = world.loss([(0, world.base_batch)], at + length)

    def beyond(log_k: float) -> bool:
        end = world.loss([(0, world.base_batch), (at, math.exp(log_k) * world.base_batch)], at + length)
        return end - reference > tolerance * reference

    grid = np.linspace(0.0, math.log(FACTORS[-1]), 41)
    hits = [x for x in grid[1:] if beyond(x)]
    if not hits:
        return math.inf
    hi = hits[0]
    lo = grid[int(np.searchsorted(grid, hi)) - 1]
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if beyond(mid) else (mid, hi)
    return world.base_batch * math.exp(0.5 * (lo + hi))
