"""A run as the analysis sees it (`Trial`: its params and curves as (tokens, value)), and how
runs group into swept axes, batch sizes and learning-rate scans. Pure: reporting/report_inputs.py
builds Trials from MLflow, tables.py from trials.csv and curves.csv; sweep_analysis.py,
steps_to_target.py and the ladder read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from orchestrator.analysis import critical_batch as cb
from orchestrator.formulas import schedules

BATCH_KEY, LR_KEY, SEED_KEY = "batch.tokens_per_update", "optim.lr", "train.seed"
SCHEDULE_KEY = "batch.schedule"
PARAMS_KEY = "model.params"
"""A model's size in parameters: derived from the workload (no config key), logged as a param."""
RAMP_CHANGE_KEY = "batch.ramp.1.tokens_per_update"
"""The param of a batch.ramp's second step (MLflow holds the ramp flattened): present when it changes B."""
DERIVED = {
    "train.run_name",
    "train.total_steps",
    "train.total_tokens_rounded",
    "batch.grad_accum_steps",
    "batch.micro_batch_size",
    "optim.beta2_effective",
    "optim.weight_decay_effective",
    SEED_KEY,
}
"""Params that differ between runs without being swept (or, the seed, that are replicates)."""


class Curve(Sequence[Tuple[int, float]]):
    """A curve's points as (tokens, value), held as two arrays: a million-point study would spend
    about 120 bytes a point as Python tuples, 16 this way. Reads as the sorted list of (int, float)
    tuples it replaces (indexing, slicing, iterating, comparing with a list); the arithmetic reads
    `tokens` and `values` directly."""

    __slots__ = ("tokens", "values")

    def __init__(self, tokens: Any = (), values: Any = ()):
        self.tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        self.values = np.asarray(values, dtype=np.float64).reshape(-1)
        if len(self.tokens) != len(self.values):
            raise ValueError(f"a curve's tokens ({len(self.tokens)}) and values ({len(self.values)}) differ in length")

    @classmethod
    def of(cls, points: Any) -> "Curve":
        """A Curve of (tokens, value) points in any order (sorted by tokens), or the Curve given."""
        if isinstance(points, Curve):
            return points
        points = sorted(points)
        if not points:
            return cls()
        tokens, values = zip(*points)
        return cls(tokens, values)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Curve(self.tokens[i], self.values[i])
        return int(self.tokens[i]), float(self.values[i])

    def __iter__(self):
        return zip(self.tokens.tolist(), self.values.tolist())

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, Curve):
            return np.array_equal(self.tokens, other.tokens) and np.array_equal(self.values, other.values)
        return isinstance(other, (list, tuple)) and list(self) == [tuple(p) for p in other]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Curve({list(self)!r})" if len(self) <= 6 else f"Curve({len(self)} points, {self[0]} .. {self[-1]})"

    def until(self, tokens: float) -> "Curve":
        """The points at or before `tokens`."""
        return self[: int(np.searchsorted(self.tokens, tokens, side="right"))]


CURVE_FIELDS = ("train", "eval", "b_simple", "clipped", "eval_se")


