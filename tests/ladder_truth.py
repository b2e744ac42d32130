"""Known-truth ladders: rungs of model size N and budget D whose optimal batch size, learning rate
and critical batch size follow power laws the world was built with, for testing what the ladder
analysis (orchestrator/analysis/ladder.py) concludes from their tables.

Each rung is a from-scratch sweep over batch size B (tokens per update), learning rate and seeds in
the progress model of tests/known_truth.py, with its schedule (World.schedule: warmup a share of
the budget, then wsd). An update at lr multiplier m lowers the excess loss E = L - floor(N) by

    rate x luck x E^exponent x gain(lr m / lr_step(B)) / (1 + B_noise / B)

with gain a bell in log lr (or known_truth's own, `lr_response`), and the world integrates that
exactly between updates (E has a closed form in the summed progress, so a run of 40,000 updates is
a cumulative sum, not a Python loop); a run whose loss climbs a unit above its start fails. Three
things are set per rung, so that the optima are the laws:

- B_noise = c D^delta: then the steps between two losses at the best lr are S_min (1 + B_noise / B)
  exactly, so the truth of B_crit is B_noise (as in tests/known_truth.py);
- lr_step(B) = lr_law(N, D, B) / f*, f* the peak-lr multiple that maximises the summed gain over
  the schedule: then the best peak lr for the final loss at every B is lr_law(N, D, B) =
  a N^alpha D^beta (B / B_opt)^eta (eta = 0: the lr does not depend on B);
- the rate, solved so that the final loss at the best lr crosses (1 + tolerance) x the best batch
  size's at B_opt = b D^gamma (the rule of orchestrator/analysis/optimal_batch.py).

`curvature` multiplies all three laws by exp(curvature (ln D / D_ref)^2): a bend no power law has.
The truth at any (N, D) is *measured* by brute force on the world's own noise-free final loss
(`truth`: the best final loss per batch size, over the lr by golden section, on a fine log grid of
batch sizes from B_noise / 64, the rule's crossing by bisection), not read off the laws; the tests
check that the two agree.

A ladder writes what a trainer would: trials.csv rows carrying `model.params` and
`train.total_tokens`, curves.csv rows, read back through orchestrator/analysis/tables.trials_from.
Per rung: batch sizes in powers of two from below B_opt / 12 to above 3 B_noise; per batch size the
three values of one lr grid, fixed across rungs and batch sizes (factor sqrt(2)), around its best
lr, extended as a bracket search extends them until the seeds' best is interior; `seeds`
replicates. Pure numpy.

Not here, and in a real ladder: seeds that move the final loss by as much as the tolerance (here
0.02% of it, the tolerance 0.5%), a best lr that drifts along training, laws that bend (but
`curvature`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Dict, List, Sequence, Tuple

import numpy as np

from tests.known_truth import Run, Series, World, curve_rows, factor_grid, read_back

GOLDEN = (math.sqrt(5) - 1) / 2
MAX_EXTENSIONS = 3


@dataclass(frozen=True)
class Truth:
    """The world's optima at one (N, D), by brute force."""

    b_opt: float
    lr_opt: float
    b_crit: float
    final_loss: float  # noise-free, at the best batch size and lr: the reference of B_opt


