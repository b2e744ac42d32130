"""The one reader of a report's tables, `trials.csv` and `curves.csv` (the format is a contract,
docs/critical-batch.md "Analysis from tables"), so curves from any trainer can be analysed.

- trials.csv: one row per trial; `trial` (its name) and `status` (MLflow's words: FINISHED,
  FAILED, KILLED, RUNNING) are required; every column whose name has a dot is a config key
  (`batch.tokens_per_update` required; `optim.lr`, `train.seed`, `train.total_tokens`,
  `schedule.warmup_tokens`, `schedule.decay`, `schedule.wsd_decay_share`, ... as the analysis
  reads them); `run_id`, `trial_id`, `stopped_at` and `wall_s` are read when present; other
  columns (what `report --out` adds for people: outcome, final losses) are ignored.
- curves.csv: long form `trial, metric, tokens, value` with MLflow's metric names
  (`train/loss` required; `eval/loss`, `eval/loss_se`, `gns/b_simple`, `train/clipped` optional); `tokens` the
  tokens the weights that produced the value had seen.

Pure Python (csv): no pandas, no MLflow.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

from orchestrator.analysis.trials import BATCH_KEY, Trial
from orchestrator.core.errors import ConfigError

TRIALS, CURVES = "trials.csv", "curves.csv"
CURVE_FIELDS = ("trial", "metric", "tokens", "value")
METRICS = {
    "train/loss": "train",
    "eval/loss": "eval",
    "gns/b_simple": "b_simple",
    "train/clipped": "clipped",
    "eval/loss_se": "eval_se",
}
"""The curves the analysis reads, and the Trial field each goes to."""


def is_table_folder(target: str) -> bool:
    folder = Path(target)
    return folder.is_dir() and (folder / TRIALS).is_file()


def read(folder: Path) -> List[Trial]:
    """The trials of `folder`/trials.csv with their curves from `folder`/curves.csv."""
    for name in (TRIALS, CURVES):
        if not (folder / name).is_file():
            raise ConfigError("SWEEP_OR_RUN", f"{folder} has no {name}; a table folder holds {TRIALS} and {CURVES}")
    return trials_from(_rows(folder / TRIALS), _rows(folder / CURVES), f"{folder}")


def _rows(path: Path) -> List[Dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def trials_from(
    trial_rows: Iterable[Mapping[str, Any]], curve_rows: Iterable[Mapping[str, Any]], where: str = "tables"
) -> List[Trial]:
    """Trials from rows as csv.DictReader gives them (values as text or numbers)."""
    trial_rows, curve_rows = list(trial_rows), list(curve_rows)
    columns = set(trial_rows[0]) if trial_rows else set()
    missing = [c for c in ("trial", "status", BATCH_KEY) if c not in columns]
    if missing:
        raise ConfigError(
            TRIALS, f"{where}: missing column(s) {', '.join(missing)}; it needs trial, status and config keys"
        )
    if curve_rows and any(c not in curve_rows[0] for c in CURVE_FIELDS):
        raise ConfigError(CURVES, f"{where}: the columns must be {', '.join(CURVE_FIELDS)}")
    curves: Dict[str, Dict[str, List[Tuple[int, float]]]] = {}
    for i, r in enumerate(curve_rows):
        if r["metric"] not in METRICS:
            continue
        try:
            point = (int(float(r["tokens"])), float(r["value"]))
        except (TypeError, ValueError):
            raise ConfigError(CURVES, f"{where}: row {i + 2}: tokens and value must be numbers, got {r}") from None
        if math.isfinite(point[1]):
            curves.setdefault(str(r["trial"]), {}).setdefault(r["metric"], []).append(point)
    trials = []
    for r in trial_rows:
        name = str(r["trial"])
        read = {field: sorted(curves.get(name, {}).get(metric, [])) for metric, field in METRICS.items()}
        trials.append(
            Trial(
                run_id=_text(r.get("run_id")) or name,
                name=name,
                status=str(r["status"]),
                params={k: _param(v) for k, v in r.items() if "." in k and _text(v) is not None},
                duration_s=_number(r.get("wall_s")),
                stopped_at=_whole(r.get("stopped_at")),
                trial_id=_text(r.get("trial_id")),
                **read,
            )
        )
    return trials


def _text(value: Any) -> Any:
    """A cell, None when empty (pandas writes missing values as '')."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return None if str(value) in ("", "nan", "<NA>", "None") else str(value)


def _param(value: Any) -> str:
    """A param as MLflow holds it: text; whole floats as integers ('4096.0' -> '4096')."""
    text = str(value)
    try:
        number = float(text)
    except ValueError:
        return text
    return str(int(number)) if number.is_integer() and "e" not in text.lower() and "." in text else text


def _number(value: Any):
    text = _text(value)
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _whole(value: Any):
    number = _number(value)
    return int(number) if number is not None else None


def rows_of(trials: Sequence[Trial]) -> Tuple[List[Dict[str, Any]], List[Tuple[str, str, int, float]]]:
    """(trials rows, curves rows) of in-memory trials, the inverse of `trials_from`."""
    rows = [{"trial": t.name, "status": t.status, **t.params} for t in trials]
    curves = [(t.name, metric, tok, v) for t in trials for metric, f in METRICS.items() for tok, v in getattr(t, f)]
    return rows, curves
