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

Whatever the analysis could not use is refused in one line naming the file, row and column
(ConfigError, exit 2): a cell over MAX_CELL characters or not UTF-8, a row longer than the
header, a repeated trial name or (trial, metric, tokens), tokens that are not a finite whole
number >= 0, a batch size that is not one >= 1, a model size (`model.params`) that is not a
finite number >= 1, a config value that is not finite, or negative
where its rule (validation.FIELDS) allows no negative value. A curve's non-finite values (a
diverged run's loss) are left out.

Pure: csv and pyarrow's csv reader (curves.csv by columns, the row reader naming what it
refuses), no pandas, no MLflow.
"""

from __future__ import annotations

import csv
import logging
import math
import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from orchestrator.analysis.trials import BATCH_KEY, PARAMS_KEY, Curve, Trial
from orchestrator.core.errors import ConfigError
from orchestrator.core.validation import FIELDS

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
MAX_CELL = 128 * 1024
"""The longest cell read, in characters (Python's csv module's own limit, which it enforces with
an error that names no cell)."""
_UNDECODABLE = re.compile("[\udc80-\udcff]")  # bytes that are not UTF-8, as surrogateescape reads them
log = logging.getLogger(__name__)


def is_table_folder(target: str) -> bool:
    folder = Path(target)
    return folder.is_dir() and (folder / TRIALS).is_file()


def read(folder: Path) -> List[Trial]:
    """The trials of `folder`/trials.csv with their curves from `folder`/curves.csv; curves of a
    trial trials.csv has no row for are not read, and a warning says how many."""
    for name in (TRIALS, CURVES):
        if not (folder / name).is_file():
            raise ConfigError("SWEEP_OR_RUN", f"{folder} has no {name}; a table folder holds {TRIALS} and {CURVES}")
    trial_rows = _rows(folder / TRIALS)
    curves = _curves_columnar(folder / CURVES)
    if curves is None:
        curves = _curves(_rows(folder / CURVES), _Where(CURVES, str(folder)))
    trials = trials_from(trial_rows, [], f"{folder}", curves=curves)
    unknown = sorted(set(curves) - {t.name for t in trials})
    if unknown:
        log.warning(
            "%s: %d trial(s) have curves but no row in %s (%s%s): their curves are not read",
            folder / CURVES,
            len(unknown),
            TRIALS,
            ", ".join(repr(name) for name in unknown[:3]),
            ", ..." if len(unknown) > 3 else "",
        )
    return trials


def _curves_columnar(path: Path) -> Optional[Dict[str, Dict[str, Curve]]]:
    """curves.csv read by columns (pyarrow's csv reader, no Python loop per cell; the trial and
    metric names dictionary-encoded, so each is held once, not once a row): the same curves as the
    row reader's, or None when any row would be refused, so that the row reader (_rows, _curves)
    names it."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    names = pa.dictionary(pa.int32(), pa.string())
    types = {"trial": names, "metric": names, "tokens": pa.float64(), "value": pa.float64()}
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(use_threads=True),
            convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=False),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError):  # a row the row reader refuses by name
        return None
    if any(c not in table.column_names for c in CURVE_FIELDS) or any(
        pa.types.is_binary(table[c].type)
        for c in table.column_names  # text that is not UTF-8
    ):
        return None
    table = table.unify_dictionaries()
    columns = {}
    for name in table.column_names:
        column = table[name].combine_chunks() if table[name].num_chunks else pa.array([], table[name].type)
        if pa.types.is_dictionary(column.type):  # a cell the row reader refuses for its length
            labels = column.dictionary.to_pylist()
            if column.null_count or any(len(v) > MAX_CELL for v in labels):
                return None
            columns[name] = (column.indices.to_numpy(zero_copy_only=False), labels)
        elif pa.types.is_string(column.type):
            if len(column) and (pc.max(pc.utf8_length(column)).as_py() or 0) > MAX_CELL:
                return None
        else:
            if column.null_count and name in ("tokens", "value"):
                return None
            columns[name] = column.to_numpy(zero_copy_only=False)
    (trial, trial_names), (metric, metric_names) = columns["trial"], columns["metric"]
    return _curves_of_columns(trial, trial_names, metric, metric_names, columns["tokens"], columns["value"])