@dataclass(eq=False)
class Trial:
    """One run as the analysis needs it: its params and curves as (tokens, value)."""

    run_id: str
    name: str
    status: str
    params: Dict[str, str]
    train: Curve
    eval: Curve = field(default_factory=list)
    b_simple: Curve = field(default_factory=list)
    clipped: Curve = field(default_factory=list)
    """train/clipped: 1 where the update's gradient was clipped."""
    eval_se: Curve = field(default_factory=list)
    """eval/loss_se: the standard error of each eval/loss point (over the eval micro-batches)."""
    duration_s: Optional[float] = None
    stopped_at: Optional[int] = None
    """Tokens of the scheduler's rung at which the run was stopped early."""
    trial_id: Optional[str] = None
    """The Ray Tune trial the run belongs to (sweeps only)."""
    checkpoints: Optional[str] = None
    """Where the run's checkpoint_* folders live (path or URI), when it kept any."""
    _fits: Dict[Any, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        for name in CURVE_FIELDS:
            setattr(self, name, Curve.of(getattr(self, name)))

    """Monotone fits of train/loss: by pre-smoothing width over the trusted part, `whole` over all of it."""

    def number(self, key: str, kind=float) -> Any:
        try:
            value = float(self.params[key])
        except (KeyError, TypeError, ValueError):
            return None
        return kind(value) if math.isfinite(value) else None

    @property
    def ramped(self) -> bool:
        """Trained along a batch.ramp of more than one batch size, or with batch.schedule=adaptive
        (which may change it whenever its noise scale says: not one batch size either)."""
        return RAMP_CHANGE_KEY in self.params or self.params.get(SCHEDULE_KEY) == "adaptive"

    @property
    def batch(self) -> Optional[int]:
        """Its tokens per update; None for a ramped run, which is no point of steps against one
        batch size, so the analysis leaves it out."""
        return None if self.ramped else self.number(BATCH_KEY, int)

    @property
    def lr(self) -> Optional[float]:
        return self.number(LR_KEY)

    @property
    def tokens_seen(self) -> int:
        """A train/loss point at t is the update from t to t + B; eval points are after an update."""
        last_train = self.train[-1][0] + (self.batch or 0) if self.train else 0
        return max(last_train, self.eval[-1][0] if self.eval else 0)

    @property
    def budget(self) -> int:
        """The tokens the run sees if it finishes: its train.stop_at_tokens (a branch), else its
        budget rounded down to whole updates."""
        total = self.number("train.total_tokens", int)
        if total and self.batch:
            total = total // self.batch * self.batch
        stop = self.number("train.stop_at_tokens", int)
        return stop or self.number("train.total_tokens_rounded", int) or total or self.tokens_seen

    @property
    def outcome(self) -> str:
        """finished | stopped | failed | incomplete: the one rule of `sweep` and `report`."""
        if self.status == "FAILED":
            return "failed"
        if self.status == "FINISHED" and self.tokens_seen >= self.budget:
            return "finished"
        if self.stopped_at is not None or self.status == "KILLED":
            return "stopped"
        return "incomplete"

    @property
    def warmup_tokens(self) -> float:
        return self.number("schedule.warmup_tokens") or 0.0

    @property
    def beta2(self) -> Optional[float]:
        return self.number("optim.beta2_effective") or self.number("optim.beta2")

    def stable_end(self) -> float:
        """Where the part of the curve that steps-to-target may use ends (module docstring)."""
        decay = self.params.get("schedule.decay")
        if decay not in schedules.DECAYS:
            return self.budget
        share = self.number("schedule.wsd_decay_share")
        return schedules.stable_end_tokens(self.budget, self.warmup_tokens, decay, 0.2 if share is None else share)

    def curve(self, smoothing: float = 0.0):
        """The monotone fit of train/loss over the trusted part (optionally pre-smoothed)."""
        if smoothing not in self._fits:
            points = self.train.until(self.stable_end()) or self.train[:1]
            self._fits[smoothing] = cb.monotone(points.tokens, cb.smooth(points.tokens, points.values, smoothing))
        return self._fits[smoothing]

    def reach(self, level: float, smoothing: float = 0.0) -> Optional[float]:
        """Tokens at which the trusted part's monotone fit first reaches `level`, or None."""
        return cb.first_crossing(self.curve(smoothing), level)

    def final(self, metric: str) -> Optional[float]:
        if metric == "eval/loss":
            return self.eval[-1][1] if self.eval else None
        if not self.train:
            return None
        if "whole" not in self._fits:  # the monotone fit of the whole curve, decay included
            self._fits["whole"] = cb.monotone(self.train.tokens, self.train.values)
        return float(self._fits["whole"][1][-1])

    def b_simple_at(self, tokens: float) -> Optional[float]:
        return float(np.interp(tokens, self.b_simple.tokens, self.b_simple.values)) if self.b_simple else None

    def clipped_before(self, tokens: float) -> Optional[float]:
        before = self.clipped.values[self.clipped.tokens < tokens]
        return float(np.mean(before)) if len(before) else None


# ---------------------------------------------------------------- axes and configurations


def in_one_order(trials: Sequence[Trial]) -> List[Trial]:
    """The trials by name, then run id: the order the analysis reads them in. MLflow gives a sweep's
    runs oldest first and concurrent trials start in no fixed order, while the bootstraps draw
    seeds by position: without one order, the same runs would get different intervals."""
    return sorted(trials, key=lambda t: (t.name, t.run_id))


def swept_axes(trials: Sequence[Trial]) -> List[str]:
    """Config keys whose values differ between the runs, the batch size first."""
    keys = set().union(*(t.params for t in trials)) if trials else set()
    varied = [
        k
        for k in sorted(keys - DERIVED)
        if not k.startswith(("tracking.", "train.storage_path")) and len({t.params.get(k) for t in trials}) > 1
    ]
    return sorted(varied, key=lambda k: k != BATCH_KEY)


def configuration(t: Trial, axes: Sequence[str]) -> Tuple[Tuple[str, Optional[str]], ...]:
    """A run's values of every swept axis but the batch size: its seeds share this."""
    return tuple((k, t.params.get(k)) for k in axes if k != BATCH_KEY)


def by_batch(trials: Sequence[Trial]) -> Dict[int, List[Trial]]:
    groups: Dict[int, List[Trial]] = {}
    for t in sorted(trials, key=lambda t: t.batch):
        groups.setdefault(t.batch, []).append(t)
    return groups


@dataclass
class Config:
    """One configuration at one batch size: its lr and its seeds."""

    lr: Optional[float]
    trials: List[Trial]

    @property
    def log_lr(self) -> float:
        return math.log(self.lr) if self.lr and self.lr > 0 else -math.inf


def lr_scans(trials: Sequence[Trial], axes: Sequence[str]) -> List[List[Config]]:
    """The configurations of one batch size, grouped by every axis but the lr, sorted by lr."""
    others = [k for k in axes if k not in (BATCH_KEY, LR_KEY)]
    groups: Dict[Any, Dict[Optional[float], List[Trial]]] = {}
    for t in trials:
        groups.setdefault(tuple(t.params.get(k) for k in others), {}).setdefault(t.lr, []).append(t)
    return [
        [Config(lr, runs) for lr, runs in sorted(g.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0.0))]
        for g in groups.values()
    ]


_WORDS = {"None": None, "True": True, "False": False}
"""How MLflow spells Python's None and booleans (it logs str(value))."""


def param_value(value: Any) -> Any:
    """A logged param's text as the None, bool, int or finite float it spells, else as it is (a
    'nan' stays text: settings are compared, and NaN equals nothing)."""
    if not isinstance(value, str):
        return value
    if value in _WORDS:
        return _WORDS[value]
    for kind in (int, float):
        try:
            number = kind(value)
        except ValueError:
            continue
        return number if math.isfinite(number) else value
    return value


def settings(t: Trial, axes: Sequence[str]) -> Dict[str, Any]:
    """The trial's value of each of `axes`, typed (param_value); None where it logged none."""
    return {k: param_value(t.params.get(k)) for k in axes}
