"""What a sweep answers, computed from its runs (pure: no MLflow; `report.py` reads and writes).

Rules, so that a reader can check every number (batch sizes, budgets and positions in tokens):
- Finished: a run that ended FINISHED with the whole (rounded) budget seen. Stopped: ended early
  by the scheduler (tagged with the rung it was stopped at) or killed. Failed: FAILED. Final-loss
  comparisons use finished runs only; `sweep` and `report` both apply `outcome`.
- Swept axes: the config keys whose values differ between runs (derived keys and the seed
  aside). A configuration is one value of every axis but the batch size; its seeds are
  replicates, and its score is the mean over them.
- Final loss: the last eval/loss point when every finished run logged eval/loss, else train/loss
  smoothed at its end. Best configuration per batch size: the lowest mean final loss.
- Curves are smoothed by a centred window of SMOOTH_UPDATES x the largest batch size, in tokens
  (noise.smooth), the same for every batch size.
- Steps to a target loss come only from the part of a curve the schedule cannot fake: before
  the decay (warmup + stable) for wsd, the whole run for constant, and the first
  TRUSTED_SHARE of the budget for cosine and linear, which decay from the end of warmup (the
  fit then depends on the schedule, and the report says so). Otherwise the final anneal would
  reach the lowest targets at the end of every run, whatever the batch size.
- Targets when none are given: L_w = the worst, over batch sizes, of the best smoothed loss at
  the end of the trusted part; L_0 = the median initial loss; L_w + f (L_0 - L_w) for f in
  TARGET_FRACTIONS.
- Critical batch size at a target: per batch size the configuration with the fewest mean steps
  S_j over its seeds (every seed must reach the target); S = S_min + E_min / B is fitted,
  B_crit = E_min / S_min. Fewer than MIN_BATCH_SIZES batch sizes reaching the target, or a
  degenerate fit: not resolved. The 90% interval bootstraps the seeds (noise.bootstrap_b_crit);
  with one seed per configuration there is none. B_simple: the best configuration's
  gns/b_simple where it reaches the target, mean over seeds, median over batch sizes.
  The primary target is the lowest resolved one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from orchestrator import noise

SMOOTH_UPDATES = 2
TRUSTED_SHARE = 0.5
TARGET_FRACTIONS = (0.02, 0.1, 0.25)
MIN_BATCH_SIZES = 3
BATCH_KEY, SEED_KEY = "batch.tokens_per_update", "train.seed"
DERIVED = {
    "train.run_name",
    "train.total_steps",
    "train.total_tokens_rounded",
    "batch.grad_accum_steps",
    "batch.micro_batch_size",
    SEED_KEY,
}
"""Params that differ between runs without being swept (or, the seed, that are replicates)."""
Curve = List[Tuple[int, float]]


@dataclass
class Trial:
    """One run as the analysis needs it: its params and curves as (tokens, value)."""

    run_id: str
    name: str
    status: str
    params: Dict[str, str]
    train: Curve
    eval: Curve = field(default_factory=list)
    b_simple: Curve = field(default_factory=list)
    duration_s: Optional[float] = None
    stopped_at: Optional[int] = None
    """Tokens of the scheduler's rung at which the run was stopped early."""
    trial_id: Optional[str] = None
    """The Ray Tune trial the run belongs to (sweeps only)."""

    def _number(self, key: str, kind=float) -> Any:
        try:
            return kind(float(self.params[key]))
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def batch(self) -> Optional[int]:
        return self._number(BATCH_KEY, int)

    @property
    def lr(self) -> Optional[float]:
        return self._number("optim.lr")

    @property
    def tokens_seen(self) -> int:
        return self.train[-1][0] if self.train else 0

    @property
    def budget(self) -> int:
        """The run's budget rounded down to whole updates (what it would see if it finished)."""
        return (
            self._number("train.total_tokens_rounded", int)
            or self._number("train.total_tokens", int)
            or self.tokens_seen
        )

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

    def trusted_tokens(self) -> float:
        """Where the part of the curve that steps-to-target may use ends (module docstring)."""
        decay, budget = self.params.get("schedule.decay"), self.budget
        warmup = self._number("schedule.warmup_tokens") or 0.0
        if decay == "wsd":
            return max(warmup, budget * (1.0 - (self._number("schedule.wsd_decay_share") or 0.0)))
        if decay in ("cosine", "linear"):
            return TRUSTED_SHARE * budget
        return budget

    def smoothed(self, width: float) -> Tuple[np.ndarray, np.ndarray]:
        tokens = np.array([t for t, _ in self.train], np.float64)
        return tokens, noise.smooth(tokens, [v for _, v in self.train], width)

    def final(self, metric: str, width: float) -> Optional[float]:
        if metric == "eval/loss":
            return self.eval[-1][1] if self.eval else None
        return float(self.smoothed(width)[1][-1]) if self.train else None

    def reach(self, target: float, width: float) -> Optional[Tuple[float, float]]:
        """(steps, tokens) where the smoothed train loss first reaches target, in the trusted part."""
        tokens, losses = self.smoothed(width)
        keep = tokens <= self.trusted_tokens()
        return noise.steps_to_reach(tokens[keep], losses[keep], self.batch, target) if keep.any() else None

    def b_simple_at(self, tokens: float) -> Optional[float]:
        return float(np.interp(tokens, *zip(*self.b_simple))) if self.b_simple else None


