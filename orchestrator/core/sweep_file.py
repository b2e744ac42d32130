"""Reading a sweep file (docs/sweeps.md): `load`, its one reader, used by `sweep`, `report` and
`submit`. FIELDS holds one row per key of the file, the values it takes and the error a bad one
gets, as validation.FIELDS does for the train config; RULES, the checks that span keys, run once
every key has passed its row. The keys themselves, with their types, defaults and docstrings, are
orchestrator/core/sweep_schema.py, and orchestrator/core/table_reader.py reads a file by the two:
a new section is a dataclass there, its rows in FIELDS and its rules in RULES. Pure: no Ray, no
MLflow. Expanding a sweep into trials is orchestrator.studies.search_space.

Distributions (space, lr_scaling.base_lr and lr_scaling.alpha): grid (every value), choice,
uniform [low, high], loguniform [low, high], randint [low, high] (inclusive); a bare value is a
one-value grid. Grid keys form a product; the other keys are drawn `num_samples` times per grid
point (seeded, so the list of trials is reproducible). Every trial shares the base's
`train.total_tokens`, so curves compare at equal tokens; a `ladder` gives each rung its own.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Optional

from orchestrator.core import config as config_lib
from orchestrator.core import table_reader, validation, yaml_files
from orchestrator.core.errors import ConfigError
from orchestrator.core.sweep_schema import (
    ALGORITHMS,
    ALPHA_PRESETS,
    COMPARES,
    CRITERIA,
    DISTRIBUTIONS,
    INFEASIBLE,
    LR_KEYS,
    OPTUNA_STORAGE_SCHEMES,
    SCHEDULERS,
    SHARE_KEYS,
    TOLERANCE_KINDS,
    BaseConfig,
    LrScalingConfig,
    Sweep,
)
from orchestrator.core.validation import Field, count, number, one_of


def is_number(x: Any) -> bool:
    """A finite number (no NaN, no infinity anywhere in a sweep file)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ---------------------------------------------------------------- the checks of one key's value


def _spec(value: Any) -> Dict[str, Any]:
    """A space entry as {distribution: args}: a bare value is a one-value grid."""
    return value if isinstance(value, dict) and len(value) == 1 else {"grid": [value]}


def _distribution(key: str, value: Any, numeric: bool = False) -> None:
    """One entry of space (named space.<key>). `numeric`: keys that only the sweep computes with
    (shares, lr scaling), so their values must be numbers."""
    ((kind, args),) = _spec(value).items()
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"space.{key}", f"unknown distribution {kind!r}; valid: {', '.join(DISTRIBUTIONS)}")
    if kind in ("grid", "choice"):
        if not isinstance(args, list) or not args:
            raise ConfigError(f"space.{key}", f"{kind} needs a non-empty list of values, got {args!r}")
        if numeric and not all(is_number(a) for a in args):
            raise ConfigError(f"space.{key}", f"values must be numbers, got {args!r}")
        return
    if not (isinstance(args, list) and len(args) == 2 and all(is_number(a) for a in args)):
        raise ConfigError(f"space.{key}", f"{kind} needs [low, high], got {args!r}")
    low, high = args
    if low > high:
        raise ConfigError(f"space.{key}", f"{kind} range has low {low} > high {high}")
    if kind == "loguniform" and low <= 0:
        raise ConfigError(f"space.{key}", f"loguniform needs low > 0, got {low}")


def _space(key: str, space: Dict[Any, Any]) -> None:
    """Each entry a distribution of a train-config key (or of a share of the budget)."""
    for name, value in space.items():
        _distribution(name, value, numeric=name in SHARE_KEYS)
    for name in space:
        _train_key(f"space.{name}", name)


def _train_key(key: str, name: Any) -> None:
    """A key of the train config, or a share of the budget that the sweep turns into tokens."""
    if name not in set(config_lib.schema_keys()) | set(SHARE_KEYS):
        raise ConfigError(key, f"{name!r} is not a train-config key{config_lib.did_you_mean(str(name))}")


def _overrides(key: str, value: Any) -> None:
    """What yaml_files.dotlist turns into key=value strings."""
    if not isinstance(value, dict) and not (isinstance(value, list) and all(isinstance(o, str) for o in value)):
        raise ConfigError(key, f"got {value!r}; valid: a mapping of key: value or a list of key=value")


def _alpha(value: Any) -> Any:
    """lr_scaling.alpha with a preset (sqrt, linear) as its number."""
    return ALPHA_PRESETS.get(value, value) if isinstance(value, str) else value


