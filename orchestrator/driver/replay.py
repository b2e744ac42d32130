"""`replay: {tables: DIR}` (docs/sweeps.md, "Replaying recorded runs"): every trial of the sweep
serves a recorded run from DIR's trials.csv and curves.csv instead of training, in its own Tune
trial and MLflow run, so the searchers, early stopping and the report run on real runs at the cost
of logging them.

A trial serves the recorded run of its config: the same `batch.tokens_per_update`, `optim.lr`,
`train.seed` and `train.total_tokens` (KEY), of its model size: `replay.params`, else the tables'
one size, else the trial's own model.params as its workload counts it (a ladder's rungs).
Where the tables hold no run of it but recorded runs around it at its seed and budget, its final
loss is interpolated linearly in (log B, log lr) over their triangulation and the nearest run's
curves are scaled to it (`find`). Its curves go to the trial's MLflow run up to each of the
recording's evaluations, and each evaluation is reported to Tune there, as a training trial
reports it, so early stopping sees what it would; a recorded run that failed (diverged) is served
and then fails. A config outside the recorded grid, or between runs one of which failed, is not
guessed: its run is FAILED with the reason, and Tune hears an infinite loss.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from orchestrator.analysis import tables
from orchestrator.analysis.trials import BATCH_KEY, LR_KEY, Trial
from orchestrator.core import workload_paths
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config
from orchestrator.core.sweep_schema import Sweep
from orchestrator.tracking.records import History

KEY = (BATCH_KEY, LR_KEY, "train.seed", "train.total_tokens")
"""The config keys that pick the recorded run a trial serves."""
Key = Tuple[int, float, int, int]
PARAMS = "model.params"
"""The tables' model size: a trial serves replay.params, else its own (a ladder's rung's)."""
LOSSES = ("train/loss", "eval/loss", "eval/loss_se")
"""The curves an interpolated config's scale applies to (a loss and its standard error)."""


class NotRecorded(Exception):
    """The tables hold no run of a trial's config, nor recorded runs around it to interpolate
    between (its run is FAILED with this reason)."""


class RecordedFailure(Exception):
    """The recorded run did not finish (a diverged run): served as recorded, its run is FAILED."""


@dataclass(frozen=True)
class Served:
    """What a trial serves: a recorded run's curves, scaled to an interpolated final loss where
    the tables hold no run of its config."""

    run: Trial
    """The recorded run (for an interpolated config: the nearest in (log B, log lr))."""
    scale: float = 1.0
    """Every loss of the run's curves times this (1: the run as recorded)."""
    note: str = ""
    """What was served, in words (the trial's MLflow tag orchestrator.replayed)."""


def folder(sweep: Sweep) -> Path:
    """replay.tables, relative to the sweep file."""
    given = Path(sweep.replay.tables).expanduser()
    return given if given.is_absolute() else (sweep.path.parent / given).resolve()


def values_of(cfg: Config) -> Dict[str, object]:
    """What picks the run a trial of `cfg` serves: KEY's values and its model.params."""
    key = (cfg.batch.tokens_per_update, cfg.optim.lr, cfg.train.seed, cfg.train.total_tokens)
    return {**dict(zip(KEY, key)), PARAMS: workload_paths.compute_params(cfg)}


def key_of(values: Mapping[str, object]) -> Optional[Key]:
    """KEY's values, as numbers compared to 9 significant digits (a CSV cell and a YAML number
    may differ in their last bits); None when one is missing or not a number."""
    try:
        batch, lr, seed, total = (float(values[k]) for k in KEY)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(x) for x in (batch, lr, seed, total)):
        return None
    return int(batch), float(f"{lr:.9g}"), int(seed), int(total)


