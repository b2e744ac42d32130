"""`replay: {tables: DIR}` (docs/sweeps.md, "Replaying recorded runs"): every trial of the sweep
serves a recorded run from DIR's trials.csv and curves.csv instead of training, in its own Tune
trial and MLflow run, so the searchers, early stopping and the report run on real runs at the cost
of logging them.

A trial serves the recorded run of its config: the same `batch.tokens_per_update`, `optim.lr`,
`train.seed` and `train.total_tokens` (KEY). Its curves go to the trial's MLflow run up to each of
the recording's evaluations, and each evaluation is reported to Tune there, as a training trial
reports it, so early stopping sees what it would; a recorded run that failed (diverged) is served
and then fails. A config the tables do not hold is not guessed: its run is FAILED with the reason,
and Tune hears an infinite loss.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from orchestrator.analysis import tables
from orchestrator.analysis.trials import BATCH_KEY, LR_KEY, Trial
from orchestrator.core.errors import ConfigError
from orchestrator.core.sweep_schema import Sweep
from orchestrator.tracking.records import History

KEY = (BATCH_KEY, LR_KEY, "train.seed", "train.total_tokens")
"""The config keys that pick the recorded run a trial serves."""
Key = Tuple[int, float, int, int]


class NotRecorded(Exception):
    """The tables hold no run of a trial's config (its run is FAILED with this reason)."""


class RecordedFailure(Exception):
    """The recorded run did not finish (a diverged run): served as recorded, its run is FAILED."""


def folder(sweep: Sweep) -> Path:
    """replay.tables, relative to the sweep file."""
    given = Path(sweep.replay.tables).expanduser()
    return given if given.is_absolute() else (sweep.path.parent / given).resolve()


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
def recorded(path: str) -> Dict[Key, Trial]:
    """The tables' runs by KEY, read once in a process (tables.read refuses a malformed file in one
    line naming it); a run without every KEY, or two runs of one key, is refused here."""
    runs: Dict[Key, Trial] = {}
    for trial in tables.read(Path(path)):
        key = key_of(trial.params)
        if key is None:
            missing = [k for k in KEY if k not in trial.params]
            raise ConfigError("replay.tables", f"{path}: run {trial.name!r} has no number in {missing or list(KEY)}")
        if key in runs:
            raise ConfigError("replay.tables", f"{path}: runs {runs[key].name!r} and {trial.name!r} share {key}")
        runs[key] = trial
    return runs


def check(sweep: Sweep) -> None:
    """Before Ray: the tables read (exit 2 on a folder without them or a malformed one)."""
    where = folder(sweep)
    if not tables.is_table_folder(str(where)):
        raise ConfigError("replay.tables", f"{where} holds no {tables.TRIALS}; give a folder `report --out` wrote")
    recorded(str(where))


def serve(
    values: Mapping[str, object],
    sweep: Sweep,
    log: Callable[[Dict[str, History]], None],
    report: Callable[[Dict[str, float]], None],
) -> None:
    """Serve the recorded run of a trial's flattened config `values`: `log` each piece of its
    curves, then `report` the evaluation that ends it (Tune's metrics: tokens, eval_loss, loss,
    step). NotRecorded when the tables hold no such run; RecordedFailure, once it is served, when
    the recorded run did not finish."""
    runs = recorded(str(folder(sweep)))
    key = key_of(values)
    run = runs.get(key) if key else None
    if run is None:
        shown = ", ".join(f"{k}={values.get(k)}" for k in KEY)
        raise NotRecorded(f"the replayed tables hold no run at {shown} ({len(runs)} runs in {folder(sweep)})")
    curves = {metric: getattr(run, field) for metric, field in tables.METRICS.items() if len(getattr(run, field))}
    done = -1
    for tokens, eval_loss in run.eval:
        log(_between(curves, done, tokens))
        train = [v for t, v in run.train if t <= tokens]
        report(
            {
                "tokens": tokens,
                "eval_loss": eval_loss,
                "loss": train[-1] if train else math.nan,
                "step": tokens // run.batch if run.batch else 0,
            }
        )
        done = tokens
    log(_between(curves, done, math.inf))  # what follows the last evaluation
    if run.status != "FINISHED":
        raise RecordedFailure(f"the recorded run {run.name!r} ended {run.status} in {folder(sweep)}")


def _between(curves: Mapping[str, object], after: float, until: float) -> Dict[str, History]:
    """Each curve's points with after < tokens <= until."""
    out: Dict[str, List[Tuple[int, float]]] = {}
    for metric, curve in curves.items():
        points = [(t, v) for t, v in curve if after < t <= until]
        if points:
            out[metric] = points
    return out