def _lr_exponent(key: str, value: Any) -> None:
    """A preset, or numbers up to 2: a fixed one, a grid's values or a range's two ends."""
    if isinstance(_alpha(value), str):
        raise ConfigError(key, f"got {value!r}; valid presets: {', '.join(ALPHA_PRESETS)} or a number")
    _distribution(key, _alpha(value), numeric=True)
    for alpha in next(iter(_spec(_alpha(value)).values())):
        validation.LR_SCALING.validate(key, alpha)


def _model_overrides(key: str, value: Any) -> None:
    """A rung's model: a mapping of train-config keys (not the budget: the ladder sets it)."""
    if not isinstance(value, dict) or not value:
        raise ConfigError(key, f"got {value!r}; valid: a mapping of train-config keys, e.g. {{model.d_model: 64}}")
    for name in value:
        _train_key(f"{key}.{name}", name)
        if name == "train.total_tokens":
            raise ConfigError(f"{key}.{name}", "a rung's budget is its total_tokens (or the ladder's tokens_per_param)")


def _model_list(key: str, value: list) -> None:
    for i, model in enumerate(value):
        _model_overrides(f"{key}.{i}", model)


def _positive_numbers(key: str, value: list) -> None:
    if not value or not all(is_number(x) and x > 0 for x in value) or len(set(value)) < len(value):
        raise ConfigError(key, f"got {value!r}; valid: a list of distinct numbers > 0, e.g. [0.5, 1, 2]")


def _database_url(key: str, value: str) -> None:
    dialect = value.partition("://")[0].partition("+")[0].lower()
    if "://" not in value or dialect not in OPTUNA_STORAGE_SCHEMES:
        valid = ", ".join(f"{s}://" for s in OPTUNA_STORAGE_SCHEMES)
        raise ConfigError(key, f"got {value!r}; use a database URL ({valid}), e.g. sqlite:///optuna.db")


FIELDS = {
    "name": Field("str", check=validation.plain_name),  # a folder under train.storage_path/sweeps/ and reports/
    "description": Field("any", optional=True),  # prose, read by no one
    "base.config": Field("str"),
    "base.overrides": Field("any", optional=True, check=_overrides),
    "space": Field(
        "dict",
        optional=True,
        what="a mapping of train-config keys to distributions, e.g. optim.lr: {grid: [1e-3, 3e-3]}",
        check=_space,
    ),
    "lr_scaling.reference_tokens": number(0, low_open=True),
    "lr_scaling.base_lr": Field("any", check=lambda key, value: _distribution(key, value, numeric=True)),
    "lr_scaling.alpha": Field("any", check=_lr_exponent),
    "constraints.*.key": Field("str", check=_train_key),
    "constraints.*.max": number(),
    "constraints.*.min": number(),
    "constraints.*.of": Field("str", check=_train_key),
    "infeasible": one_of(*INFEASIBLE),
    "search.algorithm": one_of(*ALGORITHMS),
    "search.num_samples": count(),
    "search.max_concurrent": count(),
    "search.seed": count(0),
    "search.metric": one_of("eval_loss", "loss"),  # what the trials report to Tune
    "search.seeds": count(),
    "search.criterion": one_of(*CRITERIA),
    "search.target_loss": number(0, low_open=True, optional=True),
    "search.max_lrs_per_batch": count(3),  # a lower, a best and a higher lr at least
    "search.lr_step": number(1, low_open=True),
    "search.optuna_storage": Field("str", optional=True, check=_database_url),
    "scheduler.type": one_of(*SCHEDULERS),
    "scheduler.grace_period_tokens": count(0),
    "scheduler.reduction_factor": count(2),
    "max_failures": count(0),
    "local_mode": Field("bool"),
    "branch.at_tokens": Field("list", check=validation.token_counts),
    "branch.factors": Field("list", check=validation.token_counts),
    "branch.tokens": count(),
    "branch.lr_scaling": validation.LR_SCALING,
    "branch.tolerance": number(0, low_open=True),
    "branch.tolerance_kind": one_of(*TOLERANCE_KINDS),
    "branch.compare": one_of(*COMPARES),
    "branch.from": Field("str", optional=True),
    "branch.compare_with": Field("str", optional=True),
    "ladder.models": Field("list", check=lambda key, value: _model_list(key, value)),
    "ladder.tokens_per_param": Field("list", check=lambda key, value: _positive_numbers(key, value)),
    "ladder.rungs.*.overrides": Field("any", check=lambda key, value: _model_overrides(key, value)),
    "ladder.rungs.*.total_tokens": count(),
    "ladder.target.params": number(0, low_open=True, optional=True),
    "ladder.target.tokens": number(0, low_open=True, optional=True),
    "ladder.target.overrides": Field("any", optional=True, check=lambda key, value: _model_overrides(key, value)),
    "ladder.tolerance": number(0, 1, low_open=True, high_open=True),
    "loss_tolerance": number(0, 1, low_open=True, high_open=True),
    "ladder.hold": one_of("tokens", "steps"),
    "ladder.predict": Field("bool"),
}
"""One row per key of the file (`*`: every item of a list), the one place its valid values are
declared; a key the file leaves out takes its default in sweep_schema.py. A test keeps the table
and the dataclasses the same keys."""


