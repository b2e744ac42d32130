"""What crosses into a Ray Train worker's process: the payload the driver hands it (a frozen
dataclass, pickled by Ray as such), and the part of Ray's API the worker reports to (`ray.train`,
or `ray.tune` when a sweep's trial runs its one worker in Ray Train's local mode). Light on
purpose: the driver builds a payload without importing torch.

Ray Train types its `train_loop_config` as a dict (with RAY_TRAIN_ENABLE_STATE_TRACKING its
state validates it as one), so the payload travels as the one value of `{PAYLOAD_KEY: payload}`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Protocol

PAYLOAD_KEY = "payload"
FAULT_ENV = "ORCHESTRATOR_FAULT_AT_TOKENS"


@dataclass(frozen=True)
class FaultInjection:
    """Tests: rank 0 raises once when it passes `at_tokens` (FAULT_ENV in the command's
    environment, read by the command: orchestrator/driver/run_life.injected_fault_at), the first
    attempt only: `marker` is the file that says the fault happened."""

    at_tokens: Optional[int] = None
    marker: Optional[str] = None


@dataclass(frozen=True)
class WorkerPayload:
    """What a run's driver (orchestrator/driver/run_life.py) hands each of its workers."""

    config: Dict[str, Any] = field(repr=False)  # Ray's state and logs print the repr
    """The resolved config as a dict (core/config.to_dict), secrets included (never logged)."""
    run_id: str
    """The run's MLflow run, which the workers log into."""
    fault: FaultInjection = field(default_factory=FaultInjection)
    local_mode: bool = False
    """Ray Train's local mode inside a Tune trial: reports and checkpoints go to Ray Tune."""
    workloads: Mapping[str, str] = field(default_factory=dict)
    """The driver's registered workloads by import path (core/workload_paths.importable)."""
    startup: Optional[Dict[str, object]] = None
    """The launcher's start-up phases (core/phases.Phases.as_payload), which the worker carries on."""


def train_loop_config(payload: WorkerPayload) -> Dict[str, WorkerPayload]:
    """What TorchTrainer's `train_loop_config` gets (see above); `payload_of` reads it back."""
    return {PAYLOAD_KEY: payload}


def payload_of(train_loop_config: Mapping[str, WorkerPayload]) -> WorkerPayload:
    return train_loop_config[PAYLOAD_KEY]


class RayApi(Protocol):
    """What the worker uses of `ray.train` / `ray.tune`: report metrics (with a checkpoint
    folder, `Checkpoint.from_directory`) and get the checkpoint to resume from."""

    Checkpoint: Any

    def report(self, metrics: Dict[str, Any], checkpoint: Any = None) -> None: ...

    def get_checkpoint(self) -> Any: ...
