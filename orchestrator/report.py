"""`orchestrator report`: which batch size and configuration to use, where the critical batch
size lies and what each choice costs, read back from a sweep's (or one run's) MLflow runs, or
from a folder of `trials.csv` and `curves.csv` written by any trainer (orchestrator/tables.py).

Reading (MLflow, only through tracking.py) gives `trials.Trial` records; `analysis.analyse` is
the arithmetic (its docstring states every rule); writing turns the result into figures
(plots.py), summary.md, summary.html and report.json (text rendered by report_render.py) and the
tables trials.csv and curves.csv (results.py: what `results.load_sweep` gives), all logged to the
sweep's (or the run's) MLflow run under `report/`. `sweep` prints `report_render.summary_lines`
of the same analysis when it ends, so the two always say the same.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from orchestrator import analysis, branch_analysis, tables, tracking
from orchestrator.errors import ConfigError
from orchestrator.report_render import document, json_safe, summary_lines, to_html, to_markdown
from orchestrator.trials import Curve, Trial

METRICS = tuple(tables.METRICS)
"""The curves the analysis reads (train/loss, eval/loss, gns/b_simple, train/clipped)."""


# ---------------------------------------------------------------- reading (MLflow via tracking)


def _tracking_for(target: str, overrides: List[str]) -> Tuple[Optional[str], str, str]:
    """(sweep name when target is a sweep file, tracking uri, experiment). The `tracking.*` entries
    of a sweep file's `base.overrides` name its store; the command line's overrides win."""
    from orchestrator import config, sweep_file

    name, extra = None, []
    if target.endswith((".yaml", ".yml")) or Path(target).is_file():
        if not Path(target).is_file():
            raise ConfigError("SWEEP_OR_RUN", f"sweep file {target} not found")
        sweep = sweep_file.load(target, check=False)  # its base config need not resolve here
        if not sweep.raw.get("name"):
            raise ConfigError("name", f"sweep file {target} has no top-level `name:`; valid: a sweep YAML with name")
        name, extra = sweep.name, [o for o in sweep.base_overrides if o.startswith("tracking.")]
    cfg = config.load(None, extra + list(overrides))
    return name, tracking.resolve_uri(cfg.tracking.uri), cfg.tracking.experiment


def resolve(target: str, overrides: List[str]) -> Tuple[str, str, str]:
    """(tracking uri, report name, run id of the sweep's parent run or of the single run)."""
    sweep_name, uri, experiment = _tracking_for(target, overrides)
    if not tracking.store_exists(uri):
        raise ConfigError("tracking.uri", f"no MLflow store at {uri}; pass tracking.uri=<the store of the sweep>")
    run = None if sweep_name else tracking.try_get_run(uri, target)
    if run is not None:
        return uri, run.info.run_name or run.info.run_id, run.info.run_id
    sweep_name = sweep_name or target
    run_id = tracking.find_sweep_run_anywhere(uri, sweep_name, experiment)
    if run_id is None:
        raise ConfigError(
            "SWEEP_OR_RUN",
            f"no sweep named {sweep_name!r} (run tagged {tracking.ROLE_TAG}={tracking.SWEEP_ROLE}, "
            f"{tracking.SWEEP_TAG}={sweep_name!r}) and no run with that id in {uri} "
            f"(searched experiment {experiment!r}, then all)",
        )
    return uri, sweep_name, run_id


def compared_sweep(raw: Optional[Dict[str, Any]], uri: str, experiment: str) -> Optional[Tuple[str, List[Trial]]]:
    """A branch study's `branch.compare_with`: (the from-scratch sweep's name, its runs) from the
    same store, or None when the study names none."""
    branch = (raw or {}).get("branch")
    name = branch.get("compare_with") if isinstance(branch, dict) else None
    if not name:
        return None
    run_id = tracking.find_sweep_run_anywhere(uri, name, experiment)
    if run_id is None:
        raise ConfigError(
            "branch.compare_with",
            f"no sweep named {name!r} in {uri}; name a from-scratch sweep run into the same store (its `name:`)",
        )
    return name, trials_of(uri, sweep_runs(uri, run_id))


def sweep_runs(uri: str, run_id: str) -> list:
    """The sweep's child runs, or the run itself when it has none."""
    return tracking.child_runs(uri, run_id) or [tracking.get_run(uri, run_id)]


def read_trials(uri: str, run_id: str) -> List[Trial]:
    """The sweep's trials (sweep_runs) as analysis records."""
    return trials_of(uri, sweep_runs(uri, run_id))


def read_curves(uri: str, runs: Sequence[Any], metrics: Sequence[str] = ()) -> Dict[str, Dict[str, Curve]]:
    """{run id: {metric: [(tokens, value)] sorted by tokens}} of METRICS and `metrics` (absent ones: [])."""
    keys = list(dict.fromkeys([*METRICS, *metrics]))
    return {r.info.run_id: tracking.run_metrics(uri, r.info.run_id, keys) for r in runs}


def trials_of(uri: str, runs: Sequence[Any], curves: Optional[Dict[str, Dict[str, Curve]]] = None) -> List[Trial]:
    """MLflow runs as analysis records, oldest first: params, tags and the curves the analysis reads
    (from `curves`, as read_curves returns them, when given: they are not read twice)."""
    trials = []
    for r in sorted(runs, key=lambda r: r.info.start_time):
        read = (curves or {}).get(r.info.run_id) or tracking.run_metrics(uri, r.info.run_id, METRICS)
        start, end = r.info.start_time, r.info.end_time
        stopped = r.data.tags.get(tracking.STOPPED_AT_TAG)
        trials.append(
            Trial(
                run_id=r.info.run_id,
                name=r.info.run_name or r.info.run_id[:8],
                status=r.info.status,
                params=dict(r.data.params),
                duration_s=(end - start) / 1000 if end and start else None,
                stopped_at=int(stopped) if stopped else None,
                trial_id=r.data.tags.get(tracking.TRIAL_TAG),
                **{field: read.get(metric, []) for metric, field in tables.METRICS.items()},
            )
        )
    return trials


def analyse(
    uri: str, run_id: str, trials: Sequence[Trial], target_losses: Optional[Sequence[float]] = None, **options
) -> Dict[str, Any]:
    """`analysis.analyse` of the trials, with where they were read from (report.json's `source`)."""
    result = analysis.analyse(trials, target_losses, **options)
    result["source"] = {"uri": uri, "run_id": run_id, "kind": "single" if trials[0].run_id == run_id else "sweep"}
    return result


# ---------------------------------------------------------------- writing


def figures(trials: Sequence[Trial], result: Dict[str, Any], name: str) -> Dict[str, Any]:
    from orchestrator import plots

    usable, metric = [t for t in trials if t.batch and t.train], result["loss_metric"]
    curves = [{"batch": t.batch, "train": t.train, "eval": t.eval} for t in usable]
    figs = {
        "loss_vs_tokens.png": plots.loss_by_batch(curves, "tokens", f"{name}: loss vs tokens"),
        "loss_vs_steps.png": plots.loss_by_batch(curves, "steps", f"{name}: loss vs optimizer steps"),
    }
    if result.get("branch"):  # a branch study: one base run, so no from-scratch comparison to draw
        base = branch_analysis.base_of(trials)
        b_simple = base.b_simple if base else []
        figs["branch_cbs.png"] = plots.branch_cbs(result["branch"]["points"], result["branch"]["fit"], b_simple)
        return figs
    cells = [
        (t.lr, t.batch, t.final(metric))
        for t in usable
        if t.lr and t.outcome == "finished" and t.final(metric) is not None
    ]
    if cells:
        figs["eval_heatmap.png"] = plots.lr_batch_heatmap(cells, f"final {metric}")
    fits = [
        {**f, "b_crit": f["b_crit_fit"], "points": [(p["batch"], p["steps"], p["tokens"]) for p in f["points"]]}
        for f in result["critical_batch"]
        if f["points"]
    ]
    if fits:
        figs["critical_batch.png"] = plots.critical_batch(fits)
    best, scaling = result["best_lr"], result["lr_scaling"]
    if any(r["lr"] for r in best):
        fit = (scaling["coef"], scaling["alpha"]) if scaling["alpha"] is not None else None
        figs["lr_vs_batch.png"] = plots.lr_vs_batch(
            [(t.batch, t.lr) for t in usable if t.lr], [(r["batch"], r["lr"]) for r in best if r["lr"]], fit
        )
    return figs


def write_report(trials: Sequence[Trial], result: Dict[str, Any], name: str, out: Path) -> List[Path]:
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for file, fig in figures(trials, result, name).items():
        fig.savefig(out / file, dpi=120)
        plt.close(fig)
        written.append(out / file)
    doc = document(result, name, [p.name for p in written])
    for file, text in (
        ("summary.md", to_markdown(doc)),
        ("summary.html", to_html(doc, f"Report: {name}")),
        ("report.json", json.dumps(json_safe({"name": name, **result}), indent=2)),
    ):
        (out / file).write_text(text)
        written.append(out / file)
    return written


def sweep_options(search, lr_criterion: Optional[str] = None, raw: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """What a sweep's search section asks of the analysis, the same for `sweep`'s summary and for
    `report SWEEP_FILE`: the best lr by fewest steps when the search scored lrs by steps (or its
    stable-phase proxy), the loss it named as the primary target, and a branch study's tolerance
    (`raw`: the sweep file as read)."""
    if lr_criterion is None:
        lr_criterion = "steps" if search.criterion in ("stable_loss", "steps") else "final_loss"
    branch = (raw or {}).get("branch")
    tolerance = branch.get("tolerance") if isinstance(branch, dict) else None
    options = {"lr_criterion": lr_criterion, "primary_target": search.target_loss}
    return {**options, "branch_tolerance": tolerance} if tolerance else options


def run(
    target: str,
    overrides: List[str],
    out: Optional[str] = None,
    target_losses: Optional[List[float]] = None,
    lr_criterion: Optional[str] = None,
) -> int:
    """The `report` verb: target is a sweep file, a sweep name, a run id or a folder holding
    trials.csv and curves.csv; returns the exit code. lr_criterion None: the sweep file's, else
    final_loss."""
    from orchestrator import results, sweep_file  # pandas: only `report` needs it

    is_sweep_file = Path(target).is_file() and target.endswith((".yaml", ".yml"))
    read = sweep_file.load(target, check=False) if is_sweep_file else None
    options = sweep_options(
        read.search if read else sweep_file.SearchConfig(), lr_criterion, read.raw if read else None
    )
    if tables.is_table_folder(target):
        return _run_tables(Path(target), out, target_losses, options)
    uri, name, run_id = resolve(target, list(overrides))
    runs = sweep_runs(uri, run_id)
    curves = read_curves(uri, runs, results.METRICS)
    trials = trials_of(uri, runs, curves)
    if not any(t.batch and t.train for t in trials):
        print(
            f"orchestrator report: nothing to report: no run under {run_id} has train/loss and batch.tokens_per_update"
        )
        return 1
    if read is not None:
        options["compare_with"] = compared_sweep(read.raw, uri, _tracking_for(target, list(overrides))[2])
    result = analyse(uri, run_id, trials, target_losses, **options)
    out_dir = Path(out) if out else _default_out(name)
    tables_ = results.build(name, run_id, trials, curves, result, results.METRICS, uri)
    for path in write_report(trials, result, name, out_dir) + tables_.to_csv(out_dir):
        tracking.log_file(uri, run_id, path, "report")
    _say_written(out_dir, f"logged to run {run_id} under report/")
    print("\n".join(summary_lines(result)))
    return 0


def _default_out(name: str) -> Path:
    return Path("reports") / re.sub(r"[^\w.-]+", "_", name)


def _run_tables(folder: Path, out: Optional[str], target_losses, options) -> int:
    """`report DIR`: the same analysis and outputs from a folder's tables (nothing goes to MLflow;
    the tables are rewritten only into another folder, never over themselves)."""
    from orchestrator import results

    trials = tables.read(folder)
    if not any(t.batch and t.train for t in trials):
        raise ConfigError("SWEEP_OR_RUN", f"{folder}: no trial has batch.tokens_per_update and train/loss points")
    name = folder.resolve().name
    result = analysis.analyse(trials, target_losses, **options)
    result["source"] = {"uri": str(folder), "run_id": None, "kind": "tables"}
    out_dir = Path(out) if out else _default_out(name)
    written = write_report(trials, result, name, out_dir)
    if out_dir.resolve() != folder.resolve():
        curves = {t.run_id: {m: getattr(t, f) for m, f in tables.METRICS.items()} for t in trials}
        written += results.build(name, "", trials, curves, result, tuple(tables.METRICS)).to_csv(out_dir)
    _say_written(out_dir, f"read from {folder}")
    print("\n".join(summary_lines(result)))
    return 0


def _say_written(out_dir: Path, where: str) -> None:
    print(f"report: {out_dir / 'summary.md'} (and summary.html, report.json, trials.csv, curves.csv; {where})")
