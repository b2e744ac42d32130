"""What a worker checkpoints besides model and optimizer, and how: a DeepSpeed checkpoint on
every rank (ZeRO shards its state), merged and persisted by Ray Train (by Ray Tune in local mode).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from orchestrator.core.errors import ConfigError
from orchestrator.core.storage import CHECKPOINT_TAG


@dataclass
class TrainState:
    """Everything besides model and optimizer that a resumed run needs (checkpoint client state)."""

    update: int = 0
    tokens: int = 0
    run_id: str = ""
    gns: Dict[str, Any] = field(default_factory=dict)
    stable_loss: float = float("nan")
    """eval/loss where the stable part of the schedule ends (schedules.stable_end_tokens); NaN before."""
    mlflow_watermarks: Dict[str, int] = field(default_factory=dict)
    mlflow_pending: List[Any] = field(default_factory=list)
    torch_rng: Optional[Any] = None


def restore(engine, state: TrainState, api, branch_from: Optional[str] = None) -> TrainState:
    """The run's own latest checkpoint (a retry), else the one it branches from
    (train.start_from_checkpoint), else `state` as it is (a fresh start)."""
    checkpoint = api.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            return _load(engine, folder)
    if branch_from is None:
        return state
    # Another run's state: its weights, optimizer, RNG and tokens seen; this run's MLflow history.
    branched = _load(engine, branch_from)
    return replace(branched, run_id=state.run_id, mlflow_watermarks={}, mlflow_pending=[])


def _load(engine, folder: str) -> TrainState:
    path, client = engine.load_checkpoint(folder, tag=CHECKPOINT_TAG)
    if path is None:
        raise ConfigError(
            "train.start_from_checkpoint", f"{folder} holds no checkpoint of this trainer (tag {CHECKPOINT_TAG})"
        )
    restored = TrainState(**{k: v for k, v in client.items() if k in TrainState.__dataclass_fields__})
    if restored.torch_rng is not None:
        torch.set_rng_state(restored.torch_rng)
    return restored


def save_and_report(engine, state: TrainState, metrics: Dict[str, float], logger, api) -> None:
    """DeepSpeed checkpoint on every rank (ZeRO shards its state), merged and persisted by Ray
    Train (by Ray Tune in local mode)."""
    if logger is not None:
        logger.flush(timeout_s=10)  # best effort; what stays unsent goes into the checkpoint
        state.mlflow_pending = logger.pending_state()
        state.mlflow_watermarks = logger.watermarks
    state.torch_rng = torch.get_rng_state()
    with tempfile.TemporaryDirectory() as folder:
        engine.save_checkpoint(folder, tag=CHECKPOINT_TAG, client_state=asdict(state))
        api.report(metrics, checkpoint=api.Checkpoint.from_directory(folder))


def load_weights(model: nn.Module, location: str) -> None:
    """model.init_from: a safetensors file, or a folder holding model.safetensors (shared tensors,
    such as tied embeddings, stored once)."""
    from safetensors.torch import load_model

    path = Path(location)
    path = path / "model.safetensors" if path.is_dir() else path
    if not path.is_file():
        raise ConfigError("model.init_from", f"got {location!r}; no safetensors file there")
    missing, unexpected = load_model(model, str(path), strict=False)
    if missing or unexpected:
        raise ConfigError(
            "model.init_from",
            f"got {location!r}; its weights do not match the model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]})",
        )
