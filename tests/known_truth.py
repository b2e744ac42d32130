"""Simulated training whose noise scale is known, for testing what the analysis concludes.

The curves are *not* the hyperbola the analysis fits: they are McCandlish et al.'s (2018) model
of progress per optimizer step, integrated update by update. An update at batch B (tokens) and
learning rate lr lowers the loss by

    rate x luck x (L - floor)^exponent x gain(f) / knee(B_noise(L) / B),   f = lr / lr_opt(B, L)

with gain(f) = 2 f - f^2 (or a response smooth in log lr, or log-normal: `gain`), lr_opt(B, L) =
lr_max / knee(B_noise(L) / B) and knee(x) = (1 + x^k)^(1/k): k = 1 is the model the analysis
assumes, k > 1 a sharper knee, k < 1 a softer one. `shape: stretched` replaces the power law
(L - floor)^exponent by the rate of a stretched exponential, L - floor = A exp(-(P / tau)^beta) in
the progress P, so the curves are not power laws either. The learning rate follows
a real schedule in tokens (linear warmup, then constant, wsd, cosine or linear), so warmup steps make
less progress and an lr grid fixed across B misses lr_opt by a different factor at every B.
B_noise may rise as the loss falls: B_noise(L) = b_noise x ((loss_start - floor) / (L - floor))^rise.
A seed's luck multiplies its rate (log-normal; its spread may grow with B); every logged
`train/loss` point carries its own noise (update_noise / sqrt(B): a mean over B tokens). An lr
with f > 2 makes no progress and then diverges: the run fails; with `diverge_above` a run fails as
soon as f passes it (a run that diverges above 1.5x the optimal lr, say).

At the best lr and with a constant B_noise, the steps between two loss levels after warmup are
exactly S_min (1 + B_noise / B) for k = 1, so the truth is B_crit = B_noise; with a rising B_noise
the truth is its average along the path, weighted by the time spent at each loss.

A world writes what a trainer would: `tables()` gives the rows of trials.csv and curves.csv
(`orchestrator report DIR`'s format). Pure numpy; the trials of a world are integrated in lockstep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

BATCHES = (128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class World:
    b_noise: float = 700.0
    """Tokens; constant when rise = 0, else its value at loss_start."""
    rise: float = 0.0
    knee: float = 1.0
    gain: str = "quadratic"
    """quadratic: McCandlish's 2f - f^2 (progress quadratic in lr); log: smooth in log lr (a
    Gaussian of width 1 in ln f below the optimum, 1 - (ln f / ln 3)^2 above), so the analysis's
    lr interpolation is not the world's model either; lognormal: exp(-(ln f)^2 / (2 lr_width^2))."""
    lr_width: float = 1.0
    """The log-normal response's width in ln f."""
    diverge_above: float = math.inf
    """A run fails as soon as f = lr / lr_opt (with its schedule) passes this."""
    shape: str = "power"
    """power: progress rate (L - floor)^exponent; stretched: a stretched exponential's (`stretch`)."""
    stretch: float = 0.5
    lr_max: float = 0.02
    loss_start: float = 5.5
    floor: float = 2.0
    rate: float = 2.5e-3
    exponent: float = 1.5
    total_tokens: int = 2**20
    warmup_tokens: int = 2**15
    decay: str = "wsd"
    wsd_decay_share: float = 0.2
    min_lr_ratio: float = 0.1
    update_noise: float = 1.0
    """Per-token spread of the logged train loss; a point's noise is update_noise / sqrt(B)."""
    seed_noise: float = 0.05
    """Log-normal spread of a seed's progress rate at batch `seed_noise_at`."""
    seed_noise_growth: float = 0.0
    """The spread grows as (B / seed_noise_at)^growth (0.5: with sqrt(B))."""
    seed_noise_at: float = 128.0
    eval_every_tokens: int = 2**16
    report_every_tokens: int = 2**13
    max_points: int = 1500
    """train/loss points kept per trial (every update's loss, sub-sampled evenly)."""
    draw: int = 0
    """The random draw: seeds, luck and noise."""

    def b_noise_at(self, loss: np.ndarray) -> np.ndarray:
        if not self.rise:
            return np.full_like(loss, self.b_noise)
        return self.b_noise * ((self.loss_start - self.floor) / np.maximum(loss - self.floor, 1e-9)) ** self.rise

    def knee_of(self, x: np.ndarray) -> np.ndarray:
        return (1.0 + x**self.knee) ** (1.0 / self.knee)

    def gain_of(self, f: np.ndarray) -> np.ndarray:
        if self.gain == "quadratic":
            return 2 * f - f * f
        log_f = np.log(np.maximum(f, 1e-12))
        if self.gain == "lognormal":
            return np.exp(-0.5 * (log_f / self.lr_width) ** 2)
        return np.where(log_f < 0, np.exp(-0.5 * log_f**2), 1 - (log_f / math.log(3)) ** 2)

    def rate_of(self, loss: np.ndarray) -> np.ndarray:
        """Progress per unit of ideal progress at loss L (before the lr and batch factors)."""
        gap = np.maximum(loss - self.floor, 0.0)
        if self.shape == "power":
            return gap**self.exponent
        # L - floor = A exp(-(P / tau)^beta): dL/dP = -(L - floor) beta / tau (ln(A / (L - floor)))^(1 - 1/beta),
        # A = e (loss_start - floor) so the log is 1 at the start; scaled to the power law's rate there.
        span = self.loss_start - self.floor
        log_ratio = np.log(math.e * span / np.maximum(gap, 1e-12))
        return span**self.exponent * (gap / span) * log_ratio ** (1 - 1 / self.stretch)

    def lr_opt(self, batch: float, loss: Optional[float] = None) -> float:
        """The best learning rate at batch B and loss L (at loss_start by default)."""
        x = self.b_noise_at(np.array([self.loss_start if loss is None else loss])) / batch
        return float(self.lr_max / self.knee_of(x)[0])

    def schedule(self, tokens: np.ndarray) -> np.ndarray:
        """The LR multiplier of the update that ends at `tokens` (as the trainer: schedules.lr_at)."""
        t, total = np.asarray(tokens, np.float64), float(self.total_tokens)
        warm = np.minimum(1.0, t / self.warmup_tokens) if self.warmup_tokens else np.ones_like(t)
        if self.decay == "constant":
            after = np.ones_like(t)
        elif self.decay == "wsd":
            start = total * (1 - self.wsd_decay_share)
            frac = np.clip((t - start) / (total - start), 0.0, 1.0)
            after = 1.0 - (1.0 - self.min_lr_ratio) * frac
        else:
            frac = np.clip((t - self.warmup_tokens) / (total - self.warmup_tokens), 0.0, 1.0)
            if self.decay == "cosine":
                shape = 0.5 * (1 + np.cos(math.pi * frac))
            elif self.decay == "linear":
                shape = 1.0 - frac
            else:
                raise ValueError(f"decay {self.decay!r}: constant, wsd, cosine or linear")
            after = self.min_lr_ratio + (1 - self.min_lr_ratio) * shape
        return np.where(t < self.warmup_tokens, warm, after)

    # ---------------------------------------------------------------- runs

    def simulate(self, specs: Sequence[Tuple[int, float, int]]) -> List["Run"]:
        """Every (batch, lr, seed) of `specs`, integrated together, one update at a time."""
        batch = np.array([s[0] for s in specs], np.float64)
        lr = np.array([s[1] for s in specs], np.float64)
        seeds = [[self.draw, int(b), int(round(math.log2(r) * 1e6)) % 2**31, k] for b, r, k in specs]
        rngs = [np.random.default_rng(s) for s in seeds]
        spread = self.seed_noise * (batch / self.seed_noise_at) ** self.seed_noise_growth
        luck = np.exp(spread * np.array([g.standard_normal() for g in rngs]))
        steps = (self.total_tokens // batch).astype(int)
        loss = np.full(len(specs), self.loss_start)
        history = np.full((int(steps.max()) + 1, len(specs)), np.nan)
        failed = np.zeros(len(specs), bool)
        updates = np.arange(1, int(steps.max()) + 1)[:, None]
        within = updates <= steps  # [updates, specs]: the spec makes update s + 1
        multiplier = self.schedule(updates * batch)
        knee = self.knee_of(self.b_noise / batch)  # constant unless B_noise rises
        if not self.rise:  # everything but the loss known ahead: one array op per update below
            f = lr * multiplier * knee / self.lr_max
            gains, diverging = self.rate * luck * self.gain_of(f) / knee, f > self.diverge_above
        for s in range(len(updates)):
            active = within[s] & ~failed
            history[s] = np.where(active, loss, np.nan)
            if self.rise:
                knee = self.knee_of(self.b_noise_at(loss) / batch)
                f = lr * multiplier[s] * knee / self.lr_max
                gain, diverged = self.rate * luck * self.gain_of(f) / knee, f > self.diverge_above
            else:
                gain, diverged = gains[s], diverging[s]
            loss = np.where(active, loss - gain * self.rate_of(loss), loss)
            failed |= active & (~(loss < self.loss_start + 1.0) | diverged)
        history[steps, np.arange(len(specs))] = np.where(failed, np.nan, loss)
        return [self._run(spec, history[: steps[i] + 1, i], rngs[i], bool(failed[i])) for i, spec in enumerate(specs)]

    def _run(self, spec: Tuple[int, float, int], losses: np.ndarray, rng, failed: bool) -> "Run":
        b, lr, seed = spec
        done = np.flatnonzero(np.isfinite(losses))
        last = int(done[-1]) if len(done) else 0
        # losses[s] is the loss of the weights after s updates, logged at s x B tokens (before
        # update s + 1); the point at the budget is the final weights' (what eval sees).
        updates = np.arange(min(last, len(losses) - 2) + 1)
        keep = np.unique(np.r_[updates[:: max(1, len(updates) // self.max_points)], updates[-1]])
        noisy = losses[keep] + self.update_noise / math.sqrt(b) * rng.standard_normal(len(keep))
        train = list(zip((keep * b).tolist(), noisy.tolist()))
        s = np.arange(last + 1)
        at = s[((s * b) % self.eval_every_tokens < b) | (s == len(losses) - 1)]
        evals = list(zip((at * b).tolist(), (losses[at] + 0.05 + 0.003 * rng.standard_normal(len(at))).tolist()))
        reports = s[1:][(s[1:] * b) % self.report_every_tokens < b]
        noise = self.b_noise_at(losses[reports]) * np.exp(0.05 * rng.standard_normal(len(reports)))
        b_simple = list(zip((reports * b).tolist(), noise.tolist()))
        return Run(b, lr, seed, train, evals, b_simple, "FAILED" if failed else "FINISHED")

    def grid(self, batches: Sequence[int] = BATCHES, lrs: Sequence[float] = (), seeds: int = 3) -> List["Run"]:
        """Every batch size x learning rate x seed (lrs: a list fixed across B)."""
        return self.simulate([(b, lr, k) for b in batches for lr in lrs for k in range(seeds)])

    def with_(self, **changes) -> "World":
        return replace(self, **changes)

    def params(self, run: "Run") -> Dict[str, object]:
        """What the trainer logs as params that the analysis reads, by dotted config key."""
        return {
            "batch.tokens_per_update": run.batch,
            "optim.lr": run.lr,
            "optim.beta2": 0.95,
            "optim.grad_clip": 0.0,
            "train.seed": run.seed,
            "train.total_tokens": self.total_tokens,
            "schedule.warmup_tokens": self.warmup_tokens,
            "schedule.decay": self.decay,
            "schedule.wsd_decay_share": self.wsd_decay_share,
            "schedule.min_lr_ratio": self.min_lr_ratio,
        }

    def tables(self, runs: Sequence["Run"]) -> Tuple[List[Dict[str, object]], List[Tuple[str, str, int, float]]]:
        """(rows of trials.csv, rows of curves.csv) of `runs`, as a trainer would write them."""
        trials, series = self.series(runs)
        return trials, curve_rows(series)

    def series(self, runs: Sequence["Run"]) -> Tuple[List[Dict[str, object]], List[Series]]:
        """(rows of trials.csv, each run's logged curves) of `runs`."""
        trials = [{"trial": r.name, "status": r.status, **self.params(r)} for r in runs]
        logged = (("train/loss", "train"), ("eval/loss", "eval"), ("gns/b_simple", "b_simple"))
        return trials, [(r.name, metric, getattr(r, name)) for r in runs for metric, name in logged]

    def trials(self, runs: Sequence["Run"]):
        """`runs` as the analysis reads them, through the tables' own reader (orchestrator/analysis/tables.py)."""
        return read_back(*self.series(runs))

    def write(self, runs: Sequence["Run"], folder: Path) -> Path:
        """trials.csv and curves.csv of `runs` in folder (plain csv: any trainer could write them)."""
        return write_tables(*self.tables(runs), folder)


@dataclass
class Run:
    batch: int
    lr: float
    seed: int
    train: List[Tuple[int, float]]
    eval: List[Tuple[int, float]]
    b_simple: List[Tuple[int, float]]
    status: str
    name: str = field(default="")

    def __post_init__(self):
        self.name = self.name or f"B={self.batch} lr={self.lr:.4g} seed={self.seed}"

    @property
    def final_loss(self) -> float:
        """The last eval loss (inf for a run that failed): what a Tune objective would minimise."""
        return self.eval[-1][1] if self.status == "FINISHED" and self.eval else math.inf


Series = Tuple[str, str, List[Tuple[int, float]]]
"""One logged curve: (trial, metric, its (tokens, value) points)."""


def curve_rows(series: Sequence[Series]) -> List[Tuple[str, str, int, float]]:
    """The rows of curves.csv that hold `series`."""
    return [(trial, metric, t, v) for trial, metric, points in series for t, v in points]


def write_tables(trials: Sequence[Dict[str, object]], curves: Sequence[tuple], folder: Path) -> Path:
    """trials.csv (a column per key any row has) and curves.csv in folder, as a trainer writes them."""
    import csv

    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "trials.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in trials for k in r)))
        writer.writeheader()
        writer.writerows(trials)
    with (folder / "curves.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["trial", "metric", "tokens", "value"])
        writer.writerows(curves)
    return folder


def read_back(trial_rows: List[Dict[str, object]], series: Sequence[Series]):
    """Tables as the analysis reads them, through the tables' own reader
    (orchestrator/analysis/tables.py; the curves by columns, as curves.csv is read)."""
    from orchestrator.analysis import tables

    lengths = [len(points) for _, _, points in series]
    points = np.array([p for _, _, pts in series for p in pts], np.float64).reshape(-1, 2)
    columns = (np.repeat([t for t, _, _ in series], lengths), np.repeat([m for _, m, _ in series], lengths))
    curves = tables.curves_from_columns(*columns, points[:, 0], points[:, 1]) if len(points) else {}
    assert curves is not None, "the reader would refuse a row of these tables"
    return tables.trials_from(trial_rows, [], curves=curves)


def factor_grid(low: float, high: float, factor: float = 2.0) -> List[float]:
    """low, low x factor, ... up to high (inclusive, to rounding)."""
    n = int(math.floor(math.log(high / low) / math.log(factor) + 1e-9))
    return [low * factor**i for i in range(n + 1)]


REVIEW_WORLDS = {
    "log-normal lr response": World(gain="lognormal", b_noise=1000.0),
    "stretched-exponential loss": World(shape="stretched", b_noise=600.0),
    "runs diverge above 1.5x the optimal lr": World(diverge_above=1.5, b_noise=1200.0),
    "seed noise growing at small B": World(seed_noise=0.1, seed_noise_growth=-0.5, b_noise=1200.0),
}
"""Worlds a review found the analysis biased on: an lr response that is log-normal, not quadratic;
a loss that is no power law; runs that fail above 1.5x the optimal lr (so the lr above the best
tried usually failed); seed noise that grows at small B. Each has B_crit = b_noise exactly."""


SHAPE_WORLDS = {
    "cosine decay": (World(decay="cosine", b_noise=2000.0), BATCHES, 2),
    "linear decay to zero": (
        World(decay="linear", min_lr_ratio=0.0, b_noise=1200.0),
        (256, 512, 1024, 2048, 4096, 8192),
        3,
    ),
    "stretched exponential, log-normal lr": (
        World(shape="stretched", gain="lognormal", b_noise=600.0),
        (64, 128, 256, 512, 1024, 2048),
        2,
    ),
    "slow power law in steps": (World(exponent=3.0, b_noise=1000.0), BATCHES, 3),
}
"""Worlds of issue 57, each with its batch grid and seeds: steps to target read while the lr decays
(cosine, or linearly to zero; the analysis reads the first TRUSTED_SHARE of the budget), a
stretched-exponential loss under a log-normal lr response, and a power law slower than the
others' (L - floor ~ steps^-1/2). Each has B_crit = b_noise."""
SHAPE_LRS = (0.0005, 0.032)
"""The factor-2 lr grid of the shape worlds (offset per draw), wide enough that every batch size's
optimum lies inside it."""


def offset_grid(draw: int, lrs: Sequence[float]) -> List[float]:
    """`lrs` shifted by a draw's own fraction of their factor-2 step, so draws put the grid at every
    offset from the optimum (a fixed grid leaves each batch size at one offset in every draw)."""
    return [lr * 2.0 ** ((draw * 0.37) % 1.0) for lr in lrs]


def _primary(job: Tuple["World", Sequence[float], int, Sequence[int]]) -> Dict[str, object]:
    from orchestrator.analysis import sweep_analysis

    world, lrs, seeds, batches = job
    result = sweep_analysis.analyse(world.trials(world.grid(batches, lrs=lrs, seeds=seeds)))
    return {**result.primary.to_json(), "points": None}


def primaries_of(
    worlds: Dict[str, Tuple["World", Sequence[int], int]], lrs: Sequence[float], draws: int, workers: int = 2
) -> Dict[str, List[Dict[str, object]]]:
    """The primary critical_batch entry of each of `draws` draws of every (world, batches, seeds)
    in `worlds` (its lr grid `offset_grid` per draw), analysed in `workers` fresh processes (draws
    are independent, and a 2-core machine then takes half the time)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    jobs = [
        (world.with_(draw=d), offset_grid(d, lrs), seeds, tuple(batches))
        for world, batches, seeds in worlds.values()
        for d in range(draws)
    ]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        found = list(pool.map(_primary, jobs))
    return {name: found[i * draws : (i + 1) * draws] for i, name in enumerate(worlds)}
