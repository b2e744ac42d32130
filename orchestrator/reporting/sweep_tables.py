"""A finished sweep (or one run) as pandas tables, for notebooks: `load_sweep(...)`.

    from orchestrator.reporting.sweep_tables import load_sweep
    sweep = load_sweep("smoke", tracking_uri="sqlite:///mlflow.db")
    sweep.trials    # one row per trial: outcome, final metrics, short aliases, every param by its dotted key
    sweep.curves    # long: trial, run_id, metric (names categorical), tokens, value -- every point MLflow holds
    sweep.fit       # the report's numbers (best configuration per batch size, B_crit, B_simple)
    sweep.fit.answer  # the same as typed records (orchestrator/analysis/answer.py), what report.json holds
    sweep.recommended.config  # the run to launch as a typed train config; .to_yaml() is recommended.yaml

Reading is report_inputs.py's (MLflow only through tracking/store.py), the numbers are
`sweep_analysis.analyse`'s (the `Answer`, as `report` writes it): this module only lays them out.
`orchestrator report --out DIR` writes the same two tables as trials.csv and curves.csv, in the
format `orchestrator report DIR` reads back (tables.py): every param as a column by its dotted
config key, so the output is its input. The only module that imports pandas.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from orchestrator.analysis.answer import Answer, BestRow, TargetFit, Trend
from orchestrator.analysis.trials import BATCH_KEY, Curve, Trial, param_value
from orchestrator.core import sweep_file
from orchestrator.reporting import recommended, report_inputs
from orchestrator.reporting.recommended import Recommended
from orchestrator.reporting.report_inputs import Curves

METRICS = ("train/loss", "eval/loss", "gns/b_simple", "train/clipped", "train/lr", "perf/tokens_per_s")
"""The curves `load_sweep` reads by default (and `report` writes to curves.csv)."""
CURVE_COLUMNS = ["trial", "run_id", "metric", "tokens", "value"]
ALIASES = {
    "batch": BATCH_KEY,
    "lr": "optim.lr",
    "b": "batch.micro_batch_size",
    "D": "cluster.num_workers",
    "A": "batch.grad_accum_steps",
    "seed": "train.seed",
}
"""Short columns of the trials table for notebooks (the batch formula S x b x D x A, the seed);
the same values are also in their dotted columns, which are what `report DIR` reads."""
FIT_COLUMNS = ["target_loss", "status", "b_crit", "b_crit_low", "b_crit_high", "b_crit_bound", "b_crit_fit"]
FIT_COLUMNS += ["s_min", "e_min", "b_simple", "lack_of_fit_p", "batch_sizes", "notes"]
FIT_NUMBERS = [c for c in FIT_COLUMNS if c not in ("status", "notes")]
BEST_COLUMNS = ["batch", "final_loss", "spread", "seeds", "lr", "lr_edge", "trial", "run_id", "configurations"]


@dataclass
class Fit:
    """The report's numbers as tables and scalars, from `answer` (sweep_analysis.analyse: its
    docstring states every rule)."""

    loss_metric: str
    """What a final loss is: the last eval/loss when every finished trial has one, else the end of
    the monotone fit of train/loss."""
    axes: List[str]
    """The swept axes: config keys whose values differ between trials, the batch size first."""
    best_per_batch: pd.DataFrame
    """Per batch size its best configuration by final loss: batch, final_loss (mean over seeds), spread,
    seeds, lr (the best lr interpolated between the lrs tried), lr_edge (lowest/highest: the best is
    at an edge of the lrs tried), trial, run_id (its best seed), configurations (how many were
    scored), then one column per axis."""
    best: Optional[Dict[str, Any]]
    """The row of best_per_batch with the lowest final loss."""
    critical_batch: pd.DataFrame
    """Per target loss: target_loss, status (resolved, below, above, not resolved), b_crit (NaN unless
    resolved), b_crit_low/high (the 90% seed bootstrap), b_crit_bound (below: B_crit is under it;
    above: over it), b_crit_fit (the fit whatever the status), s_min, e_min, b_simple,
    lack_of_fit_p, batch_sizes (how many reached the target), notes."""
    targets: List[float]
    targets_chosen: bool
    """True when the targets were chosen by the analysis, False when given."""
    target_loss: Optional[float]
    """The primary target: the lowest resolved one (else the first)."""
    b_crit: Optional[float]
    b_crit_interval: Optional[Tuple[float, float]]
    b_simple: Optional[float]
    status: Optional[str]
    """The primary target's status."""
    trend: Trend
    """.b_crit_slope (of log B_crit on log target loss), .b_crit_slope_interval, .b_simple_slope, .agree, .note."""
    lr_criterion: str
    """What `best_lr` minimises: final_loss or steps (to the primary target)."""
    best_lr: pd.DataFrame
    """Per batch size the one best lr the report names: batch, lr, edge."""
    steps_to_target: pd.DataFrame
    """The points the critical batch size is fitted to, one row per target loss and batch size:
    target_loss, batch, steps and tokens to reach it (at the best lr), lr, lr_edge, and what else
    the analysis keeps per point."""
    lr_coef: Optional[float]
    lr_alpha: Optional[float]
    """lr_opt ~ lr_coef * B ** lr_alpha through the best configurations (None: not fitted)."""
    finished: int
    stopped: int
    stopped_rungs: Dict[int, int]
    """Rung (tokens) -> how many trials the scheduler stopped there."""
    failed: int
    incomplete: int
    notes: List[str]
    """The primary target's notes (why B_crit is not resolved, why there is no interval, ...)."""
    answer: Answer = field(repr=False)
    """The typed answer these are laid out from."""
    raw: Dict[str, Any] = field(repr=False)
    """The answer as report.json holds it (`answer.to_json()`)."""