# ---------------------------------------------------------------- the checks across keys


def _base_names_a_config(s: Sweep) -> None:
    if not s.base.config:
        raise ConfigError("base.config", "missing: the train config every trial starts from")


def _replicates_of_listed_trials(s: Sweep) -> None:
    if s.search.seeds > 1 and s.search.algorithm == "optuna":
        raise ConfigError(
            "search.seeds",
            f"got {s.search.seeds}; replicates need search.algorithm grid, random or bracket "
            "(optuna proposes one configuration at a time)",
        )


def _optuna_storage_for_optuna(s: Sweep) -> None:
    if s.search.optuna_storage and s.search.algorithm != "optuna":
        raise ConfigError("search.optuna_storage", f"only with search.algorithm: optuna (got {s.search.algorithm})")


def _seeds_one_way(s: Sweep) -> None:
    if s.search.seeds > 1 and "train.seed" in s.space:
        raise ConfigError("search.seeds", "train.seed is also in space; sweep seeds either way, not both")


def _grid_search_of_grids(s: Sweep) -> None:
    if s.search.algorithm == "grid" and any(next(iter(v)) != "grid" for v in s.space.values()):
        raise ConfigError("search.algorithm", "grid search needs every space key to be a grid; use random or optuna")


def _asha_grace_period(s: Sweep) -> None:
    if s.scheduler.type == "asha" and s.scheduler.grace_period_tokens <= 0:
        raise ConfigError("scheduler.grace_period_tokens", "ASHA needs a grace period in tokens > 0")


def _lr_swept_or_scaled(s: Sweep) -> None:
    if s.lr_scaling and "optim.lr" in s.space:
        raise ConfigError("lr_scaling", "sweep either optim.lr or lr_scaling, not both")


def _lr_scaling_complete(s: Sweep) -> None:
    if s.lr_scaling and (s.lr_scaling.reference_tokens is None or s.lr_scaling.base_lr is None):
        raise ConfigError(
            "lr_scaling", "needs reference_tokens and base_lr (and optional alpha: sqrt, linear or a number)"
        )


def _bracket_batch_grid(s: Sweep) -> None:
    """A bracket search finds the lr per batch size: a grid of them."""
    batch = s.space.get("batch.tokens_per_update", {})
    if s.search.algorithm == "bracket" and "grid" not in batch:
        raise ConfigError(
            "space.batch.tokens_per_update",
            f"got {batch or 'nothing'}; search.algorithm bracket finds the lr per batch size: "
            "valid: a grid, e.g. {grid: [2048, 4096]}",
        )


def _bracket_first_lrs(s: Sweep) -> None:
    """A bracket search starts from fixed lrs: optim.lr's grid, or lr_scaling's guess."""
    if s.search.algorithm != "bracket":
        return
    lrs = s.space.get("optim.lr")
    if lrs is None and not s.lr_scaling:
        raise ConfigError(
            "space.optim.lr", "missing; search.algorithm bracket starts from {grid: [...]} here or from lr_scaling"
        )
    if lrs is not None and ("grid" not in lrs or not all(is_number(x) and x > 0 for x in lrs["grid"])):
        raise ConfigError(
            "space.optim.lr", f"got {lrs}; search.algorithm bracket starts from a grid of learning rates > 0"
        )


