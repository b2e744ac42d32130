"""The tags this project puts on its MLflow runs (docs/design.md 3: MLflow names), by name. Names
only, no MLflow import: a sweep's planning and dry run name them without loading MLflow."""

from __future__ import annotations

from typing import Dict

PARENT_TAG = "mlflow.parentRunId"  # a trial's sweep run (MLflow's own nesting)
ROLE_TAG = "orchestrator.role"  # SWEEP_ROLE on a sweep's parent run
SWEEP_ROLE = "sweep"
SEARCH_TAG = "orchestrator.search"  # a sweep's search algorithm
SCHEDULER_TAG = "orchestrator.scheduler"  # ... and its early-stopping scheduler
TRIAL_TAG = "orchestrator.trial_id"
BRANCH_OF_TAG = "orchestrator.branch_of"  # a branch's base run id
BRANCH_AT_TAG = "orchestrator.branch_at_tokens"  # the tokens the branch starts from
SWEEP_TAG = "orchestrator.sweep"
FAILURE_TAG = "orchestrator.failure_reason"
STOPPED_AT_TAG = "orchestrator.stopped_at_tokens"  # the early-stopping rung a trial was stopped at
WARNING_TAG_PREFIX = "orchestrator.warning."  # + a 3-digit index: what a worker warned about, in order
REALISED_RAMP_TAG = "orchestrator.realised_ramp"  # batch.schedule=adaptive: the batch.ramp it took, to replay
RUNG_TAG = "orchestrator.ladder_rung"  # a ladder trial's rung, `N=213k D=426k` (studies/ladder_plan.py)
DIGEST_TAG = "orchestrator.config_digest"  # a trial's resolved config, hashed (driver/run_life.config_digest)
REUSED_BY_PREFIX = (
    "orchestrator.reused_by."  # + a later sweep's parent run id, = its trial id: a finished run it reused
)
CURVES_TAG = "orchestrator.curves"  # the metrics the run's curves.parquet artifact holds, comma-joined
SWEEP_CURVES_TAG = "orchestrator.sweep_curves"  # a sweep's: the metrics its sweep_curves.parquet holds, comma-joined
CHECKPOINTS_TAG = "orchestrator.checkpoints"  # where a run's checkpoint_* folders live (path or URI)
ONLINE_CALIBRATION_METRIC = (
    "answer/online_calibration"  # a branch study's batch.calibration (its report's), read by batch.calibration_from
)
ONLINE_CALIBRATION_TAG = (
    "answer.online_calibration"  # ... and whether it is resolved: "resolved" or "not resolved: why"
)
REPLAYED_TAG = "orchestrator.replayed"  # a replay sweep's trial: the recorded run it served, or how it was interpolated
RUN_COLOR_TAG = "mlflow.runColor"  # MLflow's UI draws the run in this colour ("#rrggbb"): its batch size's


def warning_tags(messages: Dict[int, str]) -> Dict[str, str]:
    """{index: message} as tags that sort in the order the warnings were raised."""
    return {f"{WARNING_TAG_PREFIX}{i:03d}": m[:5000] for i, m in messages.items()}


WRITE_CHECK_TAG = "orchestrator.write_check"
"""Set and deleted again on a sweep's parent run when a trial fails, to ask the store whether it
takes writes (Store.refuses_writes): its value changes, so the store must write it."""


def warnings_in(tags: Dict[str, str]) -> Dict[str, str]:
    """{tag: message} of the worker warnings among a run's tags, in the order they were raised."""
    return {k: tags[k] for k in sorted(tags) if k.startswith(WARNING_TAG_PREFIX)}