@dataclass
class SweepResults:
    name: str
    run_id: str
    """The sweep's parent run (or the single run)."""
    trials: pd.DataFrame
    curves: pd.DataFrame
    fit: Optional[Fit]
    """None when no trial has both a batch size and a train/loss curve (nothing to analyse)."""
    tracking_uri: str = ""
    recommended: Optional[Recommended] = None
    """The run the report recommends, as recommended.yaml holds it: `.config` (the typed train
    config), `.overrides()` (dotted keys), `.to_yaml()`; None when there is nothing to recommend."""

    def to_csv(self, folder: Union[str, os.PathLike]) -> List[Path]:
        """trials.csv and curves.csv in folder (read back with pandas.read_csv), text that a
        spreadsheet would run as a formula made inert (_inert)."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / "trials.csv", out / "curves.csv"]
        _inert(self.trials).to_csv(paths[0], index=False)
        write_csv(_inert(self.curves), paths[1])
        return paths


CSV_CHUNK_ROWS = 1 << 20
"""Rows write_csv turns into text at a time: categorical names are decoded a chunk at a time."""


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    """A long table as csv by pyarrow's writer (ten times pandas' on a million rows); strings quoted."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    table = pa.Table.from_pandas(frame, preserve_index=False)
    schema = pa.schema(
        [pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in table.schema]
    )
    options = pacsv.WriteOptions(quoting_style="needed")
    with pacsv.CSVWriter(path, schema, write_options=options) as writer:
        for batch in table.to_batches(max_chunksize=CSV_CHUNK_ROWS):  # the texts decoded a chunk at a time
            writer.write_batch(
                pa.RecordBatch.from_arrays([c.cast(f.type) for c, f in zip(batch.columns, schema)], schema=schema)
            )


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""What makes a spreadsheet read a cell as a formula (a trial named `=cmd|' /C calc'!A0`)."""


def _inert(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with each text cell that starts like a formula behind a quote ('=...): OWASP's
    advice for CSV files. Numbers stay as they are (and no text reads as one: param_value made those numbers)."""
    out = frame.copy()
    for column in [c for c in out.columns if not pd.api.types.is_numeric_dtype(out[c])]:
        values = out[column]
        if isinstance(values.dtype, pd.CategoricalDtype):  # each text once, not once a row
            labels = values.cat.categories
            risky = labels.map(lambda v: isinstance(v, str) and v.startswith(FORMULA_START))
            if risky.any():
                out[column] = values.cat.rename_categories([f"'{v}" if r else v for v, r in zip(labels, risky)])
            continue
        risky = values.map(type).eq(str) & values.astype(str).str.startswith(FORMULA_START)
        if risky.any():
            out[column] = values.where(~risky, "'" + values.astype(str))
    return out


