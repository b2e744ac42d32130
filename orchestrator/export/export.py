"""`orchestrator export RUN_OR_TRIAL --out DIR`: a run's final (or a chosen) checkpoint as one
consolidated fp32 state dict, `model.safetensors`, beside the run's resolved `config.yaml`.

The run is an MLflow run id, a run name or a Tune trial id. Its checkpoints are where the run's
tag `orchestrator.checkpoints` says (a path or an object-store URI; `--checkpoint` points
elsewhere); a checkpoint outside the local filesystem is copied to a temporary folder first.
ZeRO 1..3 shards are merged by DeepSpeed's own `zero_to_fp32` (the fp32 master weights); at
ZeRO 0 the module states file holds the whole model. Only the files DeepSpeed's names say it
wrote are read, from a private copy in a scratch folder (so that nobody can change them between
the check and the load), and every load is weights-only (`workloads/train/checkpoint.py`):
a checkpoint that would unpickle anything else is refused, naming the file.

Tied weights (the GPT's `lm_head.weight` is `wte.weight`): safetensors stores no two names for
one tensor, so the tensor is stored once, under the first name of the state dict, and the
safetensors metadata `tied` maps every other name to it ({"lm_head.weight": "wte.weight"}).
`safetensors.torch.load_model(model, path)` loads such a file into the model as it is;
`load_state_dict(path)` here gives the full state dict, aliases included, for a plain
`model.load_state_dict`.

A workload may write its own model files instead of `model.safetensors`: a callable `export(cfg,
state_dict, folder)` on the registered workload class (an `hf` workload: a folder that
transformers' `from_pretrained` loads); its state dict is the consolidated fp32 one, tied names
mapping to one tensor, and `save_safetensors` here is at its disposal.

DIR is written whole or not at all: into a temporary folder beside it, renamed at the end.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from orchestrator.core import config, storage, validation, workload_paths
from orchestrator.core.errors import ConfigError
from orchestrator.tracking.run_tags import CHECKPOINTS_TAG, PARENT_TAG, ROLE_TAG, SWEEP_ROLE
from orchestrator.tracking.store import Store, resolve_uri

log = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
CONFIG = "config.yaml"
CHECKPOINT_PREFIX = "checkpoint_"
TIED = "tied"  # safetensors metadata: {alias: stored name}, JSON
ZERO3_STATES = "zero_pp_rank_0_mp_rank_00_model_states.pt"
MODEL_STATES = "mp_rank_00_model_states.pt"  # ZeRO 0..2
RANK0_STATES = re.compile(rf"^({re.escape(ZERO3_STATES)}|{re.escape(MODEL_STATES)})$")
DEEPSPEED_FILES = re.compile(r"^((bf16_)?zero_pp_rank_\d+_)?mp_rank_\d+_(model|optim)_states\.pt$")
"""What DeepSpeed names the files of a checkpoint (model states per rank at ZeRO 3, optimizer shards)."""


def run(
    target: str,
    overrides: List[str],
    out: str,
    checkpoint: Optional[str] = None,
    tokens: Optional[int] = None,
) -> int:
    """Export run `target`'s last checkpoint (or the one at `tokens`) into the new folder `out`."""
    settings = config.load(None, overrides)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stderr: one line, or none
    uri = resolve_uri(settings.tracking.uri)
    dest = _check_out(out)
    if tokens is not None and tokens < 0:
        raise ConfigError("--tokens", f"got {tokens}; a token count >= 0")
    if checkpoint is not None:
        validation.storage_location("--checkpoint", checkpoint)
    run_id, run_name = find_run(uri, settings.tracking.experiment, target)
    text = Store(uri).read_text_artifact(run_id, CONFIG)
    if text is None:
        raise ConfigError("RUN_OR_TRIAL", f"run {run_id} has no {CONFIG} artifact: not a training run of this tool")
    location = checkpoint or checkpoints_of(uri, run_id)
    with tempfile.TemporaryDirectory(prefix="orchestrator-export-") as scratch, storage.refused_as("--checkpoint"):
        # Everything that can be refused is read here first: nothing is created beside --out before.
        (Path(scratch) / CONFIG).write_text(text)
        cfg = config.load(Path(scratch) / CONFIG, [], validate_config=False)
        chosen = choose_checkpoint(location, tokens, Path(scratch))
        folder = fetch(chosen, Path(scratch) / "checkpoint")
        state_dict, info = consolidate(folder)
        info.update(run_id=run_id, checkpoint=chosen)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}.export-{secrets.token_hex(4)}"
    staging.mkdir()  # not mkdtemp: DIR gets the mode the umask gives, like any new folder
    try:
        (staging / CONFIG).write_text(text)
        written = _write_model(cfg, state_dict, staging, info)
        mode = (staging / CONFIG).stat().st_mode & 0o777  # safetensors writes 0600: all as config.yaml
        for path in staging.iterdir():
            if path.is_file():
                path.chmod(mode)
        _publish(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    params = sum(t.numel() for t in _distinct(state_dict).values())
    at = f"{info['tokens']:,} tokens" if info.get("tokens") is not None else "unknown tokens"
    print(
        f"exported run {run_name!r} (MLflow run {run_id}): checkpoint at {at} (ZeRO {info['zero_stage']}), "
        f"{params:,} parameters in fp32 -> {', '.join([*written, CONFIG])} in {dest}"
    )
    return 0


# ---------------------------------------------------------------- finding the run and its checkpoint


def _check_out(out: str) -> Path:
    if storage.is_uri(out):
        raise ConfigError("--out", f"got {out!r}; a local folder (new or empty)")
    dest = Path(out).expanduser().resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError("--out", f"{dest} exists and is not an empty folder; give a new or empty one")
    return dest


def find_run(uri: str, experiment: str, target: str) -> Tuple[str, str]:
    """(run id, run name) of an MLflow run id, a run name or a Tune trial id."""
    store = Store(uri, experiment)
    if not store.exists():
        raise ConfigError("tracking.uri", f"no MLflow store at {uri}")
    run = store.try_get_run(target)
    if run is None:
        found = store.find_runs_named(target)
        if not found:
            raise ConfigError("RUN_OR_TRIAL", f"no MLflow run with id, name or trial id {target!r} in {uri}")
        if len(found) > 1:
            log.warning("%d runs are named %r; exporting the newest, %s", len(found), target, found[0].run_id)
        run = found[0]
    if run.tags.get(ROLE_TAG) == SWEEP_ROLE:
        raise ConfigError("RUN_OR_TRIAL", f"{target!r} is a sweep's parent run; export one of its trials")
    return run.run_id, run.name


def checkpoints_of(uri: str, run_id: str) -> str:
    """Where the run's checkpoints live: its tag, or for a `train` run from before the tag, the
    folder `train.storage_path/<train.run_name>`."""
    run = Store(uri).get_run(run_id)
    location = run.tags.get(CHECKPOINTS_TAG)
    params = run.params
    if not location and PARENT_TAG not in run.tags and "train.storage_path" in params:
        location = storage.join(params["train.storage_path"], params.get("train.run_name", ""))
    if not location:
        raise ConfigError("--checkpoint", f"run {run_id} records no checkpoint location; give --checkpoint PATH_OR_URI")
    if f"{config.REDACTED}@" in location:  # MLflow keeps no password (the door to MLflow redacts every tag)
        raise ConfigError(
            "--checkpoint",
            f"run {run_id} keeps its checkpoints at {location}, whose credentials MLflow does not hold; give "
            "--checkpoint PATH_OR_URI, with the credentials in the environment (AWS_ACCESS_KEY_ID, ...)",
        )
    return location


def _is_checkpoint(location: str) -> bool:
    return _exists(storage.join(location, storage.CHECKPOINT_TAG))


def choose_checkpoint(location: str, tokens: Optional[int], scratch: Path) -> str:
    """The checkpoint folder under `location` (or `location` itself, if it is one): the last, or the
    one taken at `tokens` tokens, by the token count the checkpoint itself records."""
    names = [n for n in storage.subfolders(location) if n.startswith(CHECKPOINT_PREFIX)]
    candidates = [storage.join(location, n) for n in names] or ([location] if _is_checkpoint(location) else [])
    if not candidates:
        raise ConfigError("--checkpoint", f"no checkpoint in {location}")
    if tokens is None:
        return candidates[-1]  # Ray names them in order: a counter (Tune) or a timestamp (Train)
    seen = []
    for candidate in reversed(candidates):
        meta = _model_states(fetch(candidate, scratch / "scan", only_model_states=True))
        if meta.get("tokens") == tokens:
            return candidate
        seen.append(meta.get("tokens"))
    have = ", ".join(f"{t:,}" for t in sorted(t for t in seen if t is not None))
    raise ConfigError("--tokens", f"no checkpoint at {tokens:,} tokens in {location}; there are: {have or 'none'}")


def _exists(location: str) -> bool:
    import pyarrow.fs as pafs

    fs, path = storage.filesystem(location)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def fetch(location: str, scratch: Path, only_model_states: bool = False) -> Path:
    """A private copy in `scratch` of the files of the checkpoint at `location` that DeepSpeed
    wrote (with `only_model_states`, rank 0's model states alone): nothing else in the folder is
    read, and what is read cannot change between its check and its load."""
    import pyarrow.fs as pafs

    fs, path = storage.filesystem(location)
    source = f"{path}/{storage.CHECKPOINT_TAG}"
    if fs.get_file_info(source).type != pafs.FileType.Directory:
        raise ConfigError("--checkpoint", f"no checkpoint folder at {location}")
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / storage.CHECKPOINT_TAG).mkdir(parents=True)
    wanted = RANK0_STATES if only_model_states else DEEPSPEED_FILES
    for info in fs.get_file_info(pafs.FileSelector(source)):
        if info.type == pafs.FileType.File and wanted.match(info.base_name):
            target = scratch / storage.CHECKPOINT_TAG / info.base_name
            pafs.copy_files(info.path, str(target), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    return scratch


# ---------------------------------------------------------------- consolidation


def _model_states_file(folder: Path) -> Path:
    for name in (ZERO3_STATES, MODEL_STATES):
        if (folder / storage.CHECKPOINT_TAG / name).is_file():
            return folder / storage.CHECKPOINT_TAG / name
    raise ConfigError("--checkpoint", f"{folder} holds no DeepSpeed checkpoint with tag {storage.CHECKPOINT_TAG!r}")


def _model_states(folder: Path) -> Dict[str, Any]:
    """Rank 0's model states: tensors and plain data, loaded without unpickling any other object."""
    import torch

    from workloads.train import checkpoint

    path = _model_states_file(folder)
    checkpoint.check_files(path.parent, "--checkpoint")
    with checkpoint.weights_only_loads():
        return torch.load(path, map_location="cpu", weights_only=True)


def consolidate(folder: Path) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(the whole model's fp32 state dict, {zero_stage, tokens}) of a local checkpoint folder.
    Tied names map to one tensor, as in the model."""
    import torch

    meta = _model_states(folder)
    stage = int(meta.get("ds_config", {}).get("zero_optimization", {}).get("stage", 0))
    info = {"zero_stage": stage, "tokens": meta.get("tokens")}
    if stage == 0:  # no partitioning: the module is whole in the model states file
        state_dict = meta["module"]
        if any(t.is_floating_point() and t.dtype != torch.float32 for t in state_dict.values()):
            # bf16/fp16 at ZeRO 0: the fp32 master copy is in DeepSpeed's optimizer state, as flat
            # groups without names, which zero_to_fp32 does not read either.
            log.warning("ZeRO 0 checkpoint of 16-bit weights: exported as those weights cast to fp32")
    else:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        from workloads.train import checkpoint

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # its chatter
            with checkpoint.weights_only_loads():
                state_dict = get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=storage.CHECKPOINT_TAG)
    return state_dict, info


def _distinct(state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """The state dict without the names that alias an earlier one (same storage, same view)."""
    return {k: v for k, v in state_dict.items() if k not in _aliases(state_dict)}


def _aliases(state_dict: Dict[str, Any]) -> Dict[str, str]:
    """{name: earlier name of the same tensor} for tied weights."""
    first: Dict[Tuple, str] = {}
    aliases = {}
    for name, t in state_dict.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if t.numel() and key in first:
            aliases[name] = first[key]
        else:
            first.setdefault(key, name)
    return aliases


def save_safetensors(state_dict: Dict[str, Any], path: Path, metadata: Optional[Dict[str, str]] = None) -> None:
    """fp32 (floating tensors), each tensor once; aliases in the metadata under `tied`."""
    import torch
    from safetensors.torch import save_file

    aliases = _aliases(state_dict)
    tensors, storages = {}, set()
    for name, t in state_dict.items():
        if name in aliases:
            continue
        t = t.detach().to("cpu", torch.float32 if t.is_floating_point() else t.dtype).contiguous()
        if t.untyped_storage().data_ptr() in storages:  # a view sharing memory with another: own copy
            t = t.clone()
        storages.add(t.untyped_storage().data_ptr())
        tensors[name] = t
    save_file(tensors, str(path), metadata={"format": "pt", TIED: json.dumps(aliases), **(metadata or {})})


def load_state_dict(path: str | Path) -> Dict[str, Any]:
    """The state dict of an exported `model.safetensors`, tied names included (one tensor)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as f:
        tied = json.loads((f.metadata() or {}).get(TIED, "{}"))
    state_dict = load_file(str(path))
    state_dict.update({alias: state_dict[name] for alias, name in tied.items()})
    return state_dict


def _write_model(cfg, state_dict: Dict[str, Any], folder: Path, info: Dict[str, Any]) -> List[str]:
    """The model files in `folder`, by the workload's own `export` if it has one; their names."""
    hook = _workload_hook(cfg)
    if hook is not None:
        before = set(os.listdir(folder))
        hook(cfg, state_dict, folder)
        return sorted(set(os.listdir(folder)) - before)
    metadata = {k: str(v) for k, v in info.items() if v is not None}
    save_safetensors(state_dict, folder / WEIGHTS, metadata)
    return [WEIGHTS]


def _workload_hook(cfg):

    try:
        factory = workload_paths.factory(cfg.model.name)
    except Exception as exc:  # a user workload this process cannot import: the generic file
        log.warning("workload %r does not import here (%s); writing %s", cfg.model.name, exc, WEIGHTS)
        return None
    hook = getattr(factory, "export", None)
    return hook if callable(hook) else None


def _publish(staging: Path, dest: Path) -> None:
    """Rename the finished folder to `dest` (which may exist, empty)."""
    if dest.exists():
        dest.rmdir()  # refuses a folder that something filled meanwhile
    staging.rename(dest)