def _curves_in_memory(rows: Sequence[Mapping[str, Any]]) -> Optional[Dict[str, Dict[str, Curve]]]:
    """Rows held in memory with numbers as numbers (a caller's tables) read by columns, like
    curves.csv; None when a row would be refused or a cell is text (then the row reader reads
    them, and names what it refuses)."""
    return curves_from_columns(*([r[c] for r in rows] for c in CURVE_FIELDS))


def curves_from_columns(
    trial: Sequence[Any], metric: Sequence[Any], tokens: Sequence[Any], values: Sequence[Any]
) -> Optional[Dict[str, Dict[str, Curve]]]:
    """{trial: {metric: Curve}} of curves.csv's four columns held in memory (tokens and values as
    numbers): what the row reader reads of them, or None where it would refuse a row or a cell
    is text."""
    tokens, values = np.asarray(tokens), np.asarray(values)
    if (
        tokens.dtype.kind not in "iuf"
        or values.dtype.kind not in "iuf"
        or not (len(trial) == len(metric) == len(tokens) == len(values))
    ):
        return None
    trial_codes, trial_names = _codes(trial)
    metric_codes, metric_names = _codes(metric)
    return _curves_of_columns(
        trial_codes, trial_names, metric_codes, metric_names, tokens.astype(np.float64), values.astype(np.float64)
    )