def load_sweep(
    name_or_file: Union[str, os.PathLike],
    tracking_uri: Optional[str] = None,
    experiment: Optional[str] = None,
    metrics: Optional[Sequence[str]] = None,
    target_losses: Optional[Sequence[float]] = None,
) -> SweepResults:
    """A sweep by name, sweep file or run id, resolved like `orchestrator report` (a sweep file's
    `tracking.*` overrides name its store; `tracking_uri` and `experiment` win). `metrics`: the
    curves to read (default METRICS); `target_losses` as `report --target-loss`."""
    overrides = [f"tracking.uri={tracking_uri}"] if tracking_uri else []
    overrides += [f"tracking.experiment={experiment}"] if experiment else []
    target = os.fspath(name_or_file)
    given = sweep_file.load(target, check=False) if Path(target).is_file() else None
    uri, name, run_id = report_inputs.resolve(target, overrides, given)
    inputs = report_inputs.read_mlflow(uri, name, run_id, list(metrics or METRICS))
    answer = None
    if any(t.batch and t.train for t in inputs.trials):  # the settings `report` takes: one answer per sweep
        settings, _ = report_inputs.settings_of_sweep(given, uri, run_id)
        answer = report_inputs.analyse(inputs, target_losses, settings.origin, **settings.options)
    return build(name, run_id, inputs.trials, inputs.curves, answer, inputs.metrics, uri)


# ---------------------------------------------------------------- building (pure: no MLflow)


def build(
    name: str,
    run_id: str,
    trials: Sequence[Trial],
    curves: Curves,
    answer: Optional[Answer],
    metrics: Sequence[str] = METRICS,
    tracking_uri: str = "",
) -> SweepResults:
    return SweepResults(
        name,
        run_id,
        trials_frame(trials),
        curves_frame(trials, curves, metrics),
        fit_of(answer),
        tracking_uri,
        recommended.for_answer(trials, answer) if answer else None,
    )


def trials_frame(trials: Sequence[Trial]) -> pd.DataFrame:
    """One row per trial, in the order given (report reads them oldest first): what people read
    first, the short aliases, then every param by its dotted key (what `report DIR` reads)."""
    keys = sorted(set().union(*(t.params for t in trials)) if trials else set())
    typed = {k: _column([t.params.get(k) for t in trials]) for k in keys}
    rows = [
        {
            "trial": t.name,
            "run_id": t.run_id,
            "trial_id": t.trial_id,
            "status": t.status,
            "outcome": t.outcome,
            **{alias: param_value(t.params.get(key)) for alias, key in ALIASES.items()},
            "tokens": t.tokens_seen,
            "final_train_loss": t.final("train/loss"),
            "final_eval_loss": t.final("eval/loss"),
            "b_simple": _last(t.b_simple),
            "stopped_at": t.stopped_at,
            "wall_s": t.duration_s,
            "checkpoints": t.checkpoints,
            **{k: typed[k][i] for k in keys},
        }
        for i, t in enumerate(trials)
    ]
    columns = ["trial", "run_id", "trial_id", "status", "outcome", *ALIASES, "tokens", "final_train_loss"]
    columns += ["final_eval_loss", "b_simple", "stopped_at", "wall_s", "checkpoints", *keys]
    numbers = [*ALIASES, "final_train_loss", "final_eval_loss", "b_simple", "stopped_at", "wall_s"]
    return _frame(rows, columns, numbers)


def curves_frame(trials: Sequence[Trial], curves: Curves, metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """Every point of `metrics` for every trial: trial, run_id, metric, tokens (the MLflow step),
    value. Built by columns (the names categorical): ten million points as Python rows would cost
    gigabytes."""
    parts = [
        (i, j, Curve.of(curves.get(t.run_id, {}).get(metric, [])))
        for i, t in enumerate(trials)
        for j, metric in enumerate(metrics)
    ]
    parts = [(i, j, c) for i, j, c in parts if len(c)]
    lengths = np.array([len(c) for _, _, c in parts], dtype=np.int64)
    trial_codes = np.repeat(np.array([i for i, _, _ in parts], dtype=np.int32), lengths)
    metric_codes = np.repeat(np.array([j for _, j, _ in parts], dtype=np.int32), lengths)
    return pd.DataFrame(
        {
            "trial": _categorical(trial_codes, [t.name for t in trials]),
            "run_id": _categorical(trial_codes, [t.run_id for t in trials]),
            "metric": _categorical(metric_codes, list(metrics)),
            "tokens": np.concatenate([c.tokens for _, _, c in parts]) if parts else np.zeros(0, np.int64),
            "value": np.concatenate([c.values for _, _, c in parts]) if parts else np.zeros(0, np.float64),
        },
        columns=CURVE_COLUMNS,
    )


def _categorical(codes: np.ndarray, labels: Sequence[str]) -> pd.Categorical:
    """codes into `labels` (which may repeat: two trials of one name) as a categorical of their texts."""
    unique, inverse = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)
    return pd.Categorical.from_codes(inverse[codes] if len(codes) else codes, categories=unique)