def _bracket_rule_of_numbers(s: Sweep) -> None:
    """lr_scaling's guess, which a bracket search brackets, from a fixed base_lr > 0 and alpha."""
    if s.search.algorithm != "bracket":
        return
    for key, spec in lr_space(s.lr_scaling).items():
        values = spec.get("grid", [])
        if len(values) != 1 or (key == "lr_scaling.base_lr" and not values[0] > 0):
            raise ConfigError(
                key,
                f"got {getattr(s.lr_scaling, key.partition('.')[2])!r}; search.algorithm bracket needs a fixed number"
                + (" > 0" if key == "lr_scaling.base_lr" else "")
                + " (it brackets the lr around the rule's guess)",
            )


def _bracket_groups_of_grids(s: Sweep) -> None:
    """The other space keys are the groups a bracket search finds an lr in: grids."""
    if s.search.algorithm != "bracket":
        return
    for key, spec in s.space.items():
        if "grid" not in spec:
            raise ConfigError(f"space.{key}", f"got {spec}; search.algorithm bracket needs a grid (the groups)")


def _bracket_target_loss(s: Sweep) -> None:
    if s.search.algorithm == "bracket" and s.search.criterion in ("steps", "both") and s.search.target_loss is None:
        raise ConfigError(
            "search.target_loss",
            f"missing; search.criterion {s.search.criterion} scores an lr by its steps to this train loss "
            "(e.g. a loss every batch size reaches before its decay)",
        )


def _bracket_first_round_fits(s: Sweep) -> None:
    lrs = s.space.get("optim.lr")
    first = len(set(lrs["grid"])) if lrs is not None and "grid" in lrs else 3
    if s.search.algorithm == "bracket" and s.search.max_lrs_per_batch < first:
        raise ConfigError(
            "search.max_lrs_per_batch",
            f"got {s.search.max_lrs_per_batch}; must be at least the {first} learning rates of the first round",
        )


def _one_bound_per_constraint(s: Sweep) -> None:
    for i, c in enumerate(s.constraints):
        if c.key is None or (c.max is None) == (c.min is None):
            raise ConfigError(
                f"constraints.{i}", "a constraint is {key: K, max|min: factor, of: OTHER_KEY} (of is optional)"
            )


def _branch_points(s: Sweep) -> None:
    if s.branch and not s.branch.at_tokens:
        raise ConfigError("branch.at_tokens", "missing: the token counts to branch from, e.g. [65536, 131072]")


def _branch_continues_the_base(s: Sweep) -> None:
    if s.branch and 1 not in s.branch.factors:
        raise ConfigError("branch.factors", f"got {s.branch.factors}; needs 1, the base's own continuation")


def _branch_tokens(s: Sweep) -> None:
    if s.branch and not s.branch.tokens:
        raise ConfigError("branch.tokens", "missing: the tokens each branch trains, e.g. 32768")


def _relative_tolerance_below_1(s: Sweep) -> None:
    if s.branch and s.branch.tolerance_kind == "relative" and not s.branch.tolerance < 1:
        raise ConfigError(
            "branch.tolerance",
            f"got {s.branch.tolerance}; a relative tolerance is a share of the loss in (0, 1), e.g. 0.01 "
            "(branch.tolerance_kind: absolute takes a loss difference)",
        )


def _branch_sweeps_only_factors(s: Sweep) -> None:
    if s.branch and s.space:
        raise ConfigError(
            "space", f"a branch study sweeps branch.factors at branch.at_tokens, not {', '.join(s.space)}"
        )


def _branch_runs_every_branch(s: Sweep) -> None:
    if s.branch and (s.search.algorithm != "grid" or s.scheduler.type != "none"):
        raise ConfigError("branch", "a branch study runs every branch: search.algorithm grid, no scheduler")


def _ladder_rungs_one_way(s: Sweep) -> None:
    if not s.ladder:
        return
    if bool(s.ladder.rungs) == bool(s.ladder.models):
        raise ConfigError(
            "ladder", "give either models with tokens_per_param, or rungs (each {overrides, total_tokens})"
        )
    if s.ladder.models and not s.ladder.tokens_per_param:
        raise ConfigError("ladder.tokens_per_param", "missing: the budgets per parameter, e.g. [0.5, 1, 2]")
    if s.ladder.rungs and s.ladder.tokens_per_param:
        raise ConfigError("ladder.tokens_per_param", "only with ladder.models (rungs give their own total_tokens)")
    if any(r.total_tokens <= 0 or not r.overrides for r in s.ladder.rungs):
        raise ConfigError("ladder.rungs", "each rung is {overrides: {model keys}, total_tokens: N}")