# ---------------------------------------------------------------- axes and configurations


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


def by_configuration(trials: Sequence[Trial], axes: Sequence[str]) -> List[List[Trial]]:
    groups: Dict[Any, List[Trial]] = {}
    for t in trials:
        groups.setdefault(configuration(t, axes), []).append(t)
    return list(groups.values())


def smoothing_width(trials: Sequence[Trial]) -> float:
    return SMOOTH_UPDATES * max(t.batch for t in trials)


# ---------------------------------------------------------------- best configurations


def best_per_batch(finished: Sequence[Trial], axes: Sequence[str], metric: str, width: float) -> List[Dict[str, Any]]:
    """Per batch size the configuration with the lowest mean final loss over its seeds."""
    rows = []
    for b, group in by_batch(finished).items():
        scored = []
        for runs in by_configuration(group, axes):
            finals = [t.final(metric, width) for t in runs]
            if all(f is not None for f in finals):
                scored.append((float(np.mean(finals)), float(np.std(finals)), runs))
        if scored:
            loss, spread, runs = min(scored, key=lambda s: s[0])
            best = min(runs, key=lambda t: t.final(metric, width))
            rows.append(
                {
                    "batch": b,
                    "settings": {k: best.params.get(k) for k in axes},
                    "final_loss": loss,
                    "spread": spread if len(runs) > 1 else None,
                    "seeds": len(runs),
                    "lr": best.lr,
                    "run_id": best.run_id,
                    "run_name": best.name,
                    "configurations": len(scored),
                    "edges": _edges(best, group, axes),
                }
            )
    return rows


def _edges(best: Trial, tried: Sequence[Trial], axes: Sequence[str]) -> Dict[str, str]:
    """Numeric axes whose best value is the lowest or highest of three or more tried: the
    optimum may lie outside the swept range."""
    edges = {}
    for key in axes:
        try:
            values = sorted({float(t.params[key]) for t in tried})
            mine = float(best.params[key])
        except (KeyError, TypeError, ValueError):
            continue
        if len(values) >= 3 and mine in (values[0], values[-1]):
            edges[key] = "lowest" if mine == values[0] else "highest"
    return edges


def lr_scaling(best: Sequence[Dict[str, Any]], axes: Sequence[str]) -> Dict[str, Any]:
    """The power law lr_opt ~ coef * B^alpha through the best configurations' learning rates."""
    points = [(r["batch"], r["lr"]) for r in best if r["lr"]]
    if "optim.lr" not in axes:
        return {"coef": None, "alpha": None, "note": "the learning rate was not swept"}
    if len({b for b, _ in points}) < 2:
        return {"coef": None, "alpha": None, "note": "the lr power law needs at least 2 batch sizes"}
    coef, alpha = noise.power_law_fit(*zip(*points))
    return {"coef": coef, "alpha": alpha, "note": None}


def stopped_early(trials: Sequence[Trial]) -> Dict[str, Any]:
    """How many runs the scheduler stopped, and at which rungs (tokens -> count)."""
    stopped = [t for t in trials if t.outcome == "stopped"]
    rungs: Dict[int, int] = {}
    for t in stopped:
        if t.stopped_at is not None:
            rungs[t.stopped_at] = rungs.get(t.stopped_at, 0) + 1
    return {"count": len(stopped), "rungs": dict(sorted(rungs.items()))}


# ---------------------------------------------------------------- critical batch size


def choose_targets(trials: Sequence[Trial], width: float) -> List[float]:
    """Loss levels the best run of every batch size reaches within its trusted part."""
    ends = {}
    for b, group in by_batch(trials).items():
        at_horizon = [
            float(np.interp(t.trusted_tokens(), *t.smoothed(width)))
            for t in group
            if t.tokens_seen >= t.trusted_tokens()
        ]
        if at_horizon:
            ends[b] = min(at_horizon)
    if not ends:
        return []
    worst_of_best = max(ends.values())
    start = float(np.median([t.smoothed(width)[1][0] for t in trials]))
    if start <= worst_of_best:
        return [worst_of_best]
    return [worst_of_best + f * (start - worst_of_best) for f in sorted(TARGET_FRACTIONS)]