def fit_of(answer: Optional[Answer]) -> Optional[Fit]:
    """The answer laid out as a Fit (None stays None)."""
    if answer is None:
        return None
    rows = [_best_row(r) for r in answer.best_per_batch]
    best, primary = answer.best, answer.primary
    return Fit(
        loss_metric=answer.loss_metric,
        axes=list(answer.axes),
        best_per_batch=_frame(rows, list(dict.fromkeys([*BEST_COLUMNS, *(k for r in rows for k in r)])), ["spread"]),
        best=next((r for r in rows if best and r["batch"] == best.batch), None),
        critical_batch=_frame([_fit_row(f) for f in answer.critical_batch], FIT_COLUMNS, FIT_NUMBERS),
        targets=[f.target_loss for f in answer.critical_batch],
        targets_chosen=answer.targets_chosen,
        target_loss=primary.target_loss if primary else None,
        b_crit=primary.b_crit if primary else None,
        b_crit_interval=primary.b_crit_interval if primary else None,
        b_simple=primary.b_simple if primary else None,
        status=primary.status if primary else None,
        trend=answer.trend,
        lr_criterion=answer.lr_criterion,
        best_lr=_frame([r.to_json() for r in answer.best_lr], ["batch", "lr", "edge"], ["lr"]),
        steps_to_target=_steps_frame(answer.critical_batch),
        lr_coef=answer.lr_scaling.coef,
        lr_alpha=answer.lr_scaling.alpha,
        finished=answer.counts.finished,
        stopped=answer.counts.stopped,
        stopped_rungs=dict(answer.counts.stopped_rungs),
        failed=answer.counts.failed,
        incomplete=answer.counts.incomplete,
        notes=list(primary.notes) if primary else [],
        answer=answer,
        raw=answer.to_json(),
    )


def _fit_row(f: TargetFit) -> Dict[str, Any]:
    """A target's fit as a row of the critical_batch table (its interval as two columns)."""
    low, high = f.b_crit_interval or (None, None)
    return {
        "target_loss": f.target_loss,
        "status": f.status,
        "b_crit": f.b_crit,
        "b_crit_low": low,
        "b_crit_high": high,
        "b_crit_bound": f.b_crit_bound,
        "b_crit_fit": f.b_crit_fit,
        "s_min": f.s_min,
        "e_min": f.e_min,
        "b_simple": f.b_simple,
        "lack_of_fit_p": f.lack_of_fit.p,
        "batch_sizes": len(f.points),
        "notes": "; ".join(f.notes),
    }


def _steps_frame(fits: Sequence[TargetFit]) -> pd.DataFrame:
    rows = [{"target_loss": f.target_loss, **p.to_json()} for f in fits for p in f.points]
    first = ["target_loss", "batch", "steps", "tokens", "lr", "lr_edge"]
    columns = list(dict.fromkeys([*first, *(k for r in rows for k in r)]))
    return _frame(rows, columns, ["target_loss", "steps", "tokens", "lr"])


def _best_row(r: BestRow) -> Dict[str, Any]:
    """A best_per_batch entry with its settings as columns (the batch size and lr are columns already)."""
    row = {k: getattr(r, "run_name" if k == "trial" else k) for k in BEST_COLUMNS}
    settings = {k: v for k, v in r.settings.items() if k not in (BATCH_KEY, "optim.lr")}
    return {**row, **settings}


def _last(curve: Curve) -> Optional[float]:
    return curve[-1][1] if curve else None


def _column(values: List[Any]) -> List[Any]:
    """A param's values over the trials as the None, bools and numbers they spell when every one
    spells one (param_value), else as logged: a column of names keeps a name that looks like a number
    (a trial id such as '73714518', or '29e68690', which float() reads as inf)."""
    scalars = [param_value(v) for v in values]
    return values if any(isinstance(v, str) for v in scalars) else scalars


def _frame(rows: List[Dict[str, Any]], columns: List[str], numbers: Sequence[str] = ()) -> pd.DataFrame:
    """Columns typed by their values: whole numbers as Int64 (missing ones stay <NA>), other
    numbers as float64, anything else as it is; `numbers` with no value at all are float64 NaN."""
    data = {}
    for col in columns:
        values = [r.get(col) for r in rows]
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
            data[col] = pd.array(values, dtype="Int64")
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present) and (
            present or col in numbers
        ):
            data[col] = pd.Series(values, dtype="float64")
        else:
            data[col] = values
    return pd.DataFrame(data, columns=columns)
