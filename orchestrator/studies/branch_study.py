"""A branch study (the sweep file's `branch:` section; docs/branches.md: the critical batch size along
training). One base run, trained here as the study's first trial or named by `branch.from`,
keeps a checkpoint at every `branch.at_tokens`; from each, a branch per factor k trains
`branch.tokens` more at k x the base's tokens per update, on the base's schedule with the lr
times k^alpha. A branch is a plain trial: the base config with a batch.ramp that switches to
k x B at the branch point, train.start_from_checkpoint and train.stop_at_tokens.

The measurement of the critical batch size from the branches' end losses is
orchestrator/analysis/branch_cbs.py; this module only lays the trials out and finds the checkpoints.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config
from orchestrator.core.sweep_schema import BranchConfig
from orchestrator.formulas import batching
from orchestrator.tracking.run_tags import PARENT_TAG, ROLE_TAG

BASE_ROLE = "branch-base"
"""orchestrator.role (run_tags.ROLE_TAG) of a branch study's base run, a child of the study's parent run."""


def check(branch: BranchConfig, base: Config) -> None:
    """What the base config must allow: branch points at its update boundaries, a budget that
    holds the last branch, and branches of whole updates at every factor."""
    if base.batch.ramp and len(base.batch.ramp) > 1:
        raise ConfigError("branch", "the base config has a batch.ramp; branch from a fixed batch size")
    B = base.batch.tokens_per_update
    for t in branch.at_tokens:
        if t % B:
            raise ConfigError(
                "branch.at_tokens",
                f"got {t:,}; not a whole number of the base's updates of {B:,} tokens: use {t // B * B:,} "
                f"or {(t // B + 1) * B:,}",
            )
    need = max(branch.at_tokens) + branch.tokens
    if base.train.total_tokens < need:
        raise ConfigError(
            "branch.tokens",
            f"the last branch ends at {need:,} tokens, past the base's train.total_tokens "
            f"{base.train.total_tokens:,}; the branches follow the base's schedule: raise it to at least {need:,}",
        )
    unit = math.lcm(*(k * B for k in branch.factors))
    if branch.tokens % unit:
        raise ConfigError(
            "branch.tokens",
            f"got {branch.tokens:,}; every branch must be whole updates of its batch (factors x {B:,}): "
            f"use a multiple of {unit:,}",
        )


def base_values(branch: BranchConfig, base: Config) -> Dict[str, Any]:
    """The base trial's overrides: a checkpoint at each branch point, all of them kept."""
    every = base.train.checkpoint_every_tokens
    kept = len(branch.at_tokens) + (base.train.total_tokens // every if every else 0) + 1
    return {"train.checkpoint_at_tokens": sorted(branch.at_tokens), "train.keep_checkpoints": kept}


def branch_values(branch: BranchConfig, base: Config, checkpoints: Optional[Dict[int, str]] = None) -> List[Dict]:
    """Every branch's overrides, by branch point then factor; `checkpoints` (tokens -> the base's
    checkpoint there) once the base has them."""
    B, alpha = base.batch.tokens_per_update, batching.alpha_of(branch.lr_scaling, "branch.lr_scaling")
    values = []
    for t in sorted(branch.at_tokens):
        for k in sorted(branch.factors):
            ramp = [{"from_tokens": 0, "tokens_per_update": B}, {"from_tokens": t, "tokens_per_update": k * B}]
            v: Dict[str, Any] = {
                "batch.ramp": ramp,
                "batch.ramp_lr_scaling": alpha,
                "train.stop_at_tokens": t + branch.tokens,
                "train.checkpoint_every_tokens": 0,  # a branch is short: a checkpoint at its end only
            }
            if checkpoints is not None:
                v["train.start_from_checkpoint"] = checkpoints[t]
            values.append(v)
    return values


def branch_at(cfg: Config) -> int:
    """The tokens a branch trial of a study starts from: where its ramp switches to factor x B
    (known before the base's checkpoint is)."""
    return cfg.batch.ramp[1].from_tokens


def branch_point(cfg: Config) -> Optional[int]:
    """The tokens a run starts from when it is a branch with its checkpoint (None for any other run)."""
    if not cfg.train.start_from_checkpoint or not cfg.batch.ramp or len(cfg.batch.ramp) < 2:
        return None
    return branch_at(cfg)


def find_base(uri: str, experiment: str, target: str) -> str:
    """`branch.from`: the run id of an existing run named by id or name."""
    from orchestrator.export import export

    try:
        run_id, _ = export.find_run(uri, experiment, target)
    except ConfigError as exc:  # export's words name its own argument; here the study's key is at fault
        raise ConfigError("branch.from", exc.message) from None
    return run_id


def checkpoints_of(uri: str, run_id: str, at_tokens: List[int]) -> Dict[int, str]:
    """The base run's checkpoint at each branch point (by the tokens each checkpoint records)."""
    from orchestrator.export import export

    location = export.checkpoints_of(uri, run_id)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            return {t: export.choose_checkpoint(location, t, Path(scratch)) for t in sorted(at_tokens)}
        except ConfigError as exc:  # export's words name its flags; here the study's key is at fault
            raise ConfigError("branch.at_tokens", f"the base run {run_id}: {exc.message}") from None


def base_tags(parent: str) -> Dict[str, str]:
    return {PARENT_TAG: parent, ROLE_TAG: BASE_ROLE}
