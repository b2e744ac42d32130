"""`recommended.yaml`: a train config to launch, written by a report that recommends a run (a
sweep's B and lr, a branch study's advised schedule, a ladder's target). It is the config of a run the sweep
trained (its model, data, schedule, tracking and storage, read back from its params), with what
the report recommends set on top and what belonged to that one run (its name, a branch's
checkpoint and stop, the derived micro-batch split) reset, so `orchestrator plan` and `train`
take it as it is. Its header says where every number comes from. `Recommended` is that file as
a value (load_sweep's `recommended`): the config, typed, and its YAML.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import yaml

from orchestrator.analysis import branch_analysis
from orchestrator.analysis.answer import Answer, BranchStudy
from orchestrator.analysis.trials import Trial
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


@dataclass(frozen=True)
class Recommended:
    """A train config to launch and why: what recommended.yaml holds."""

    data: Dict[str, Any]
    """The nested config, its values typed (numbers, not the text MLflow logged)."""
    why: Tuple[str, ...]
    """Where its numbers come from, as sentences (the file's header)."""

    @property
    def config(self) -> schema.Config:
        """The typed train config (orchestrator/core/schema.py), as `orchestrator train` would load it."""
        cfg = config_lib.from_dict(copy.deepcopy(self.data))
        config_lib.follow_tokenizer(cfg)
        return cfg

    def overrides(self) -> Dict[str, Any]:
        """The config as dotted keys, e.g. {'batch.tokens_per_update': 256, 'optim.lr': 0.00116, ...}."""
        return config_lib.flatten(self.data)

    def to_yaml(self) -> str:
        """recommended.yaml's text: the header (why, what to set on a cluster), then the config."""
        local = local_paths(self.data)
        notes = [PORTABLE] + (
            [f"These keys name files of the machine that ran the sweep; point them at yours: {', '.join(local)}."]
            if local
            else []
        )
        header = ["# Written by `orchestrator report`: a train config to launch.", "#"]
        header += [f"# {line}" for sentence in [*self.why, *notes] for line in _wrap(sentence)]
        header += ["#", "# orchestrator plan recommended.yaml    # then: orchestrator train recommended.yaml", ""]
        return "\n".join(header) + yaml.safe_dump(self.data, sort_keys=False, default_flow_style=None)

    def write(self, path: Path) -> Path:
        """The file at `path`, checked as `orchestrator plan` checks it. A config the report cannot
        make valid is a bug: ConfigError, and no file."""
        path.write_text(self.to_yaml())
        try:
            config_lib.load(path, validate_config=True)
        except ConfigError as exc:
            path.unlink()
            raise ConfigError(exc.key, f"the recommended config would not load: {exc.message}") from None
        return path


def of(params: Mapping[str, Any], overrides: Mapping[str, Any], why: Sequence[str]) -> Recommended:
    """A run's config (its `params`) with RESET and `overrides` on top, and why."""
    return Recommended(config_of(params, overrides), tuple(why))


def write(path: Path, params: Mapping[str, Any], overrides: Mapping[str, Any], why: Sequence[str]) -> Path:
    """recommended.yaml at `path` (Recommended.write)."""
    return of(params, overrides, why).write(path)


def for_answer(trials: Sequence[Trial], answer: Answer) -> Optional[Recommended]:
    """What a sweep's report recommends: the template run's config with the recommended batch size
    and lr on top, or a branch study's advised schedule on its base run; None when there is nothing to
    recommend or the runs logged no train config of this project (tables of another trainer)."""
    if answer.branch:
        return _advised(trials, answer.branch)
    rec = answer.recommendation
    template = next((t for t in trials if rec and rec.launchable and t.run_id == rec.template_run), None)
    if template is None:
        return None
    return of(template.params, rec.overrides(), rec.rule)


def _advised(trials: Sequence[Trial], study: BranchStudy) -> Optional[Recommended]:
    """The base run's config with the schedule the study advises (BranchStudy.advice): its batch.ramp
    and lr scaling (the keys of the study's pasteable YAML), a larger fixed batch and its lr, or the
    base's own batch; None when the base run logged no config of this project."""
    base = branch_analysis.base_of(trials)
    if base is None or base.number("data.seq_len") is None:
        return None
    choice, advice = study.schedule_choice, study.advice
    reason = f" ({choice.why})" if choice else ""
    if advice == "fixed" and choice is not None:
        batch = choice.chosen_ramp[0][1]
        overrides: Dict[str, Any] = {"batch.ramp": None, "batch.tokens_per_update": batch}
        if choice.chosen_lr:
            overrides["optim.lr"] = choice.chosen_lr
        why = f"The branch study of {base.name} advises a fixed {choice.chosen}{reason}"
        chosen = next(a for a in choice.arms if a.name == choice.chosen)
        at = "the lr of its trained run" if chosen.trained else "the lr its branches ran it at"
        return of(base.params, overrides, [f"{why}, at {at}."])
    if advice == "base":
        why = f"The branch study of {base.name} advises its base batch, {study.base_batch:,} tokens per update{reason}."
        return of(base.params, {"batch.ramp": None}, [why])
    overrides = {"batch.ramp": [dict(step) for step in study.ramp], "batch.ramp_lr_scaling": study.lr_scaling}
    why = (
        f"The batch ramp the branch study suggests from its base run {base.name}: "
        + ", ".join(
            f"{s['tokens_per_update']:,} tokens per update from {s['from_tokens']:,} tokens" for s in study.ramp
        )
        + f"; each change scales the lr by k^{study.lr_scaling:g} (batch.ramp_lr_scaling){reason}."
    )
    return of(base.params, overrides, [why])


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
