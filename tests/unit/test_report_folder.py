"""A report's folder as the input of another report (orchestrator/reporting/report_folder.py):
`report DIR` reads back the settings DIR's report.json records, so a folder gives its sweep's own
answer; a folder without report.json says which defaults it used; a report.json no report wrote is
one line, exit 2; a ladder's target on runs that are no ladder is refused, not ignored."""

from __future__ import annotations

import json

import pytest

from orchestrator import cli
from tests.known_truth import BATCHES, World, factor_grid

SETTINGS_KEYS = ("lr_criterion", "primary_target", "targets_chosen", "critical_batch", "primary", "trend")


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """Tables a trainer wrote, and their report read with settings other than the defaults."""
    root = tmp_path_factory.mktemp("report-folder")
    world = World(draw=4)
    folder = world.write(world.grid(batches=BATCHES[1:5], lrs=factor_grid(0.002, 0.016), seeds=2), root / "tables")
    first = root / "first"
    assert cli.main(["report", str(folder), "--out", str(first)]) == 0
    targets = [f["target_loss"] for f in json.loads((first / "report.json").read_text())["critical_batch"]]
    given = root / "given"
    flags = ["--lr-criterion", "steps", "--loss-tolerance", "0.004"]
    flags += [x for t in targets[:2] for x in ("--target-loss", f"{t:.6g}")]
    assert cli.main(["report", str(folder), "--out", str(given), *flags]) == 0
    return root, folder, given


def answer(folder):
    data = json.loads((folder / "report.json").read_text())
    return {k: data[k] for k in SETTINGS_KEYS}, data


def test_a_report_folder_read_again_gives_its_own_answer(reported, capsys):
    root, _, given = reported
    again = root / "again"
    assert cli.main(["report", str(given), "--out", str(again)]) == 0
    (first, first_data), (second, second_data) = answer(given), answer(again)
    assert first["lr_criterion"] == "steps" and first["targets_chosen"] is False
    assert second == first
    assert second_data["recommendation"]["tolerance"] == 0.004
    assert second_data["recommendation"] == first_data["recommendation"]
    origins = second_data["source"]["settings"]
    assert origins["lr_criterion"] == f"the report {given / 'report.json'} (command line)"
    assert origins["target_losses"].startswith("the report") and origins["loss_tolerance"].startswith("the report")
    printed = capsys.readouterr().out
    assert "Settings by default" in printed  # no primary target was ever named: that one is a default
    assert "lr criterion" not in printed.split("Settings by default")[1]


def test_the_command_line_wins_over_the_folders_settings(reported):
    root, _, given = reported
    out = root / "mine"
    assert cli.main(["report", str(given), "--out", str(out), "--lr-criterion", "final_loss"]) == 0
    data = json.loads((out / "report.json").read_text())
    assert data["lr_criterion"] == "final_loss" and data["source"]["settings"]["lr_criterion"] == "command line"
    assert data["recommendation"]["tolerance"] == 0.004  # the rest still the folder's


def test_tables_without_a_report_say_which_defaults_they_used(reported, capsys):
    root, folder, _ = reported
    assert cli.main(["report", str(folder), "--out", str(root / "plain")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Settings by default"))
    assert "lr criterion final_loss" in line and "loss tolerance 0.50%" in line


@pytest.mark.parametrize(
    "change, key",
    [
        ({"lr_criterion": "fastest"}, "lr_criterion"),
        ({"primary_target": -1}, "primary_target"),
        ({"recommendation": {"tolerance": 3}}, "recommendation.tolerance"),
        ({"targets_chosen": False, "critical_batch": "x"}, "critical_batch"),
    ],
)
def test_a_report_json_no_report_wrote_is_one_line_exit_2(reported, tmp_path, capsys, change, key):
    import shutil

    _, _, given = reported
    copy = tmp_path / "tampered"
    shutil.copytree(given, copy)
    data = json.loads((copy / "report.json").read_text())
    data.update(change)
    (copy / "report.json").write_text(json.dumps(data))
    assert cli.main(["report", str(copy), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_ladder_target_on_runs_that_are_no_ladder_is_refused(reported, tmp_path, capsys):
    _, folder, _ = reported
    argv = ["report", str(folder), "--out", str(tmp_path / "out"), "--target-params", "1e9", "--target-tokens", "2e10"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--target-params" in err[0] and "not a ladder" in err[0], err
    assert not (tmp_path / "out").exists()


def test_curves_of_trials_the_table_does_not_list_are_warned_about(reported, tmp_path, caplog):
    import logging
    import shutil

    from orchestrator.analysis import tables

    _, folder, _ = reported
    copy = tmp_path / "extra-curves"
    shutil.copytree(folder, copy)
    with open(copy / "curves.csv", "a") as f:
        f.write("ghost,train/loss,0,5.0\nghost,train/loss,64,4.0\nphantom,eval/loss,64,4.1\n")
    with caplog.at_level(logging.WARNING, logger="orchestrator.analysis.tables"):
        trials = tables.read(copy)
    assert "ghost" not in {t.name for t in trials}
    (record,) = [r for r in caplog.records if "no row in trials.csv" in r.getMessage()]
    assert "2 trial(s)" in record.getMessage() and "'ghost'" in record.getMessage()
