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
from orchestrator.core.errors import ConfigError

FILE = "recommended.yaml"
RESET = {
    "train.run_name": None,
    "train.start_from_checkpoint": None,
    "train.stop_at_tokens": None,
    "train.checkpoint_at_tokens": [],
    "batch.grad_accum_steps": None,
    "batch.micro_batch_size": "auto",
}
"""What one run of the sweep had that a new run must not: its name (a new run gets its own), a
branch's checkpoint, stop and branch points, and the split of its own batch into b x A (derived
again for the recommended batch; `auto` probes the largest micro-batch that fits)."""


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
    header += [f"# {line}" for sentence in why for line in _wrap(sentence)]
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
