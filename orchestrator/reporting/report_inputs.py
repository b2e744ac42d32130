"""What a report reads: a sweep file, a sweep's name or a run id resolved in the MLflow store, and
its runs as `trials.Trial` records with the curves the analysis needs (MLflow only through the
door, tracking/store.py, whose run records become trials here), or a folder of trials.csv and
curves.csv; either way as `Inputs`, which `analyse` turns into the answer with where it was read
from. `report`, `sweep_tables.load_sweep`, the sweep's closing summary and the bracket searcher all read
runs through here."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from orchestrator.analysis import branch_cbs, sweep_analysis, tables
from orchestrator.analysis.answer import Answer, Source
from orchestrator.analysis.trials import Curve, Trial
from orchestrator.core import config, sweep_file, sweep_schema
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import TrackingConfig
from orchestrator.tracking.records import RunRecord
from orchestrator.tracking.run_tags import CHECKPOINTS_TAG, ROLE_TAG, STOPPED_AT_TAG, SWEEP_ROLE, SWEEP_TAG, TRIAL_TAG
from orchestrator.tracking.store import Store, resolve_uri

METRICS = tuple(tables.METRICS)
"""The curves the analysis reads (train/loss, eval/loss, gns/b_simple, train/clipped, eval/loss_se)."""
Curves = Mapping[str, Mapping[str, Curve]]
"""{run id: {metric: [(tokens, value)] sorted by tokens}}, as read_curves returns."""


@dataclass(frozen=True)
class Inputs:
    """What a report is made from, however it was read."""

    name: str
    """The report's name: the sweep's, the run's, or the table folder's."""
    trials: Tuple[Trial, ...]
    """The runs as the analysis reads them, oldest first."""
    curves: Curves
    """Every curve read, by run id and metric: what curves.csv lays out."""
    metrics: Tuple[str, ...]
    """The metrics curves.csv holds."""
    source: Source
    """Where they were read from (report.json's `source`: the store's password redacted)."""
    uri: Optional[str] = None
    """The MLflow store they were read from, the report then logged to source.run_id; None for tables."""

    @property
    def folder(self) -> Optional[Path]:
        """The table folder they were read from (a report never writes there); None for MLflow."""
        return Path(self.source.uri) if self.source.kind == "tables" else None


def tracking_for(
    target: str, overrides: List[str], sweep: Optional[sweep_schema.Sweep] = None
) -> Tuple[Optional[str], TrackingConfig]:
    """(sweep name when target is a sweep file, its tracking: the store's uri resolved, the
    experiment, the extra sinks). The `tracking.*` entries of a sweep file's `base.overrides` name
    them; the command line's overrides win. `sweep`: the sweep file as the command read it already
    (a command parses it once)."""

    name, extra = None, []
    if target.endswith((".yaml", ".yml")) or Path(target).is_file():
        if sweep is None:
            if not Path(target).is_file():
                raise ConfigError("SWEEP_OR_RUN", f"sweep file {target} not found")
            sweep = sweep_file.load(target, check=False)  # its base config need not resolve here
        if not sweep.named:
            raise ConfigError("name", f"sweep file {target} has no top-level `name:`; valid: a sweep YAML with name")
        name, extra = sweep.name, [o for o in sweep.base_overrides if o.startswith("tracking.")]
    tracking = config.load(None, extra + list(overrides)).tracking
    tracking.uri = resolve_uri(tracking.uri)
    return name, tracking


def resolve(target: str, overrides: List[str], sweep: Optional[sweep_schema.Sweep] = None) -> Tuple[str, str, str]:
    """(tracking uri, report name, run id of the sweep's parent run or of the single run); `sweep`
    as tracking_for's."""
    sweep_name, tracking = tracking_for(target, overrides, sweep)
    uri, experiment = tracking.uri, tracking.experiment
    store = Store(uri, experiment)
    if not store.exists():
        raise ConfigError("tracking.uri", f"no MLflow store at {uri}; pass tracking.uri=<the store of the sweep>")
    run = None if sweep_name else store.try_get_run(target)
    if run is not None:
        return uri, run.name or run.run_id, run.run_id
    sweep_name = sweep_name or target
    try:
        run_id = store.find_sweep_run_anywhere(sweep_name)
    except ValueError as exc:  # a name no MLflow filter can hold
        raise ConfigError("SWEEP_OR_RUN", str(exc)) from None
    if run_id is None:
        raise ConfigError(
            "SWEEP_OR_RUN",
            f"no sweep named {sweep_name!r} (run tagged {ROLE_TAG}={SWEEP_ROLE}, "
            f"{SWEEP_TAG}={sweep_name!r}) and no run with that id in {uri} "
            f"(searched experiment {experiment!r}, then all)",
        )
    return uri, sweep_name, run_id


@dataclass(frozen=True)
class Settings:
    """What a report asks of the analysis and where each setting came from: the same whichever way
    the sweep is named (its file, its name, its parent run's id, `load_sweep`, the end of `sweep`)."""

    options: Dict[str, Any]
    """sweep_analysis.analyse's keyword arguments: lr_criterion, primary_target, branch_tolerance,
    loss_tolerance (a ladder's too)."""
    origin: Dict[str, str]
    """{option: where it came from}: the command line, the sweep file, the file recorded on the
    sweep's parent run, or the default (report.json's `source.settings`)."""


def settings(
    sweep: Optional[sweep_schema.Sweep],
    where: str,
    lr_criterion: Optional[str] = None,
    loss_tolerance: Optional[float] = None,
) -> Settings:
    """The analysis settings a sweep file asks for (`where`: how the file was found), the command
    line's lr_criterion and loss_tolerance over it: the one lr the report names per batch size, by
    final loss unless the command line asks for fewest steps (whatever the search scored lrs by: a
    full run at the budget is judged by its final loss, and the lr of fewest steps to a loss cost
    the demo's recommended run 2.4 % of it, docs/benchmarks.md#recommended_run); the loss the search
    named as the primary target; the share of the loss traded for a larger batch (loss_tolerance,
    a ladder's ladder.tolerance); a branch study's tolerance. Without a sweep file, the defaults."""
    search = sweep.search if sweep else sweep_schema.SearchConfig()
    written = sweep.written if sweep else {}
    origin = {}
    origin["lr_criterion"] = "default" if lr_criterion is None else "command line"
    lr_criterion = lr_criterion or "final_loss"
    options: Dict[str, Any] = {"lr_criterion": lr_criterion, "primary_target": search.target_loss}
    origin["primary_target"] = where if search.target_loss is not None else "default"
    key = "ladder.tolerance" if sweep is not None and sweep.ladder is not None else "loss_tolerance"
    if loss_tolerance is not None:
        options["loss_tolerance"], origin["loss_tolerance"] = loss_tolerance, "command line"
    elif key in written:
        options["loss_tolerance"] = sweep.ladder.tolerance if key == "ladder.tolerance" else sweep.loss_tolerance
        origin["loss_tolerance"] = where
    else:
        options["loss_tolerance"], origin["loss_tolerance"] = sweep_schema.Sweep.loss_tolerance, "default"
    if sweep is not None and sweep.branch is not None:
        branch = sweep.branch
        options["branch_tolerance"] = branch_cbs.Tolerance(branch.tolerance, branch.tolerance_kind, branch.compare)
        origin["branch_tolerance"] = where
    return Settings(options, origin)


def settings_of_sweep(
    given: Optional[sweep_schema.Sweep],
    uri: str,
    run_id: str,
    lr_criterion: Optional[str] = None,
    loss_tolerance: Optional[float] = None,
) -> Tuple[Settings, Optional[sweep_schema.Sweep]]:
    """(settings, the sweep file they came from): the file the command was given, else the one
    the sweep's parent run recorded, else none (the defaults)."""
    if given is not None:
        return settings(given, f"the sweep file {given.path}", lr_criterion, loss_tolerance), given
    recorded = recorded_sweep(uri, run_id)
    return settings(recorded, f"the sweep file recorded on run {run_id}", lr_criterion, loss_tolerance), recorded


def recorded_sweep(uri: str, run_id: str) -> Optional[sweep_schema.Sweep]:
    """The sweep file a sweep's parent run recorded (its artifact, logged when the sweep started),
    read as `report SWEEP_FILE` reads it; None for a run that is no sweep's parent or holds none."""
    store = Store(uri)
    if store.get_run(run_id).tags.get(ROLE_TAG) != SWEEP_ROLE:
        return None
    for path in store.list_artifacts(run_id):
        if "/" not in path and path.endswith((".yaml", ".yml")):
            try:
                text = store.read_text_artifact(run_id, path)
            except UnicodeDecodeError:
                raise ConfigError(
                    f"run {run_id}'s {path}", "the sweep file recorded there is not UTF-8 text; give the sweep file"
                ) from None
            return sweep_file.read_recorded(text, Path(path)) if text is not None else None
    return None


def compared_sweep(
    branch: Optional[sweep_schema.BranchConfig], uri: str, experiment: str
) -> Optional[Tuple[str, List[Trial]]]:
    """A branch study's `branch.compare_with`: (the from-scratch sweep's name, its runs) from the
    same store, or None when the study names none."""
    name = branch.compare_with if branch else None
    if not name:
        return None
    run_id = Store(uri, experiment).find_sweep_run_anywhere(name)
    if run_id is None:
        raise ConfigError(
            "branch.compare_with",
            f"no sweep named {name!r} in {uri}; name a from-scratch sweep run into the same store (its `name:`)",
        )
    return name, trials_of(uri, sweep_runs(uri, run_id))


def trial_runs(uri: str, parent_run_id: str) -> List[RunRecord]:
    """A sweep's trials: its child runs and the finished runs of earlier sweeps it reused
    (tracking.run_tags.REUSED_BY_PREFIX: a re-run sweep does not run an identical config again)."""
    store = Store(uri)
    return store.child_runs(parent_run_id) + store.reused_runs(parent_run_id)


def sweep_runs(uri: str, run_id: str) -> List[RunRecord]:
    """The sweep's trials (trial_runs), or the run itself when it has none."""
    return trial_runs(uri, run_id) or [Store(uri).get_run(run_id)]


def read_trials(uri: str, run_id: str) -> List[Trial]:
    """The sweep's trials (sweep_runs) as analysis records."""
    return trials_of(uri, sweep_runs(uri, run_id))


def read_mlflow(
    uri: str, name: str, run_id: str, metrics: Sequence[str] = METRICS, runs: Optional[list] = None
) -> Inputs:
    """A sweep's (or a single run's) runs from MLflow with the curves of METRICS and `metrics`:
    `runs`, or sweep_runs(uri, run_id)."""
    runs = sweep_runs(uri, run_id) if runs is None else runs
    curves = read_curves(uri, runs, metrics, sweep_run=run_id)
    trials = trials_of(uri, runs, curves)
    kind = "single" if trials and trials[0].run_id == run_id else "sweep"
    source = Source(config.redact_uri(uri), run_id, kind)  # report.json is shared: no password in it
    return Inputs(name, tuple(trials), curves, tuple(metrics), source, uri)


def read_tables(folder: Path) -> Inputs:
    """trials.csv and curves.csv of a folder (orchestrator/analysis/tables.py), named after the folder."""
    trials = tables.read(folder)
    curves = {t.run_id: {m: getattr(t, f) for m, f in tables.METRICS.items()} for t in trials}
    return Inputs(folder.resolve().name, tuple(trials), curves, METRICS, Source(str(folder), None, "tables"))


def analyse(
    inputs: Inputs,
    target_losses: Optional[Sequence[float]] = None,
    origin: Optional[Mapping[str, str]] = None,
    **options,
) -> Answer:
    """sweep_analysis.analyse of the inputs' trials, with where they were read from and where its
    settings came from (`origin`, Settings.origin; target losses given are the command line's)."""
    answer = sweep_analysis.analyse(inputs.trials, target_losses, **options)
    origin = dict(origin or {})
    if target_losses:
        origin.setdefault("target_losses", "command line")
    return replace(answer, source=replace(inputs.source, settings=origin))


def read_curves(
    uri: str, runs: Sequence[RunRecord], metrics: Sequence[str] = (), sweep_run: Optional[str] = None
) -> Dict[str, Dict[str, Curve]]:
    """{run id: {metric: [(tokens, value)] sorted by tokens}} of METRICS and `metrics` (absent ones:
    []); with `sweep_run`, from its one table of the sweep's curves where it holds them."""
    return Store(uri).histories(runs, dict.fromkeys([*METRICS, *metrics]), sweep_run=sweep_run)


def trials_of(uri: str, runs: Sequence[RunRecord], curves: Optional[Dict[str, Dict[str, Curve]]] = None) -> List[Trial]:
    """MLflow runs as analysis records, oldest first: params, tags and the curves the analysis reads
    (from `curves`, as read_curves returns them, when given: they are not read twice)."""
    curves = curves if curves is not None else Store(uri).histories(runs, METRICS)
    trials = []
    for r in sorted(runs, key=lambda r: r.start_ms):
        read = curves.get(r.run_id) or {}
        start, end = r.start_ms, r.end_ms
        stopped = r.tags.get(STOPPED_AT_TAG)
        trials.append(
            Trial(
                run_id=r.run_id,
                name=r.name or r.run_id[:8],
                status=r.status,
                params=dict(r.params),
                duration_s=(end - start) / 1000 if end and start else None,
                stopped_at=int(stopped) if stopped else None,
                trial_id=r.tags.get(TRIAL_TAG),
                checkpoints=r.tags.get(CHECKPOINTS_TAG),
                **{field: read.get(metric, []) for metric, field in tables.METRICS.items()},
            )
        )
    return trials