@functools.lru_cache(maxsize=4)
def recorded(path: str) -> Dict[Optional[int], Dict[Key, Trial]]:
    """The tables' runs by model size (PARAMS; None where the tables have none) and KEY, read once
    in a process (tables.read refuses a malformed file in one line naming it); a run without
    every KEY, or two runs of one size and key, is refused here."""
    runs: Dict[Optional[int], Dict[Key, Trial]] = {}
    for trial in tables.read(Path(path)):
        key = key_of(trial.params)
        if key is None:
            missing = [k for k in KEY if k not in trial.params]
            raise ConfigError("replay.tables", f"{path}: run {trial.name!r} has no number in {missing or list(KEY)}")
        same = runs.setdefault(trial.number(PARAMS, int), {})
        if key in same:
            raise ConfigError("replay.tables", f"{path}: runs {same[key].name!r} and {trial.name!r} share {key}")
        same[key] = trial
    return runs


def _of_size(sweep: Sweep, params: Optional[float] = None) -> Dict[Key, Trial]:
    """The runs of the model size a trial serves: replay.params where given, else the tables' one
    size, else the trial's own model.params (`params`: its workload's count, as a ladder's rung
    sets it); ConfigError when the tables hold none of that size, or several sizes and no size is
    named."""
    by_size = recorded(str(folder(sweep)))
    wanted = sweep.replay.params
    if wanted is None and len(by_size) <= 1:
        return next(iter(by_size.values()), {})
    if wanted is None and not params:
        raise ConfigError(
            "replay.params",
            f"the tables hold runs of several model sizes ({_sizes(by_size)}); name one, or give each trial its own "
            "(a ladder's rungs, whose workload counts their model.params)",
        )
    wanted = wanted or params
    for size, runs in by_size.items():
        if size is not None and math.isclose(size, wanted, rel_tol=1e-6):
            return runs
    key = "replay.params" if sweep.replay.params else "model.params"
    raise ConfigError(key, f"no run of model.params {wanted:,.0f} in the tables; they hold {_sizes(by_size)}")


def _sizes(by_size: Mapping[Optional[int], object]) -> str:
    return ", ".join(f"{s:,}" for s in sorted(s for s in by_size if s is not None)) or "none"


def check(sweep: Sweep, configs: Sequence[Config] = ()) -> None:
    """Before Ray: the tables read and the model size of every trial's config found; exit 2 on a
    folder without tables, a malformed one, or a size not recorded."""
    where = folder(sweep)
    if not tables.is_table_folder(str(where)):
        raise ConfigError("replay.tables", f"{where} holds no {tables.TRIALS}; give a folder `report --out` wrote")
    for size in sorted({workload_paths.compute_params(c) or 0 for c in configs} or {0}):
        _of_size(sweep, size)


def find(values: Mapping[str, object], sweep: Sweep) -> Served:
    """The recorded run of a trial's config (KEY's values and, where the tables hold several model
    sizes, its PARAMS); else, inside the grid of recorded (log B, log lr) at its seed and budget,
    the final loss interpolated linearly over the grid's triangulation and the nearest run's curves
    scaled to it; else NotRecorded (nothing is extrapolated, nor interpolated next to a run that
    failed)."""
    runs = _of_size(sweep, values.get(PARAMS))  # type: ignore[arg-type]
    key = key_of(values)
    shown = ", ".join(f"{k}={values.get(k)}" for k in KEY)
    if key is None:
        raise NotRecorded(f"no number in one of {shown}")
    if key in runs:
        return Served(runs[key], note=f"recorded run {runs[key].name!r}")
    batch, lr, seed, total = key
    grid = [(k, t) for k, t in runs.items() if k[2:] == (seed, total)]
    loss = _interpolated(tuple((math.log(k[0]), math.log(k[1]), _final(t)) for k, t in grid), batch, lr)
    if loss is None or not math.isfinite(loss):
        where = "between recorded runs one of which failed" if loss is not None else "outside the recorded grid"
        raise NotRecorded(f"{shown} is {where} ({len(grid)} runs at its seed and budget in {folder(sweep)})")
    _, nearest = min(grid, key=lambda kt: math.hypot(math.log(kt[0][0] / batch), math.log(kt[0][1] / lr)))
    return Served(nearest, loss / _final(nearest), f"interpolated: final loss {loss:.6g}, curves of {nearest.name!r}")


