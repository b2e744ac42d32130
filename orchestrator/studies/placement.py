"""Where a sweep's trials run: what each Tune trial holds, and whether its one worker runs inside
the trial's own process (Ray Train local mode). The driver asks Tune for these resources and
submit checks the same shapes against a cluster's nodes."""

from __future__ import annotations

from typing import Dict, List, Optional

from orchestrator.core import derived, schema, sweep_schema
from orchestrator.studies import search_space

TRIAL_DRIVER_CPUS = 0.2  # a Tune trial that only waits on its worker group; the workers hold the CPUs


def in_trial_process(sweep: sweep_schema.Sweep, cfg: schema.Config) -> bool:
    """Does this trial run its one worker in the Tune trial's process (Ray Train local mode)?"""
    return sweep.local_mode and derived.batch_plan(cfg).num_workers == 1


def resources_of(sweep: sweep_schema.Sweep, cfg: Optional[schema.Config]) -> Dict[str, float]:
    """What a Tune trial of `cfg` holds: the worker's CPUs (and GPU) when the worker runs inside
    it, else a fraction of a CPU for waiting on its worker group (None: an infeasible point)."""
    if cfg is None or not in_trial_process(sweep, cfg):
        return {"CPU": TRIAL_DRIVER_CPUS}
    return derived.worker_resources(cfg)


def trial_shape(sweep: sweep_schema.Sweep, cfg: schema.Config):
    """What one trial holds: its worker bundles and the Tune trial's own CPU, or, when the
    worker runs inside the trial, one bundle for both."""
    if in_trial_process(sweep, cfg):
        return derived.shape_of(cfg)
    return derived.shape_of(cfg, trial={"CPU": TRIAL_DRIVER_CPUS})


def trial_shapes(sweep: sweep_schema.Sweep, trials: List[search_space.Trial]) -> list:
    """The shape of every trial (study.Prepared.all_trials: the base config's for optuna)."""
    return [trial_shape(sweep, t.cfg) for t in trials]
