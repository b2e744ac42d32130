"""`recommended.yaml`: a train config to launch, written by a report that recommends a run (a
sweep's B and lr, a branch study's ramp, a ladder's target). It is the config of a run the sweep
trained (its model, data, schedule, tracking and storage, read back from its params), with what
the report recommends set on top and what belonged to that one run (its name, a branch's
checkpoint and stop, the derived micro-batch split) reset, so `orchestrator plan` and `train`
take it as it is. Its header says where every number comes from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Sequence

import yaml

from orchestrator.core import config as config_lib
from orchestrator.core import schema
from orchestrator.core.errors import ConfigError

FILE = "recommended.yaml"
RESET = {
    "train.run_name": None,
    "train.start_from_checkpoint": None,
    "train.stop_at_tokens": None,
    "train.checkpoint_at_tokens": [],
    "batch.grad_accum_steps": None,
    "batch.micro_batch_size": "auto",
    "tracking.uri": schema.TrackingConfig.uri,
    "train.storage_path": schema.TrainConfig.storage_path,
}
"""What one run of the sweep had that a new run must not: its name (a new run gets its own), a
branch's checkpoint, stop and branch points, the split of its own batch into b x A (derived
again for the recommended batch; `auto` probes the largest micro-batch that fits), and where it
logged and checkpointed: the sweep's run resolved those to absolute paths of the machine that ran
it (and MLflow holds a store's password redacted), so the file takes the defaults, an SQLite store
and runs/ in the folder it is trained from, and its header says to set them for a cluster."""
PATH_KEYS = ("data.shard_dir", "data.tokenizer", "model.init_from")
"""Keys (besides data.sources.N.path) whose value may be a file of the machine that wrote the file."""
PORTABLE = (
    "tracking.uri and train.storage_path are the defaults (an SQLite store, mlflow.db, and runs/ in the "
    "folder you train from); on a cluster set your own, e.g. tracking.uri=http://HOST:5000 "
    "train.storage_path=s3://BUCKET/runs."
)


def config_of(params: Mapping[str, Any], overrides: Mapping[str, Any]) -> Dict[str, Any]:
    """The nested config: the run's params as a config, RESET, then `overrides` (dotted keys)."""
    data = config_lib.from_params(dict(params))
    for key, value in {**RESET, **overrides}.items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return data


def write(path: Path, params: Mapping[str, Any], overrides: Mapping[str, Any], why: Sequence[str]) -> Path:
    """recommended.yaml at `path`: the config, checked as `orchestrator plan` checks it, with `why`
    (sentences) as its header. A config the report cannot make valid is a bug: ConfigError."""
    data = config_of(params, overrides)
    header = ["# Written by `orchestrator report`: a train config to launch.", "#"]
    local = local_paths(data)
    notes = [PORTABLE] + (
        [f"These keys name files of the machine that ran the sweep; point them at yours: {', '.join(local)}."]
        if local
        else []
    )
    header += [f"# {line}" for sentence in [*why, *notes] for line in _wrap(sentence)]
    header += ["#", "# orchestrator plan recommended.yaml    # then: orchestrator train recommended.yaml", ""]
    text = "\n".join(header) + yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    path.write_text(text)
    try:
        config_lib.load(path, validate_config=True)
    except ConfigError as exc:
        path.unlink()
        raise ConfigError(exc.key, f"the recommended config would not load: {exc.message}") from None
    return path


def _wrap(sentence: str, width: int = 98) -> list:
    lines, line = [], ""
    for word in sentence.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return lines + ([line] if line else [])


def local_paths(data: Dict[str, Any]) -> Sequence[str]:
    """The dotted keys of `data` (a nested config) that hold an absolute local path."""
    flat = config_lib.flatten(data)
    keys = [k for k in flat if k in PATH_KEYS or (k.startswith("data.sources.") and k.endswith(".path"))]
    return [k for k in keys if isinstance(flat[k], str) and Path(flat[k]).is_absolute()]