def critical_batch(trials: Sequence[Trial], axes: Sequence[str], target: float, width: float) -> Dict[str, Any]:
    """Per batch size the configuration reaching `target` in the fewest mean steps; the fit and
    its seed-bootstrap interval (module docstring)."""
    points, missing, notes, steps_by_batch = [], [], [], {}
    for b, group in by_batch(trials).items():
        configs = by_configuration(group, axes)
        reached = [[t.reach(target, width) for t in runs] for runs in configs]
        steps = [[r[0] if r else None for r in rs] for rs in reached]
        chosen = noise.best_config(steps)
        if chosen is None:
            missing.append(b)
            continue
        i, mean_steps = chosen
        runs, hits = configs[i], reached[i]
        steps_by_batch[b] = [s for s in steps if all(x is not None for x in s)]
        b_simple = [x for t, (_, tok) in zip(runs, hits) if (x := t.b_simple_at(tok)) is not None]
        walls = [t.duration_s * min(1.0, tok / t.tokens_seen) for t, (_, tok) in zip(runs, hits) if t.duration_s]
        points.append(
            {
                "batch": b,
                "steps": mean_steps,
                "tokens": mean_steps * b,
                "lr": runs[0].lr,
                "seeds": len(runs),
                "run_id": runs[0].run_id,
                "run_name": runs[0].name,
                "wall_s": float(np.mean(walls)) if walls else None,
                "b_simple": float(np.mean(b_simple)) if b_simple else None,
            }
        )
    fit, interval, resolved = (None, None, None), None, False
    if len(points) >= 2:
        fit = noise.fit_critical_batch([p["batch"] for p in points], [p["steps"] for p in points])
    if len(points) < MIN_BATCH_SIZES:
        notes.append(
            f"not resolved: B_crit needs {MIN_BATCH_SIZES} batch sizes that reach this loss; {len(points)} did"
        )
    elif fit[1] == 0:
        notes.append(
            "not resolved: steps do not fall as B grows (E_min = 0): every B here is past B_crit, or the data are noisy"
        )
    elif fit[0] == 0:
        notes.append("not resolved: steps fall as 1/B throughout (S_min = 0): B_crit lies beyond the largest B")
    else:
        resolved = True
        if max(len(s) for configs in steps_by_batch.values() for s in configs) > 1:
            interval = noise.bootstrap_b_crit(steps_by_batch)
        else:
            notes.append("no interval: one seed per configuration (search.seeds >= 2 gives one)")
    if missing:
        notes.append("not reached by batch sizes " + ", ".join(f"{b:,}" for b in missing))
    schedules = {t.params.get("schedule.decay") for t in trials} & {"cosine", "linear"}
    if schedules:
        notes.append(
            f"steps read before {TRUSTED_SHARE:.0%} of the budget ({'/'.join(sorted(schedules))} decay from the end of "
            "warmup): the fit depends on the schedule; wsd or constant give one it cannot fake"
        )
    measured = [p["b_simple"] for p in points if p["b_simple"] is not None]
    if not measured:
        notes.append("no gns/b_simple at this loss (gns.enabled=false, or D x A = 1 for every batch size)")
    return {
        "target_loss": target,
        "points": points,
        "missing": missing,
        "s_min": fit[0],
        "e_min": fit[1],
        "b_crit": fit[2] if resolved else None,
        "b_crit_fit": fit[2],
        "b_crit_interval": interval,
        "b_simple": float(np.median(measured)) if measured else None,
        "notes": notes,
    }


# ---------------------------------------------------------------- the whole answer


def analyse(trials: Sequence[Trial], target_losses: Optional[Sequence[float]] = None) -> Dict[str, Any]:
    usable = [t for t in trials if t.batch and t.train]
    if not usable:
        raise ValueError("no run has both batch.tokens_per_update and a train/loss curve")
    axes = swept_axes(usable)
    finished = [t for t in usable if t.outcome == "finished"]
    metric = "eval/loss" if finished and all(t.eval for t in finished) else "train/loss"
    width = smoothing_width(usable)
    best = best_per_batch(finished, axes, metric, width)
    targets = sorted(target_losses) if target_losses else choose_targets(usable, width)
    fits = [critical_batch(usable, axes, target, width) for target in targets]
    return {
        "loss_metric": metric,
        "axes": axes,
        "targets_chosen": not target_losses,
        "smoothing_tokens": width,
        "finished": len(finished),
        "stopped": stopped_early(usable),
        "failed": sum(t.outcome == "failed" for t in usable),
        "incomplete": sum(t.outcome == "incomplete" for t in usable),
        "best": min(best, key=lambda r: r["final_loss"]) if best else None,
        "best_per_batch": best,
        "lr_scaling": lr_scaling(best, axes),
        "critical_batch": fits,
        "primary": next((f for f in fits if f["b_crit"] is not None), fits[0] if fits else None),
        "trials": [row(t, metric, width) for t in usable],
        "skipped": [t.name for t in trials if t not in usable],
    }


def row(t: Trial, metric: str, width: float) -> Dict[str, Any]:
    return {
        "run_id": t.run_id,
        "run_name": t.name,
        "status": t.status,
        "outcome": t.outcome,
        "batch": t.batch,
        "lr": t.lr,
        "seed": t.params.get(SEED_KEY),
        "warmup_tokens": t.params.get("schedule.warmup_tokens"),
        "decay": t.params.get("schedule.decay"),
        "final_loss": t.final(metric, width),
        "final_train": t.final("train/loss", width),
        "final_eval": t.final("eval/loss", width),
        "tokens": t.tokens_seen,
        "stopped_at": t.stopped_at,
        "wall_s": t.duration_s,
    }