def _ladder_target(s: Sweep) -> None:
    t = s.ladder.target if s.ladder else None
    if t is not None and (t.tokens is None or (t.params is None) == (t.overrides is None)):
        raise ConfigError(
            "ladder.target",
            "needs tokens and either params or overrides (the target's model), e.g. {params: 1.0e9, tokens: 2.0e10}",
        )


def _ladder_of_bracket_studies(s: Sweep) -> None:
    if s.ladder and (s.search.algorithm != "bracket" or s.branch or s.scheduler.type != "none"):
        raise ConfigError(
            "ladder",
            "every rung is a bracket search over batch size and lr: search.algorithm bracket, no branch, no scheduler",
        )


def _one_loss_tolerance(s: Sweep) -> None:
    if "loss_tolerance" in s.written and s.ladder:
        raise ConfigError("loss_tolerance", "a ladder's is ladder.tolerance (loss_tolerance is a single sweep's)")
    if "loss_tolerance" in s.written and s.branch:
        raise ConfigError("loss_tolerance", "a branch study recommends a ramp by branch.tolerance, not a batch size")


RULES = (
    _base_names_a_config,
    _replicates_of_listed_trials,
    _optuna_storage_for_optuna,
    _seeds_one_way,
    _grid_search_of_grids,
    _asha_grace_period,
    _lr_swept_or_scaled,
    _lr_scaling_complete,
    _bracket_batch_grid,
    _bracket_first_lrs,
    _bracket_rule_of_numbers,
    _bracket_groups_of_grids,
    _bracket_target_loss,
    _bracket_first_round_fits,
    _one_bound_per_constraint,
    _branch_points,
    _branch_continues_the_base,
    _branch_tokens,
    _relative_tolerance_below_1,
    _branch_sweeps_only_factors,
    _branch_runs_every_branch,
    _ladder_rungs_one_way,
    _ladder_target,
    _ladder_of_bracket_studies,
    _one_loss_tolerance,
)
"""The checks that span keys, in the order they run, after every key has passed its row. A branch
study's batch arithmetic (each factor's split, whole updates) needs the base config: branch_study.check."""

READ_UNCHECKED = ("name", "base", "search", "branch", "ladder", "loss_tolerance")
"""What `load(check=False)` reads (by their rows, no RULES): what `submit` and `report` need of a
file whose other keys need not be valid there."""


# ---------------------------------------------------------------- the reader


def load(path: str | Path, check: bool = True) -> Sweep:
    """Read and check a sweep file: every key by its row of FIELDS, then RULES; every error is a
    one-line ConfigError (exit 2). check=False reads only READ_UNCHECKED, checks no rule and
    leaves base_config None when the file names none."""
    path = Path(path)
    raw, text = yaml_files.read_mapping(path, "SWEEP", kind="sweep", shape=SHAPE)
    return _read(raw, text, path, check)


def read_recorded(text: str, path: Path) -> Sweep:
    """A sweep file as its parent run recorded it (the artifact `path.name`), read as load(check=False)
    reads it: what `report` needs to answer as the file would have it."""
    return _read(yaml_files.parse_mapping(text, path, "SWEEP", SHAPE), text, path, check=False)


SHAPE = "a mapping with name, base, space, ..."


def _read(raw: Dict[str, Any], text: str, path: Path, check: bool) -> Sweep:
    named = {**raw, "name": path.stem if raw.get("name") is None else raw["name"]}  # the stem too names a folder
    read = table_reader.read(Sweep, named, FIELDS, only=None if check else READ_UNCHECKED)
    base = read.get("base") or BaseConfig()
    read["space"] = {k: _spec(v) for k, v in (read.get("space") or {}).items()}
    sweep = Sweep(
        **read,
        path=path,
        base_config=(path.parent / base.config).resolve() if base.config else None,
        base_overrides=yaml_files.dotlist(base.overrides or {}),
        text=text,
        written=config_lib.flatten({k: v for k, v in raw.items() if k != "description"}),
    )
    for rule in RULES if check else ():
        rule(sweep)
    sweep.space.update(lr_space(sweep.lr_scaling))
    return sweep


def lr_space(lr_scaling: Optional[LrScalingConfig]) -> Dict[str, Dict[str, Any]]:
    """lr_scaling's sampled keys (LR_KEYS) as space holds them, a preset as its number."""
    if lr_scaling is None:
        return {}
    return dict(zip(LR_KEYS, (_spec(lr_scaling.base_lr), _spec(_alpha(lr_scaling.alpha)))))
