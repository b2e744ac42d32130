"""`orchestrator.reporting.sweep_tables`: the tables `load_sweep` returns and `report` writes, built from a
known-truth world's trials (no MLflow: tests/integration/test_sweep.py reads a real sweep)."""

from __future__ import annotations

import dataclasses
import math
import re

import pandas as pd
import pytest

from orchestrator.analysis import sweep_analysis, tables
from orchestrator.analysis.trials import Curve, Trial
from orchestrator.reporting import sweep_tables
from tests.conftest import ROOT
from tests.known_truth import World

EXTRA = [(0, 1.0), (4096, 1.5), (8192, 2.5)]  # a curve a Trial does not carry (e.g. train/lr)
WORLD = World(max_points=200, draw=2)


@pytest.fixture(scope="module")
def sweep():
    """2 batch sizes x 3 lrs x 2 seeds at constant decay, one config at wsd, one stopped, one failed."""
    constant = WORLD.with_(decay="constant")
    runs = constant.grid(batches=(1024, 2048), lrs=(0.004, 0.008, 0.016), seeds=2)
    (wsd,) = WORLD.trials(WORLD.simulate([(1024, 0.008, 0)]))
    (poor,) = WORLD.trials(WORLD.simulate([(1024, 0.001, 0)]))
    early = [(t, v) for t, v in poor.eval if t <= 2**18]
    trials = constant.trials(runs) + [dataclasses.replace(wsd, name=wsd.name + " wsd", _fits={})]
    trials.append(
        dataclasses.replace(poor, status="KILLED", stopped_at=2**18, train=poor.train[:50], eval=early, _fits={})
    )
    trials += WORLD.trials(WORLD.simulate([(2048, 0.064, 0)]))  # diverges
    for i, t in enumerate(trials):  # unique ids; D and A as a real run logs them
        t.run_id, t.trial_id, t.duration_s = f"run{i:02d}", f"trial_{i:05d}", 10.0 + i
        t.params.update({"cluster.num_workers": "2", "batch.grad_accum_steps": str(t.batch // 128 // 2 // 4)})
        t.params["batch.micro_batch_size"] = "4"
        t.params["data.seq_len"] = "128"
    curves = {
        t.run_id: {"train/loss": t.train, "eval/loss": t.eval, "gns/b_simple": t.b_simple, "train/lr": EXTRA}
        for t in trials[:-1]  # the last run logged nothing this reader was asked for
    }
    result = sweep_analysis.analyse(trials)
    return trials, curves, result, sweep_tables.build("syn", "parent", trials, curves, result, sweep_tables.METRICS)


def test_trials_table_has_one_row_per_trial_with_its_params_outcome_and_last_values(sweep):
    trials, _, _, built = sweep
    table = built.trials
    assert list(table["run_id"]) == [t.run_id for t in trials] and list(table["trial"]) == [t.name for t in trials]
    assert list(table["trial_id"]) == [t.trial_id for t in trials]
    # what a person reads first, the short aliases, then every param by its dotted key
    keys = sorted(set().union(*(t.params for t in trials)))
    assert list(table.columns) == [
        *("trial", "run_id", "trial_id", "status", "outcome", "batch", "lr", "b", "D", "A", "seed"),
        *("tokens", "final_train_loss", "final_eval_loss", "b_simple", "stopped_at", "wall_s", "checkpoints"),
        *keys,
    ]
    assert {"data.seq_len", "schedule.decay", "schedule.warmup_tokens", "train.total_tokens"} <= set(keys)
    assert list(table["outcome"]) == [t.outcome for t in trials]
    assert table["outcome"].value_counts().to_dict() == {"finished": len(trials) - 2, "stopped": 1, "failed": 1}
    for t, row in zip(trials, table.to_dict("records")):
        assert (row["batch"], row["lr"], row["seed"], row["tokens"]) == (
            t.batch,
            t.lr,
            t.number("train.seed"),
            t.tokens_seen,
        )
        assert (row["b"], row["D"], row["A"]) == (4, 2, t.batch // 1024)
        assert row["batch.tokens_per_update"] == t.batch and row["schedule.decay"] == t.params["schedule.decay"]
        assert row["final_train_loss"] == t.final("train/loss") and row["b_simple"] == t.b_simple[-1][1]
        assert row["final_eval_loss"] == t.eval[-1][1] if t.eval else math.isnan(row["final_eval_loss"])
        assert row["stopped_at"] == t.stopped_at if t.stopped_at else pd.isna(row["stopped_at"])
        assert row["wall_s"] == t.duration_s
    assert str(table["batch"].dtype) == "Int64" and table["lr"].dtype == "float64"
    # a notebook's first question: the best final eval loss per batch size
    best = table[table["outcome"] == "finished"].groupby("batch")["final_eval_loss"].min()
    assert list(best.index) == [1024, 2048]


def test_the_tables_read_back_to_the_same_trials(sweep, tmp_path):
    """trials.csv and curves.csv are orchestrator/analysis/tables.py's format: what report --out writes,
    report DIR reads, to the same analysis."""
    trials, _, result, built = sweep
    built.to_csv(tmp_path)
    back = tables.read(tmp_path)
    assert [t.name for t in back] == [t.name for t in trials]
    for t, b in zip(trials, back):
        assert (b.status, b.batch, b.lr, b.stopped_at, b.duration_s) == (
            t.status,
            t.batch,
            t.lr,
            t.stopped_at,
            t.duration_s,
        )
        logged = t is not trials[-1]  # the last run's curves were not in what was read
        assert (b.train, b.eval) == ((t.train, t.eval) if logged else ([], []))
    again = sweep_analysis.analyse(back)
    assert again.primary.b_crit_fit == pytest.approx(result.primary.b_crit_fit, rel=1e-12)
    assert [r.lr for r in again.best_lr] == pytest.approx([r.lr for r in result.best_lr], rel=1e-12)


def test_params_are_typed_so_pandas_reads_the_csv_back_to_the_same_frame(sweep, tmp_path):
    """MLflow holds params as text ('None', 'False', '4096', '0.95'); the frame holds them as
    Python values, which is what pandas reads back from trials.csv."""
    trials, curves, result, _ = sweep
    texts = {"cluster.address": "None", "cluster.use_gpu": "False", "gns.enabled": "True", "optim.eps": "1e-08"}
    typed = [dataclasses.replace(t, params={**t.params, **texts}) for t in trials]
    built = sweep_tables.build("syn", "parent", typed, curves, result, sweep_tables.METRICS)
    frame = built.trials
    assert frame["cluster.address"].isna().all() and frame["optim.eps"].eq(1e-08).all()
    assert frame["cluster.use_gpu"].dtype == bool and not frame["cluster.use_gpu"].any() and frame["gns.enabled"].all()
    built.to_csv(tmp_path)
    for file, frame in (("trials.csv", built.trials), ("curves.csv", built.curves)):
        back = pd.read_csv(tmp_path / file)
        assert list(back.columns) == list(frame.columns), file
        # CSV changes dtypes (Int64 -> int64, None -> NaN), not values
        same = back.astype(object).where(back.notna(), None).equals(frame.astype(object).where(frame.notna(), None))
        assert same, file
    assert [t.params.get("cluster.use_gpu") for t in tables.read(tmp_path)] == ["False"] * len(trials)


def test_a_ramped_run_is_left_out_of_the_critical_batch(sweep):
    """A run along a batch.ramp has no one batch size: it is no point of S(B), so the analysis
    of the other runs is what it was."""
    trials, _, result, _ = sweep
    ramp = {"batch.ramp.0.from_tokens": "0", "batch.ramp.0.tokens_per_update": "1024"}
    ramp.update({"batch.ramp.1.from_tokens": "65536", "batch.ramp.1.tokens_per_update": "4096"})
    ramped = dataclasses.replace(trials[0], name="ramped", run_id="ramped", params={**trials[0].params, **ramp})
    assert ramped.ramped and ramped.batch is None and not trials[0].ramped
    again = sweep_analysis.analyse([*trials, ramped])
    assert again.primary.b_crit_fit == pytest.approx(result.primary.b_crit_fit, rel=1e-12)
    one_step = {k: v for k, v in ramp.items() if ".0." in k}  # a ramp of one step is a fixed batch
    assert dataclasses.replace(trials[0], params={**trials[0].params, **one_step}).batch == trials[0].batch


def test_curves_hold_every_point_of_the_metrics_asked_for_value_for_value(sweep):
    trials, curves, _, built = sweep
    frame = built.curves
    assert list(frame.columns) == ["trial", "run_id", "metric", "tokens", "value"]
    assert frame["tokens"].dtype == "int64" and frame["value"].dtype == "float64"
    for t in trials:
        for metric in sweep_tables.METRICS:
            rows = frame[(frame["run_id"] == t.run_id) & (frame["metric"] == metric)]
            expected = curves.get(t.run_id, {}).get(metric, [])
            assert list(zip(rows["tokens"], rows["value"])) == expected, (t.name, metric)
            assert set(rows["trial"]) <= {t.name}
    assert len(frame) == sum(len(points) for c in curves.values() for points in c.values())
    assert frame[frame["run_id"] == trials[-1].run_id].empty
    only = sweep_tables.curves_frame(trials, curves, ["train/lr"])
    assert set(only["metric"]) == {"train/lr"} and len(only) == len(EXTRA) * len(curves)


def test_fit_is_the_reports_numbers(sweep):
    _, _, answer, built = sweep
    fit, result = built.fit, answer.to_json()
    assert fit.answer is answer and fit.raw == result
    assert fit.loss_metric == result["loss_metric"] and fit.axes == result["axes"]
    assert (fit.finished, fit.stopped, fit.failed, fit.incomplete) == (
        result["finished"],
        result["stopped"]["count"],
        result["failed"],
        result["incomplete"],
    )
    assert fit.stopped_rungs == {2**18: 1}
    best = fit.best_per_batch
    assert list(best["batch"]) == [r["batch"] for r in result["best_per_batch"]]
    assert list(best["final_loss"]) == [r["final_loss"] for r in result["best_per_batch"]]
    assert list(best["run_id"]) == [r["run_id"] for r in result["best_per_batch"]]
    assert list(best["schedule.decay"]) == [r["settings"]["schedule.decay"] for r in result["best_per_batch"]]
    assert list(best["lr"]) == [r["lr"] for r in result["best_per_batch"]]
    assert fit.best["run_id"] == result["best"]["run_id"] and fit.best["final_loss"] == result["best"]["final_loss"]
    primary = result["primary"]
    assert fit.target_loss == primary["target_loss"] and fit.notes == primary["notes"]
    assert fit.b_simple == primary["b_simple"] and fit.status == primary["status"]
    assert fit.trend == answer.trend and fit.lr_criterion == "final_loss"
    assert list(fit.best_lr["lr"]) == [r["lr"] for r in result["best_lr"]]
    assert (fit.b_crit, fit.b_crit_interval) == (
        primary["b_crit"],
        tuple(primary["b_crit_interval"]) if primary["b_crit_interval"] else None,
    )
    assert fit.targets == [f["target_loss"] for f in result["critical_batch"]] and fit.targets_chosen
    assert list(fit.critical_batch["target_loss"]) == fit.targets
    assert list(fit.critical_batch["batch_sizes"]) == [len(f["points"]) for f in result["critical_batch"]]
    assert (fit.lr_coef, fit.lr_alpha) == (result["lr_scaling"]["coef"], result["lr_scaling"]["alpha"])
    assert sweep_tables.fit_of(None) is None
    # the points B_crit is fitted to, per target and batch size, as the report's cost tables give them
    points = [(f["target_loss"], p) for f in result["critical_batch"] for p in f["points"]]
    steps = fit.steps_to_target
    assert len(points) > 4 and len(steps) == len(points)
    assert list(zip(steps["target_loss"], steps["batch"])) == [(t, p["batch"]) for t, p in points]
    assert list(steps["steps"]) == [p["steps"] for _, p in points]
    assert list(steps["tokens"]) == [p["tokens"] for _, p in points]
    assert set(steps["batch"]) == {r["batch"] for r in result["best_per_batch"]}


def test_csv_files_read_back_equal_to_the_tables(sweep, tmp_path):
    built = sweep[-1]
    paths = built.to_csv(tmp_path / "out")
    assert [p.name for p in paths] == ["trials.csv", "curves.csv"]
    for path, frame in zip(paths, (built.trials, built.curves)):
        back = pd.read_csv(path)
        assert list(back.columns) == list(frame.columns)
        assert values(back) == values(frame), path.name  # exact: floats are written and read to the last digit


def values(frame: pd.DataFrame) -> list:
    """Rows as Python values, every kind of missing as None (CSV changes dtypes, not values)."""
    return [[None if pd.isna(v) else v for v in row] for row in frame.astype(object).itertuples(index=False)]


def test_only_results_imports_pandas():
    """The command line stays light: pandas is reporting/sweep_tables.py's alone (imported by `report`
    when it runs)."""
    importers = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "orchestrator").rglob("*.py"))
        if re.search(r"^\s*(import|from) pandas", p.read_text(), re.M)
    ]
    assert importers == ["orchestrator/reporting/sweep_tables.py"]


def test_a_curve_reads_as_the_sorted_list_of_tuples_it_replaces():
    """trials.Curve holds points as two arrays; every way the analysis reads a curve gives what
    the sorted list of (int, float) tuples gave."""
    points = [(300, 2.5), (0, 4.0), (100, 3.0), (200, 2.75)]
    as_list, curve = sorted(points), Curve.of(points)
    assert curve == as_list and as_list == curve and list(curve) == as_list and len(curve) == 4
    assert curve[0] == (0, 4.0) and curve[-1] == (300, 2.5) and type(curve[-1][0]) is int
    assert curve[1:3] == as_list[1:3] and curve.until(200) == [p for p in as_list if p[0] <= 200]
    assert [v for _, v in curve] == [v for _, v in as_list] and dict(curve) == dict(as_list)
    assert not Curve.of([]) and Curve.of([]) == [] and Curve.of(curve) is curve
    assert curve != as_list[:3] and curve != Curve.of(as_list[:3])
    trial = Trial("r", "r", "FINISHED", {}, train=points)
    assert isinstance(trial.train, Curve) and trial.train == as_list


def test_the_best_configurations_settings_are_typed_values(sweep):
    """Numbers as numbers (MLflow logs text): in the answer, report.json's and the API's."""
    _, _, answer, built = sweep
    for row in [answer.best, *answer.best_per_batch]:
        assert (
            row.settings["batch.tokens_per_update"] == row.batch
            and type(row.settings["batch.tokens_per_update"]) is int
        )
        assert type(row.settings["optim.lr"]) is float and row.settings["optim.lr"] in (0.004, 0.008, 0.016, 0.064)
    assert answer.best.settings["schedule.decay"] == "constant"
    assert answer.to_json()["best"]["settings"]["optim.lr"] == answer.best.settings["optim.lr"]
    assert built.fit.best["schedule.decay"] == "constant"


def test_the_recommendation_is_a_typed_config_whose_yaml_is_recommended_yaml(sweep, tmp_path):
    """load_sweep's `recommended`: the typed train config of the run the report recommends, its
    dotted keys, and the very text `report` writes as recommended.yaml (which loads to the same config)."""
    from orchestrator.core import config as config_lib
    from orchestrator.reporting import report_files

    trials, _, answer, built = sweep
    rec, typed = answer.recommendation, built.recommended
    assert typed is not None and typed.config.batch.tokens_per_update == rec.tokens_per_update
    assert type(typed.config.batch.tokens_per_update) is int and typed.config.optim.lr == rec.lr
    assert typed.overrides()["optim.lr"] == rec.lr and typed.overrides()["batch.micro_batch_size"] == "auto"
    (written,) = report_files.write_recommended(trials, answer, tmp_path)
    assert written.read_text() == typed.to_yaml()
    assert config_lib.to_dict(config_lib.load(written)) == config_lib.to_dict(typed.config)
    assert sweep_tables.build("syn", "parent", trials, {}, None).recommended is None