def _final(run: Trial) -> float:
    """A run's final loss (its last eval, else its last train loss; inf where it failed)."""
    curve = run.eval or run.train
    return curve[-1][1] if run.status == "FINISHED" and len(curve) else math.inf


@functools.lru_cache(maxsize=64)
def _interpolated(points: Tuple[Tuple[float, float, float], ...], batch: int, lr: float) -> Optional[float]:
    """The linear interpolant over the Delaunay triangulation of (log B, log lr) -> loss, at
    (batch, lr): None outside it (or with no triangle: one batch size or one lr), inf in a
    triangle with a failed corner."""
    from scipy.spatial import Delaunay, QhullError

    if len(points) < 3:
        return None
    xy, loss = np.array([p[:2] for p in points]), np.array([p[2] for p in points])
    try:
        mesh = Delaunay(xy)
    except QhullError:
        return None
    at = np.array([math.log(batch), math.log(lr)])
    simplex = int(mesh.find_simplex(at))
    if simplex < 0:
        return None
    corners = mesh.simplices[simplex]
    if not np.isfinite(loss[corners]).all():
        return math.inf
    t = mesh.transform[simplex]
    weights = t[:2] @ (at - t[2])
    return float(np.dot(np.append(weights, 1 - weights.sum()), loss[corners]))


def serve(
    values: Mapping[str, object],
    sweep: Sweep,
    log: Callable[[Dict[str, History]], None],
    report: Callable[[Dict[str, float]], None],
) -> str:
    """Serve what `find` finds for a trial's flattened config `values`: `log` each piece of its
    curves, then `report` the evaluation that ends it (Tune's metrics: tokens, eval_loss, loss,
    step); a run with no evaluation (a table of final losses) reports its last train loss once,
    at its end. Returns what was served, in words. NotRecorded when nothing is; RecordedFailure,
    once it is served, when the recorded run did not finish."""
    served = find(values, sweep)
    run, scale = served.run, served.scale
    curves = {
        metric: [(t, v * scale if metric in LOSSES else v) for t, v in getattr(run, field)]
        for metric, field in tables.METRICS.items()
        if len(getattr(run, field))
    }
    batch = key_of(values)[0]
    ends = curves.get("eval/loss") or curves.get("train/loss", [])[-1:]
    done = -1
    for tokens, eval_loss in ends:
        log(_between(curves, done, tokens))
        train = [v for t, v in curves.get("train/loss", []) if t <= tokens]
        last_train = train[-1] if train else math.nan
        report({"tokens": tokens, "eval_loss": eval_loss, "loss": last_train, "step": tokens // batch})
        done = tokens
    log(_between(curves, done, math.inf))  # what follows the last evaluation
    if run.status != "FINISHED":
        raise RecordedFailure(f"the recorded run {run.name!r} ended {run.status} in {folder(sweep)}")
    return served.note


def unlogged(curves: Mapping[str, History], last_steps: Mapping[str, int]) -> Dict[str, History]:
    """The points of `curves` past each metric's last step the run holds (Store.last_steps): a
    retried or resumed trial serves its run again, and its history keeps each step once."""
    fresh = {metric: [(t, v) for t, v in points if t > last_steps.get(metric, -1)] for metric, points in curves.items()}
    return {metric: points for metric, points in fresh.items() if points}


def _between(curves: Mapping[str, object], after: float, until: float) -> Dict[str, History]:
    """Each curve's points with after < tokens <= until."""
    out: Dict[str, List[Tuple[int, float]]] = {}
    for metric, curve in curves.items():
        points = [(t, v) for t, v in curve if after < t <= until]
        if points:
            out[metric] = points
    return out
