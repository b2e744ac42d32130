"""How a sweep runs Ray Tune: what it prints and what it keeps of each trial. MLflow holds every
result of a sweep, so Tune keeps no copy of its own that grows with the number of trials."""

from __future__ import annotations

import contextlib
import logging
import os

from ray import tune

QUIET_TUNE = {
    # Tune's output engine prints its configuration box and a TensorBoard hint into the sweep's
    # output even at verbose=0; its legacy engine at verbose=0 prints nothing, so the progress
    # table is the sweep's one account of its trials.
    "RAY_AIR_NEW_OUTPUT": "0",
    # Tune's default loggers write each trial's results again (result.json, progress.csv,
    # TensorBoard events) and keep a record per trial in the driver for the whole sweep.
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
}
ANALYSIS_LOGGER = "ray.tune.analysis.experiment_analysis"
MISSING_RESULT_FILES = "Failed to fetch metrics"


class _NoResultFilesWarning(logging.Filter):
    """Tune's end-of-run analysis reads the result files its default loggers would have written,
    and warns of each trial's as missing: every trial of every sweep, so nothing to tell."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(MISSING_RESULT_FILES)


@contextlib.contextmanager
def quiet_tune():
    """Ray Tune with QUIET_TUNE's settings, for the sweep's Tune runs inside it."""
    saved = {name: os.environ.get(name) for name in QUIET_TUNE}
    os.environ.update(QUIET_TUNE)
    analysis, no_warning = logging.getLogger(ANALYSIS_LOGGER), _NoResultFilesWarning()
    analysis.addFilter(no_warning)
    try:
        yield
    finally:
        analysis.removeFilter(no_warning)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class ForgetEndedTrialStatistics(tune.Callback):
    """Tune keeps, for every trial of the sweep, running statistics of each metric it reported
    (its min, max, mean and means of the last 5 and 10) and their JSON in its state: about 20 kB a
    trial, for as long as the driver runs. Nothing of the sweep reads them (the report reads MLflow,
    the schedulers and searchers hear each result as it comes), so an ended trial's are dropped."""

    def on_trial_complete(self, iteration, trials, trial, **info):
        _forget_statistics(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        _forget_statistics(trial)


def _forget_statistics(trial) -> None:
    # Assigned, not cleared in place: the assignment also drops the cached JSON of the old ones.
    trial.run_metadata.metric_analysis = {}
    trial.run_metadata.metric_n_steps = {}
