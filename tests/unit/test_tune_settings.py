"""How a sweep runs Ray Tune (orchestrator/driver/tune_settings.py): its settings hold only inside
the sweep's Tune runs, the one warning they cause is dropped and no other, and an ended trial's
running statistics leave Tune's state, its cached JSON included."""

from __future__ import annotations

import json
import logging
import os
from types import SimpleNamespace

from ray.tune.trainable.metadata import _TrainingRunMetadata

from orchestrator.driver import tune_settings


class Caught(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_the_settings_hold_inside_and_the_missing_result_files_warning_alone_is_dropped(monkeypatch):
    monkeypatch.setenv("RAY_AIR_NEW_OUTPUT", "1")
    monkeypatch.delenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", raising=False)
    analysis, caught = logging.getLogger(tune_settings.ANALYSIS_LOGGER), Caught()
    # Set its own level: an earlier test in the same process may have quietened "ray" (ray_jobs does).
    level = analysis.level
    analysis.setLevel(logging.WARNING)
    analysis.addHandler(caught)
    try:
        with tune_settings.quiet_tune():
            assert {name: os.environ[name] for name in tune_settings.QUIET_TUNE} == tune_settings.QUIET_TUNE
            analysis.warning("Failed to fetch metrics for %d trial(s):\n- t1: FileNotFoundError()", 2000)
            analysis.warning("Could not find best trial")
        analysis.warning("Failed to fetch metrics for 1 trial(s)")  # outside a sweep's Tune run: shown
    finally:
        analysis.removeHandler(caught)
        analysis.setLevel(level)
    assert caught.messages == ["Could not find best trial", "Failed to fetch metrics for 1 trial(s)"]
    assert os.environ["RAY_AIR_NEW_OUTPUT"] == "1" and "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS" not in os.environ


def test_an_ended_trials_statistics_leave_tunes_state_and_its_last_result_stays():
    metadata = _TrainingRunMetadata()
    metadata.last_result = {"eval_loss": 2.5, "done": True}
    for step, loss in enumerate([3.0, 2.7, 2.5], start=1):
        metadata.update_metric("eval_loss", loss, step=step)
    assert json.loads(metadata.get_json_state())["metric_analysis"]["eval_loss"]["min"] == 2.5  # cached now
    trial = SimpleNamespace(run_metadata=metadata)
    tune_settings.ForgetEndedTrialStatistics().on_trial_complete(iteration=3, trials=[trial], trial=trial)
    state = json.loads(metadata.get_json_state())
    assert (state["metric_analysis"], state["metric_n_steps"]) == ({}, {})
    assert state["last_result"] == {"eval_loss": 2.5, "done": True}