@dataclass(frozen=True)
class LadderWorld:
    name: str = "power-law"
    params: Tuple[int, ...] = (100_000, 177_828, 316_228)
    """Model sizes a quarter decade apart (whole counts, as trials.csv holds them)."""
    tokens_per_param: Tuple[float, ...] = (2.5, 2.5 * 10**0.25, 2.5 * 10**0.5)
    target_scale: float = 10.0
    """The target's N and D are this many times the largest rung's: 2 decades of compute beyond it."""
    b_crit_at_ref: float = 1536.0
    b_crit_d: float = 0.5
    b_opt_at_ref: float = 768.0
    b_opt_d: float = 0.57
    lr_at_ref: float = 3e-3
    lr_n: float = -0.713
    lr_d: float = 0.307
    lr_b: float = 0.0
    """eta: the best lr at B is lr_opt (B / B_opt)^eta (0.5: square-root scaling)."""
    lr_factor: float = math.sqrt(2)
    """The lr grid's factor, one grid for every rung and batch size. (On a factor-2 grid the loss of
    the best lr tried misses the best loss by a share that differs between rungs, which moved a
    rung's B_opt by up to 7% with no noise at all; on a factor-sqrt(2) grid, 2%.)"""
    curvature: float = 0.0
    """A bend of all three laws in log D (module docstring)."""
    lr_response: str = "symmetric"
    """symmetric: gain exp(-(ln f)^2 / 2), a bell in log lr (a factor 2 off the best lr, either way,
    costs 0.5% of the final loss); known-truth: tests/known_truth.World's gain="log", the same below
    the best lr but zero at 3x it (a factor 2 above costs 1.3%)."""
    floor_at_ref: float = 2.0
    floor_n: float = -0.05
    loss_start: float = 5.5
    exponent: float = 1.5
    warmup_share: float = 0.03
    wsd_decay_share: float = 0.2
    min_lr_ratio: float = 0.1
    tolerance: float = 0.005
    """The B_opt rule's tolerance the world is built for (the analysis's default)."""
    seeds: int = 2
    seed_noise: float = 0.02
    """Log-normal spread of a seed's rate."""
    eval_noise: float = 0.0002
    """Independent noise of each eval/loss point: small, since the eval set is the same for every
    run and its own sampling error is shared by all of them."""
    update_noise: float = 0.3
    """A train/loss point's noise is update_noise / sqrt(B)."""
    max_points: int = 120
    evals: int = 8
    draw: int = 0

    # ---------------------------------------------------------------- the design

    def rungs(self) -> List[Tuple[float, int]]:
        return [(n, int(round(n * r))) for n in self.params for r in self.tokens_per_param]

    @property
    def target_params(self) -> float:
        return max(self.params) * self.target_scale

    @property
    def target_tokens(self) -> int:
        return max(d for _, d in self.rungs()) * int(self.target_scale)

    @property
    def n_ref(self) -> float:
        return float(np.exp(np.mean(np.log(self.params))))

    @property
    def d_ref(self) -> float:
        return float(np.exp(np.mean([math.log(d) for _, d in self.rungs()])))

    def _bend(self, tokens: float) -> float:
        return math.exp(self.curvature * math.log(tokens / self.d_ref) ** 2)

    def b_noise(self, tokens: float) -> float:
        return self.b_crit_at_ref * (tokens / self.d_ref) ** self.b_crit_d * self._bend(tokens)

    def b_opt_law(self, params: float, tokens: float) -> float:
        return self.b_opt_at_ref * (tokens / self.d_ref) ** self.b_opt_d * self._bend(tokens)

    def lr_law(self, params: float, tokens: float, batch: float = None) -> float:
        """The best peak lr for the final loss at batch `batch` (at B_opt by default)."""
        at_b_opt = (
            self.lr_at_ref
            * (params / self.n_ref) ** self.lr_n
            * (tokens / self.d_ref) ** self.lr_d
            * self._bend(tokens)
        )
        return at_b_opt if batch is None else at_b_opt * (batch / self.b_opt_law(params, tokens)) ** self.lr_b

    def floor(self, params: float) -> float:
        return self.floor_at_ref * (params / self.n_ref) ** self.floor_n

    def with_(self, **changes) -> "LadderWorld":
        return replace(self, **changes)

    # ---------------------------------------------------------------- the dynamics

    def schedule_world(self, tokens: int) -> World:
        """The rung's schedule and lr response, as tests/known_truth.World has them."""
        return World(
            total_tokens=int(tokens),
            warmup_tokens=int(self.warmup_share * tokens),
            decay="wsd",
            wsd_decay_share=self.wsd_decay_share,
            min_lr_ratio=self.min_lr_ratio,
            gain="log",  # what lr_response="known-truth" uses
        )

    def multipliers(self, tokens: int, batch: float) -> np.ndarray:
        """The lr multiplier of every update of a run at `batch` (the update s ends at (s + 1) B)."""
        steps = int(tokens // batch)
        return self.schedule_world(tokens).schedule((np.arange(steps) + 1.0) * batch)

    def gain(self, f: np.ndarray) -> np.ndarray:
        if self.lr_response == "symmetric":
            return np.exp(-0.5 * np.log(np.maximum(f, 1e-12)) ** 2)
        return self.schedule_world(1).gain_of(f)

    def excess(self, params: float, rate: np.ndarray, progress: np.ndarray) -> np.ndarray:
        """E after summed progress P (per unit rate): the exact solution of dE = -rate E^e dP."""
        e, start = self.exponent, self.loss_start - self.floor(params)
        base = start ** (1 - e) + (e - 1) * rate * progress
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(base > 0, np.maximum(base, 1e-300) ** (-1 / (e - 1)), np.inf)

    def knee(self, tokens: float, batch: float) -> float:
        return 1.0 + self.b_noise(tokens) / batch

    def peak_multiple(self, tokens: int, batch: float) -> Tuple[float, float]:
        """(f*, G*): the peak-lr multiple of lr_step that maximises the summed gain over the
        schedule, and that sum."""
        return _peak_multiple(self.with_(draw=0), int(tokens), float(batch))

    def best_progress(self, tokens: int, batch: float) -> float:
        """The summed progress at the best peak lr (per unit rate)."""
        return self.peak_multiple(tokens, batch)[1] / self.knee(tokens, batch)

    def rate(self, params: float, tokens: int) -> float:
        return _rate(self.with_(draw=0), params, tokens)

    def final_loss(self, params: float, tokens: int, batch: float) -> float:
        """The noise-free final loss at the best peak lr (luck 1)."""
        progress = self.best_progress(tokens, batch)
        return float(self.floor(params) + self.excess(params, self.rate(params, tokens), np.array(progress)))

    def final_loss_at(self, params: float, tokens: int, batch: float, lr: float) -> float:
        """The noise-free final loss of a run at peak lr `lr` (luck 1)."""
        lr_step = self.lr_law(params, tokens, batch) / self.peak_multiple(tokens, batch)[0]
        progress = self.gain(lr * self.multipliers(tokens, batch) / lr_step).sum() / self.knee(tokens, batch)
        return float(self.floor(params) + self.excess(params, self.rate(params, tokens), np.array(progress)))

    def truth(self, params: float, tokens: int) -> Truth:
        return _truth(self.with_(draw=0), params, int(tokens))

    # ---------------------------------------------------------------- runs

    def batches(self, params: float, tokens: int) -> List[int]:
        low = 2 ** math.floor(math.log2(self.b_opt_law(params, tokens) / 12))
        high = 2 ** math.ceil(math.log2(3 * self.b_noise(tokens)))
        return [int(b) for b in factor_grid(low, high)]

    def lr_steps(self, params: float, tokens: int, batch: float) -> List[int]:
        """The three steps k of the lr grid (lr = lr_factor^k) around the best lr at `batch`."""
        nearest = round(math.log(self.lr_law(params, tokens, batch)) / math.log(self.lr_factor))
        return [nearest - 1, nearest, nearest + 1]

    def run(self, params: float, tokens: int, batch: int, lr: float, seed: int) -> Run:
        rng = np.random.default_rng(
            [self.draw, int(params), int(tokens), batch, int(round(math.log2(lr) * 1e6)) % 2**31, seed]
        )
        luck = math.exp(self.seed_noise * rng.standard_normal())
        multipliers = self.multipliers(tokens, batch)
        f_star = self.peak_multiple(tokens, batch)[0]
        lr_step = self.lr_law(params, tokens, batch) / f_star
        gain = self.gain(lr * multipliers / lr_step)
        progress = np.r_[0.0, np.cumsum(gain)] / self.knee(tokens, batch)  # after s updates
        losses = self.floor(params) + self.excess(params, self.rate(params, tokens) * luck, progress)
        bad = np.flatnonzero(~(losses < self.loss_start + 1.0))
        failed = len(bad) > 0
        last = int(bad[0]) - 1 if failed else len(losses) - 1
        # losses[s] is the loss of the weights after s updates, logged at s B (before update s + 1);
        # the point at the budget is the final weights' (what the evaluation sees).
        updates = np.arange(max(last, 1))
        keep = np.unique(np.r_[updates[:: max(1, len(updates) // self.max_points)], updates[-1]])
        noisy = losses[keep] + self.update_noise / math.sqrt(batch) * rng.standard_normal(len(keep))
        train = list(zip((keep * batch).tolist(), noisy.tolist()))
        every = max(1, len(losses) // self.evals)
        at = np.array(sorted({*range(every, last + 1, every), *([last] if not failed else [])}), np.int64)
        evals = list(zip((at * batch).tolist(), (losses[at] + self.eval_noise * rng.standard_normal(len(at))).tolist()))
        name = f"N={params:.4g} D={tokens} B={batch} lr={lr:.4g} seed={seed}"
        return Run(batch, lr, seed, train, evals, [], "FAILED" if failed else "FINISHED", name)

    def rung_runs(self, params: float, tokens: int) -> List[Run]:
        """Per batch size the three lrs around its best; then, as a bracket search does, one more lr
        beyond whichever edge the seeds' mean final loss puts the best at, until it is interior (at
        most MAX_EXTENSIONS more)."""
        runs = []
        for b in self.batches(params, tokens):
            tried = {k: self._seeds(params, tokens, b, k) for k in self.lr_steps(params, tokens, b)}
            for _ in range(MAX_EXTENSIONS):
                best = min(tried, key=lambda k: np.mean([r.final_loss for r in tried[k]]))
                if min(tried) < best < max(tried):
                    break
                outward = best - 1 if best == min(tried) else best + 1
                tried[outward] = self._seeds(params, tokens, b, outward)
            runs += [r for k in sorted(tried) for r in tried[k]]
        return runs

    def _seeds(self, params: float, tokens: int, batch: int, step: int) -> List[Run]:
        return [self.run(params, tokens, batch, float(self.lr_factor**step), s) for s in range(self.seeds)]

    def tables(self, rungs: Sequence[Tuple[float, int]] = ()) -> Tuple[List[Dict[str, object]], List[tuple]]:
        """(rows of trials.csv, rows of curves.csv) of every rung (or of `rungs`)."""
        trials, series = self.series(rungs)
        return trials, curve_rows(series)

    def series(self, rungs: Sequence[Tuple[float, int]] = ()) -> Tuple[List[Dict[str, object]], List[Series]]:
        """(rows of trials.csv, each run's logged curves) of every rung (or of `rungs`)."""
        trials, series = [], []
        for params, tokens in rungs or self.rungs():
            world = self.schedule_world(tokens)
            for r in self.rung_runs(params, tokens):
                trials.append({"trial": r.name, "status": r.status, **world.params(r), "model.params": int(params)})
                series += [(r.name, "train/loss", r.train), (r.name, "eval/loss", r.eval)]
        return trials, series

    def trials(self, rungs: Sequence[Tuple[float, int]] = ()):
        """The ladder as the analysis reads it, through the tables' own reader."""
        return read_back(*self.series(rungs))


# ---------------------------------------------------------------- calibration and brute force (cached)


@functools.lru_cache(maxsize=None)
def _peak_multiple(world: LadderWorld, tokens: int, batch: float) -> Tuple[float, float]:
    """Golden section on log f of the summed gain over the run's multipliers (unimodal in f)."""
    multipliers = world.multipliers(tokens, batch)
    ramps = multipliers[multipliers != 1.0]  # warmup and decay; the stable updates all gain the same
    stable = len(multipliers) - len(ramps)
    gain = world.gain

    def total(log_f: float) -> float:
        f = math.exp(log_f)
        return float(stable * gain(np.array(f)) + gain(f * ramps).sum())

    lo, hi = math.log(0.3), math.log(3.0)
    a, b = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
    fa, fb = total(a), total(b)
    for _ in range(40):
        if fa > fb:
            hi, b, fb = b, a, fa
            a = hi - GOLDEN * (hi - lo)
            fa = total(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + GOLDEN * (hi - lo)
            fb = total(b)
    best = (a + b) / 2
    return math.exp(best), total(best)


@functools.lru_cache(maxsize=None)
def _rate(world: LadderWorld, params: float, tokens: int) -> float:
    """The rate at which the rule's B_opt (reference: the best batch size from B_noise / 64 up) is
    the law's: the upper root in log rate of loss(B_opt) = (1 + tolerance) loss(reference), where
    runs are well trained (at a low rate everything is within tolerance too, untrained)."""
    reference = world.best_progress(tokens, world.b_noise(tokens) / 64)
    at_b_opt = world.best_progress(tokens, world.b_opt_law(params, tokens))
    floor, tol = world.floor(params), world.tolerance

    def gap(log_rate):
        rate = np.exp(log_rate)
        e_opt, e_ref = world.excess(params, rate, at_b_opt), world.excess(params, rate, reference)
        return (floor + e_opt) - (1 + tol) * (floor + e_ref)

    grid = np.linspace(-30.0, 30.0, 6001)
    values = gap(grid)
    top = int(np.argmax(values))
    if values[top] <= 0:
        raise ValueError(f"no rate puts B_opt at the law for N={params}, D={tokens}")
    above = top + int(np.argmax(values[top:] < 0))
    lo, hi = grid[above - 1], grid[above]
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) > 0 else (lo, mid)
    return float(math.exp((lo + hi) / 2))


@functools.lru_cache(maxsize=None)
def _truth(world: LadderWorld, params: float, tokens: int) -> Truth:
    """B_opt by the rule on the world's own best final loss per batch size: the reference is the
    lowest loss over a log grid (8 a factor 2) from B_noise / 64 to 16 B_noise, the crossing of
    (1 + tolerance) x it by bisection in B; lr_opt the best peak lr there (golden section)."""
    b_noise = world.b_noise(tokens)
    grid = b_noise * 2.0 ** np.arange(-6.0, 4.0 + 1e-9, 0.125)
    losses = np.array([world.final_loss(params, tokens, b) for b in grid])
    best = int(np.argmin(losses))
    threshold = (1 + world.tolerance) * losses[best]
    inside = np.flatnonzero(losses <= threshold)
    j = int(inside.max())
    if j == len(grid) - 1:
        raise ValueError("B_opt beyond the brute-force grid")
    lo, hi = grid[j], grid[j + 1]
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if world.final_loss(params, tokens, mid) <= threshold else (lo, mid)
    b_opt = (lo + hi) / 2
    # The final loss depends on the lr only through the summed gain, which f* maximises: the best
    # peak lr at B is f* lr_step(B) = lr_law(N, D, B) (the tests check its neighbours are worse).
    return Truth(float(b_opt), world.lr_law(params, tokens, b_opt), b_noise, float(losses[best]))


WORLDS = {
    "power-law": LadderWorld(),
    "lr-depends-on-b": LadderWorld(name="lr-depends-on-b", lr_b=0.5),
    "curved": LadderWorld(name="curved", curvature=0.2),
}
"""(a) the laws as power laws; (b) the best lr also rising as sqrt(B / B_opt); (c) a bend in log D."""


def exponents(world: LadderWorld, law: str, batch_term: bool = False) -> Dict[str, float]:
    """The exponents a law of `law` (b_opt, b_crit, lr_opt) has in `world` (curvature 0), keyed as
    the analysis keys them; N is 0 for B_opt and B_crit. With a B term the lr law is at fixed B:
    lr = a N^alpha D^beta (B / b D^gamma)^eta has D's exponent beta - eta gamma there."""
    if law == "lr_opt" and batch_term:
        return {"N": world.lr_n, "D": world.lr_d - world.lr_b * world.b_opt_d, "B": world.lr_b}
    return {
        "b_opt": {"N": 0.0, "D": world.b_opt_d},
        "b_crit": {"N": 0.0, "D": world.b_crit_d},
        "lr_opt": {"N": world.lr_n, "D": world.lr_d},
    }[law]


def truth_at_target(world: LadderWorld) -> Dict[str, float]:
    """The brute-force optima at the world's target, by law name."""
    t = world.truth(world.target_params, int(world.target_tokens))
    return {"b_opt": t.b_opt, "b_crit": t.b_crit, "lr_opt": t.lr_opt}
