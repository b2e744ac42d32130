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

from orchestrator.core.derived import adamw_constants
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config
from orchestrator.core.sweep_schema import BranchConfig, Sweep
from orchestrator.formulas import batching
from orchestrator.studies.search_space import Trial, Values
from orchestrator.studies.study import Prepared, StudyKind, TunePhase, validated_base
from orchestrator.tracking.run_tags import BRANCH_OF_TAG, PARENT_TAG, ROLE_TAG

BASE_ROLE = "branch-base"
"""orchestrator.role (run_tags.ROLE_TAG) of a branch study's base run, a child of the study's parent run."""


def settling_updates(beta2: float) -> int:
    """The updates a branch needs at its largest batch before its end loss measures that batch
    rather than the change to it, under AdamW: 1 / (1 - beta2), rounded up. Adam's second moment
    is an average with weight 1 - beta2 per update, so n updates after the batch grows the base
    batch's larger gradient noise still makes up beta2^n of it (e^-1 at n = 1 / (1 - beta2)), and
    the update is divided by that stale, too large a scale: on a shorter branch the large batch
    mostly trains at a smaller step than its own, and its excess loss measures that transient
    (issue 54's Adam world, beta2 0.95: doubling a branch of fewer than about 20 updates doubled
    the critical batch it measured)."""
    return math.ceil(1 / (1 - beta2) - 1e-9)


def check(branch: BranchConfig, base: Config) -> None:
    """What the base config must allow: branch points at its update boundaries, a budget that
    holds the last branch, branches of whole updates at every factor, and, under AdamW, long
    enough at the largest factor for its second moment to settle (settling_updates)."""
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
    if base.optim.name == "adamw":  # beta2 at the largest branch's batch: given in tokens, it moves with the batch
        _long_enough_for_adam(branch, B, adamw_constants(base, max(branch.factors) * B).beta2, unit)


def _long_enough_for_adam(branch: BranchConfig, B: int, beta2: float, unit: int) -> None:
    largest = max(branch.factors) * B
    need = settling_updates(beta2)
    if branch.tokens < need * largest:
        shortest = -(-need * largest // unit) * unit
        raise ConfigError(
            "branch.tokens",
            f"got {branch.tokens:,}: {branch.tokens // largest} updates at factor {max(branch.factors)} "
            f"({largest:,} tokens each), fewer than the {need} AdamW's second moment takes to forget the base's "
            f"batch (1 / (1 - beta2), beta2 {beta2:.4g}); a shorter branch measures that change, not the critical "
            f"batch: use at least {shortest:,}, or smaller factors",
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


def _branch_points(s: Sweep) -> None:
    if not s.branch.at_tokens:
        raise ConfigError("branch.at_tokens", "missing: the token counts to branch from, e.g. [65536, 131072]")


def _branch_continues_the_base(s: Sweep) -> None:
    if 1 not in s.branch.factors:
        raise ConfigError("branch.factors", f"got {s.branch.factors}; needs 1, the base's own continuation")


def _branch_tokens(s: Sweep) -> None:
    if not s.branch.tokens:
        raise ConfigError("branch.tokens", "missing: the tokens each branch trains, e.g. 32768")


def _relative_tolerance_below_1(s: Sweep) -> None:
    if s.branch.tolerance_kind == "relative" and not s.branch.tolerance < 1:
        raise ConfigError(
            "branch.tolerance",
            f"got {s.branch.tolerance}; a relative tolerance is a share of the loss in (0, 1), e.g. 0.01 "
            "(branch.tolerance_kind: absolute takes a loss difference)",
        )


def _branch_sweeps_only_factors(s: Sweep) -> None:
    if s.space:
        raise ConfigError(
            "space", f"a branch study sweeps branch.factors at branch.at_tokens, not {', '.join(s.space)}"
        )


NEEDS = "a branch study runs every branch: search.algorithm grid, no scheduler"

RULES = (
    _branch_points,
    _branch_continues_the_base,
    _branch_tokens,
    _relative_tolerance_below_1,
    _branch_sweeps_only_factors,
)


class BranchKind(StudyKind):
    """The branches of one base run; the base trains first, as a Tune phase of its own, unless
    `branch.from` names an existing run."""

    name = "branch study"
    search_tag = "grid"
    needs = ("branch", NEEDS)
    takes_scheduler = False
    rules = RULES
    refused_keys = {"loss_tolerance": "a branch study recommends a ramp by branch.tolerance, not a batch size"}

    def present(self, sweep: Sweep) -> bool:
        return sweep.branch is not None

    def values(self, sweep: Sweep) -> List[Values]:
        base = validated_base(sweep)
        check(sweep.branch, base)
        return branch_values(sweep.branch, base)

    def plan(self, sweep: Sweep, base: Config) -> Prepared:
        prepared = super().plan(sweep, base)
        if not sweep.branch.from_run:  # trained first, with a checkpoint at every branch point
            prepared.base_trial = self.resolve(sweep, base_values(sweep.branch, base))
        return prepared

    def start_of(self, trial: Trial) -> int:
        return branch_at(trial.cfg) if "train.stop_at_tokens" in trial.values else 0

    def before_ray(self, prepared: Prepared) -> None:
        """`branch.from`: the run, with its checkpoints, found before Ray starts."""
        sweep, base = prepared.sweep, prepared.base
        if sweep.branch.from_run:
            prepared.base_run = find_base(base.tracking.uri, base.tracking.experiment, sweep.branch.from_run)
            prepared.trials = self._from_checkpoints(prepared)

    def before_tune(self, prepared: Prepared, tune_phase: TunePhase) -> Dict[str, str]:
        """The base run trained now as its own Tune phase (a resumed study finds it finished)."""
        if prepared.base_run is None:
            prepared.base_run = self._train_base(prepared, tune_phase)
            prepared.trials = self._from_checkpoints(prepared)
        return {BRANCH_OF_TAG: prepared.base_run}

    def _train_base(self, prepared: Prepared, tune_phase: TunePhase) -> str:
        from orchestrator.tracking.store import Store

        store, tags = Store.of(prepared.base), base_tags(prepared.parent_run)
        run_id = store.find_run(tags)
        if not run_id or store.get_run(run_id).status != "FINISHED":
            name, branches = prepared.sweep.name, len(prepared.trials or [])
            print(f"branch study {name!r}: the base run first, then {branches} branches")
            tune_phase([prepared.base_trial], tags, "base")
            run_id = store.find_run(tags)
        if not run_id or store.get_run(run_id).status != "FINISHED":
            raise RuntimeError(
                f"the base run of branch study {prepared.sweep.name!r} did not finish (MLflow run {run_id})"
            )
        return run_id

    def _from_checkpoints(self, prepared: Prepared) -> List[Trial]:
        """The branch trials, each with the base run's checkpoint at its branch point."""
        sweep, run_id = prepared.sweep, prepared.base_run
        checkpoints = checkpoints_of(prepared.base.tracking.uri, run_id, sweep.branch.at_tokens)
        unvalidated = prepared.unvalidated
        trials = [
            self.resolve(sweep, {**t.values, "train.start_from_checkpoint": checkpoints[branch_at(t.cfg)]}, unvalidated)
            for t in prepared.trials or []
        ]
        refused = next((t for t in trials if t.cfg is None), None)
        if refused is not None:
            raise ConfigError("branch.at_tokens", f"the base run {run_id}: {refused.problem}")
        return trials
