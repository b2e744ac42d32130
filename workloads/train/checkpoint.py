"""What a worker checkpoints besides model and optimizer, and how: a DeepSpeed checkpoint on
every rank (ZeRO shards its state), merged and persisted by Ray Train (by Ray Tune in local mode).

A checkpoint is read back (a resume, a retry, a branch, an export) without unpickling anything
but tensors, plain data and the few DeepSpeed types its files hold: whoever can write the storage
path must not be able to run code on the workers. DeepSpeed calls `torch.load(weights_only=False)`
itself; inside `weights_only_loads()` torch overrides that (TORCH_FORCE_WEIGHTS_ONLY_LOAD), and
`check_files` loads each file so first, so that a refused one is named.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import torch
from torch import nn

from orchestrator.core.errors import ConfigError
from orchestrator.core.storage import CHECKPOINT_TAG
from orchestrator.tracking import metric_logger
from workloads.train.handoff import RayApi


@dataclass
class TrainState:
    """Everything besides model and optimizer that a resumed run needs (checkpoint client state)."""

    update: int = 0
    tokens: int = 0
    run_id: str = ""
    gns: Dict[str, Any] = field(default_factory=dict)
    gns_adam: Dict[str, Any] = field(default_factory=dict)
    """The EMA of the noise scale of the gradient as AdamW preconditions it (empty: none)."""
    stable_loss: float = float("nan")
    """eval/loss where the stable part of the schedule ends (schedules.stable_end_tokens); NaN before."""
    mlflow_watermarks: Dict[str, int] = field(default_factory=dict)
    mlflow_pending: List[Any] = field(default_factory=list)
    torch_rng: Optional[Any] = None


FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"


def deepspeed_globals() -> List[type]:
    """The classes DeepSpeed pickles into its optimizer shards (ZeRO 1..3), each plain data."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    """Every torch.load inside loads weights only, whatever its caller asked, DeepSpeed's types allowed."""
    saved = os.environ.get(FORCE_WEIGHTS_ONLY)
    os.environ[FORCE_WEIGHTS_ONLY] = "1"
    try:
        with torch.serialization.safe_globals(deepspeed_globals()):
            yield
    finally:
        if saved is None:
            os.environ.pop(FORCE_WEIGHTS_ONLY, None)
        else:
            os.environ[FORCE_WEIGHTS_ONLY] = saved


def check_files(folder: str | Path, key: str) -> None:
    """Load every pickle under `folder` weights-only (memory-mapped where the format allows): a
    file that names anything else is a ConfigError naming it."""
    for path in sorted(Path(folder).rglob("*.pt")):
        try:
            with weights_only_loads():
                torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
        except Exception as exc:
            raise ConfigError(
                key,
                f"{path} is not a checkpoint this tool wrote, or was altered ({_why(exc)}); refusing to unpickle it",
            ) from None


def _why(exc: Exception) -> str:
    """The unpickler's reason ("Unsupported global: GLOBAL io.open ..."), without torch's advice to load it anyway."""
    found = re.search(r"WeightsUnpickler error: (.*?)(\. |\.?$)", str(exc), re.MULTILINE)
    return (
        found.group(1)
        if found
        else f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    )


def restore(engine, state: TrainState, api: RayApi, branch_from: Optional[str] = None) -> TrainState:
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
    check_files(folder, "checkpoint")
    with weights_only_loads():  # the files could change since the check: load them weights-only too
        path, client = engine.load_checkpoint(folder, tag=CHECKPOINT_TAG)
    if path is None:
        raise ConfigError(
            "train.start_from_checkpoint", f"{folder} holds no checkpoint of this trainer (tag {CHECKPOINT_TAG})"
        )
    restored = TrainState(**{k: v for k, v in client.items() if k in TrainState.__dataclass_fields__})
    if restored.torch_rng is not None:
        torch.set_rng_state(restored.torch_rng)
    return restored


def save_and_report(engine, state: TrainState, metrics: Dict[str, float], logger, api: RayApi) -> None:
    """DeepSpeed checkpoint on every rank (ZeRO shards its state), merged and persisted by Ray
    Train (by Ray Tune in local mode)."""
    if logger is not None:
        logger.flush(metric_logger.REPORT_FLUSH_S)  # what stays unsent goes into the checkpoint
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

    load_model(model, str(check_weights(model, location)), strict=False)


def check_weights(model: nn.Module, location: str) -> Path:
    """The safetensors file of model.init_from, after its header (names and shapes, no tensor read)
    matched `model`'s, which may live on the meta device: else a ConfigError saying what differs."""
    from safetensors import SafetensorError, safe_open

    path = Path(location)
    path = path / "model.safetensors" if path.is_dir() else path
    if not path.is_file():
        raise ConfigError("model.init_from", f"got {location!r}; no safetensors file there")
    try:
        with safe_open(str(path), framework="pt") as f:
            shapes = {name: list(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise ConfigError("model.init_from", f"got {location!r}; not a safetensors file ({exc})") from None
    tensors = model.state_dict(keep_vars=True)
    tied: Dict[int, List[str]] = {}  # one tensor's names: a tied weight may be stored under any of them
    for name, t in tensors.items():
        tied.setdefault(id(t), []).append(name)
    missing = [names[0] for names in tied.values() if not any(n in shapes for n in names)]
    unexpected = sorted(set(shapes) - set(tensors))
    wrong = [
        f"{n} is {shapes[n]}, the model's {list(t.shape)}"
        for n, t in tensors.items()
        if shapes.get(n, list(t.shape)) != list(t.shape)
    ]
    if missing or unexpected or wrong:
        what = ([f"missing {missing[:3]}"] if missing else []) + (
            [f"unexpected {unexpected[:3]}"] if unexpected else []
        )
        raise ConfigError(
            "model.init_from",
            f"got {location!r}; its weights do not match the model: {'; '.join(what + wrong[:3])}",
        )
    return path