def _codes(cells: Sequence[Any]) -> Tuple[np.ndarray, List[str]]:
    """(each cell's code, the names in the order they first appear) of a column of names."""
    text = np.asarray(cells) if len(cells) else np.array([], str)
    text = text if text.dtype.kind == "U" else np.asarray([str(c) for c in cells])
    names, first, codes = np.unique(text, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return rank[codes.reshape(-1)], names[order].tolist()


def _curves_of_columns(
    trial: np.ndarray, trial_names: Sequence[str], metric: np.ndarray, metric_names: Sequence[str], tokens, values
) -> Optional[Dict[str, Dict[str, Curve]]]:
    """{trial: {metric: Curve}} from columns (trial and metric as codes into their names), the
    rows `_curves` reads and keeps; None where it would refuse one."""
    keep = np.isin(metric, [i for i, m in enumerate(metric_names) if m in METRICS])
    trial, metric, tokens, values = trial[keep], metric[keep], tokens[keep], values[keep]
    if not (np.isfinite(tokens).all() and (tokens >= 0).all() and (tokens == np.floor(tokens)).all()):
        return None
    order = np.lexsort((tokens, metric, trial))
    trial, metric, tokens, values = trial[order], metric[order], tokens[order].astype(np.int64), values[order]
    same_curve = (trial[1:] == trial[:-1]) & (metric[1:] == metric[:-1])
    if (same_curve & (tokens[1:] == tokens[:-1])).any():
        return None  # a repeated (trial, metric, tokens)
    finite = np.isfinite(values)  # a diverged run's loss is left out
    trial, metric, tokens, values = trial[finite], metric[finite], tokens[finite], values[finite]
    starts = np.flatnonzero(np.r_[True, (trial[1:] != trial[:-1]) | (metric[1:] != metric[:-1])]) if len(trial) else []
    curves: Dict[str, Dict[str, Curve]] = {}
    for start, end in zip(starts, [*starts[1:], len(trial)]):
        curves.setdefault(trial_names[trial[start]], {})[metric_names[metric[start]]] = Curve(
            tokens[start:end], values[start:end]
        )
    return curves


def _rows(path: Path) -> List[Dict[str, str]]:
    """The rows of a csv file as text; a cell over MAX_CELL characters or not UTF-8, or a row
    longer than the header, is a ConfigError naming the file, row and column."""
    where = _Where(path.name, str(path.parent))
    limit = csv.field_size_limit(2**31 - 1)  # read a long cell whole, to name its row and column
    try:
        with path.open(newline="", encoding="utf-8", errors="surrogateescape") as f:
            reader = csv.DictReader(f)
            _check_cells(where, 1, {name: name for name in reader.fieldnames or []})  # the header
            rows = []
            for i, row in enumerate(reader):
                _check_cells(where, i + 2, row)
                rows.append(row)
            return rows
    except csv.Error as exc:
        raise where.error(reader.line_num, None, f"not a csv row ({exc})") from None
    finally:
        csv.field_size_limit(limit)


def _check_cells(where: "_Where", row: int, cells: Mapping[Optional[str], Any]) -> None:
    for column, value in cells.items():
        if column is None:  # csv.DictReader's key for the cells past the header's columns
            raise where.error(row, None, "more cells than the header has columns")
        if len(value or "") > MAX_CELL:
            raise where.error(row, column, f"a cell of {len(value):,} characters; at most {MAX_CELL:,}")
        if _UNDECODABLE.search(value or ""):
            raise where.error(row, column, "not UTF-8 text")


class _Where:
    """A table, for refusals that name its file, the row (the header is row 1) and the column."""

    def __init__(self, file: str, folder: str):
        self.file, self.folder = file, folder

    def error(self, row: int, column: Optional[str], problem: str) -> ConfigError:
        cell = f"row {row}" + (f", column {_shown(column)}" if column is not None else "")
        return ConfigError(self.file, f"{self.folder}: {cell}: {problem}")


def _shown(value: Any) -> str:
    """A cell in a one-line message: its repr, undecodable bytes as '?', cut at 60 characters."""
    text = repr(_UNDECODABLE.sub("?", str(value)))
    return text if len(text) <= 60 else text[:57] + "..."


def trials_from(
    trial_rows: Iterable[Mapping[str, Any]],
    curve_rows: Iterable[Mapping[str, Any]],
    where: str = "tables",
    curves: Optional[Dict[str, Dict[str, Curve]]] = None,
) -> List[Trial]:
    """Trials from rows as csv.DictReader gives them (values as text or numbers); `curves`: the
    curves already read by columns (then curve_rows is not read)."""
    trial_rows, curve_rows = list(trial_rows), list(curve_rows)
    columns = set(trial_rows[0]) if trial_rows else set()
    missing = [c for c in ("trial", "status", BATCH_KEY) if c not in columns]
    if missing:
        raise ConfigError(
            TRIALS, f"{where}: missing column(s) {', '.join(missing)}; it needs trial, status and config keys"
        )
    if curve_rows and any(c not in curve_rows[0] for c in CURVE_FIELDS):
        raise ConfigError(CURVES, f"{where}: the columns must be {', '.join(CURVE_FIELDS)}")
    if curves is None:
        curves = _curves_in_memory(curve_rows)
    if curves is None:
        curves = _curves(curve_rows, _Where(CURVES, where))
    table, trials, row_of = _Where(TRIALS, where), [], {}
    for row, r in enumerate(trial_rows, start=2):
        name = str(r["trial"])
        if name in row_of:
            raise table.error(row, "trial", f"{_shown(name)} is also row {row_of[name]}'s; a trial's name is unique")
        row_of[name] = row
        params = {k: _param(v) for k, v in r.items() if "." in k and _text(v) is not None}
        problem = next(((key, p) for key, value in params.items() if (p := _param_problem(key, value))), None)
        if problem:
            raise table.error(row, *problem)
        stopped = _number(r.get("stopped_at"))
        if stopped is not None and not _is_tokens(stopped):
            raise table.error(row, "stopped_at", f"got {_shown(r['stopped_at'])}; tokens: a whole number >= 0")
        read = {field: Curve.of(curves.get(name, {}).get(metric, [])) for metric, field in METRICS.items()}
        trials.append(
            Trial(
                run_id=_text(r.get("run_id")) or name,
                name=name,
                status=str(r["status"]),
                params=params,
                duration_s=_number(r.get("wall_s")),
                stopped_at=int(stopped) if stopped is not None else None,
                trial_id=_text(r.get("trial_id")),
                **read,
            )
        )
    return trials


def _curves(rows: Sequence[Mapping[str, Any]], where: _Where) -> Dict[str, Dict[str, List[Tuple[int, float]]]]:
    """{trial: {metric: [(tokens, value)]}} of the metrics the analysis reads (other rows are not
    read); a row with tokens that are not a whole number >= 0, or a (trial, metric, tokens) seen
    before, is refused; non-finite values (a diverged run's loss) are left out."""
    curves: Dict[str, Dict[str, List[Tuple[int, float]]]] = {}
    row_of: Dict[Tuple[str, str, int], int] = {}
    for row, r in enumerate(rows, start=2):
        if r["metric"] not in METRICS:
            continue
        tokens = _number(r["tokens"])
        if tokens is None or not _is_tokens(tokens):
            raise where.error(row, "tokens", f"got {_shown(r['tokens'])}; tokens: a whole number >= 0")
        try:
            value = float(r["value"])
        except (TypeError, ValueError):
            raise where.error(row, "value", f"got {_shown(r['value'])}; a number") from None
        point = (str(r["trial"]), r["metric"], int(tokens))
        if point in row_of:
            raise where.error(row, "tokens", f"{point} is also row {row_of[point]}'s; a curve has one value per tokens")
        row_of[point] = row
        if math.isfinite(value):
            curves.setdefault(point[0], {}).setdefault(point[1], []).append((point[2], value))
    return curves


NON_FINITE = ("inf", "infinity", "nan")


def _is_tokens(x: float) -> bool:
    return math.isfinite(x) and x >= 0 and x.is_integer()


def _param_problem(key: str, text: str) -> Optional[str]:
    """What is wrong with a config value, if anything: a number must be finite (as the config's own
    values are), whole where its rule counts (validation.FIELDS) and not below its rule's
    non-negative lower bound (counts from 1, sizes and rates from 0: a budget of 0 tokens is
    refused like a batch of 0), the batch size a whole number >= 1 and a model's size
    (model.params) a finite number >= 1."""
    number = _number(text)
    if number is None:
        return None
    if key == PARAMS_KEY:  # derived, no config key: a ladder's rungs are grouped by it, its laws take its log
        return None if math.isfinite(number) and number >= 1 else f"got {_shown(text)}; a number of parameters >= 1"
    if key == BATCH_KEY:
        return None if _is_tokens(number) and number >= 1 else f"got {_shown(text)}; a whole number >= 1"
    rule = FIELDS.get(re.sub(r"\.\d+\.", ".*.", key))
    if rule is not None and rule.kind not in ("int", "float"):
        return None  # a text field: '29e68690' is a trial's name, not a number too large for a float
    if rule is None and not math.isfinite(number) and str(text).strip().lower().lstrip("+-") not in NON_FINITE:
        return None  # spelled as a finite number that overflows a float: text of another trainer's
    if not math.isfinite(number):
        return f"got {_shown(text)}; a finite number"
    if rule is not None and rule.kind == "int" and not number.is_integer():
        return f"got {_shown(text)}; a whole number"
    if rule is not None and rule.low is not None and rule.low >= 0 and number < rule.low:
        return f"got {_shown(text)}; a number >= {rule.low:g}"
    return None


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


def rows_of(trials: Sequence[Trial]) -> Tuple[List[Dict[str, Any]], List[Tuple[str, str, int, float]]]:
    """(trials rows, curves rows) of in-memory trials, the inverse of `trials_from`."""
    rows = [{"trial": t.name, "status": t.status, **t.params} for t in trials]
    curves = [(t.name, metric, tok, v) for t in trials for metric, f in METRICS.items() for tok, v in getattr(t, f)]
    return rows, curves
