"""Reading a sweep file (docs/sweeps.md): `load`, its one reader, used by `sweep`, `report` and
`submit` (`sweep` and `submit` through orchestrator/studies/kinds.load, which adds the sections of
registered kinds of study and the rules of the file's own kind). FIELDS holds one row per key of
the file, the values it takes and the error a bad one gets, as validation.FIELDS does for the
train config; RULES, the checks that span keys and hold for every kind of study, run once every key
has passed its row. The keys themselves, with their types, defaults and docstrings, are
orchestrator/core/sweep_schema.py, and orchestrator/core/table_reader.py reads a file by the two.
Pure: no Ray, no MLflow. The trials a sweep plans are its kind's (orchestrator/studies/).

Distributions (space, lr_scaling.base_lr and lr_scaling.alpha): grid (every value), choice,
uniform [low, high], loguniform [low, high], randint [low, high] (inclusive); a bare value is a
one-value grid. Grid keys form a product; the other keys are drawn `num_samples` times per grid
point (seeded, so the list of trials is reproducible). Every trial shares the base's
`train.total_tokens`, so curves compare at equal tokens; a `ladder` gives each rung its own.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

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
    Section,
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
    "replay.tables": Field("str"),
    "replay.params": number(0, low_open=True, optional=True),
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


def _seeds_one_way(s: Sweep) -> None:
    if s.search.seeds > 1 and "train.seed" in s.space:
        raise ConfigError("search.seeds", "train.seed is also in space; sweep seeds either way, not both")


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


def _one_bound_per_constraint(s: Sweep) -> None:
    for i, c in enumerate(s.constraints):
        if c.key is None or (c.max is None) == (c.min is None):
            raise ConfigError(
                f"constraints.{i}", "a constraint is {key: K, max|min: factor, of: OTHER_KEY} (of is optional)"
            )


RULES = (
    _base_names_a_config,
    _seeds_one_way,
    _asha_grace_period,
    _lr_swept_or_scaled,
    _lr_scaling_complete,
    _one_bound_per_constraint,
)
"""The checks that span keys and hold for every kind of study, in the order they run, after every
key has passed its row; then the rules of the sweep's kind (orchestrator/studies/: its module's
RULES). A branch study's batch arithmetic (each factor's split, whole updates) needs the base
config: its kind checks it when it lays out the trials."""

Rule = Callable[[Sweep], None]

READ_UNCHECKED = ("name", "base", "search", "branch", "ladder", "loss_tolerance")
"""What `load(check=False)` reads (by their rows, no RULES): what `submit` and `report` need of a
file whose other keys need not be valid there."""


# ---------------------------------------------------------------- the reader


def load(
    path: str | Path,
    check: bool = True,
    sections: Mapping[str, Section] = {},
    kind_rules: Optional[Callable[[Sweep], Sequence[Rule]]] = None,
) -> Sweep:
    """Read and check a sweep file: every key by its row of FIELDS, then RULES, then
    `kind_rules(sweep)` (the rules of the study kind the file asks for); every error is a one-line
    ConfigError (exit 2). `sections`: the sections registered kinds add, by key. check=False reads
    only READ_UNCHECKED, checks no rule and leaves base_config None when the file names none."""
    path = Path(path)
    raw, text = yaml_files.read_mapping(path, "SWEEP", kind="sweep", shape=SHAPE)
    return _read(raw, text, path, check, sections, kind_rules)


def read_recorded(text: str, path: Path) -> Sweep:
    """A sweep file as its parent run recorded it (the artifact `path.name`), read as load(check=False)
    reads it: what `report` needs to answer as the file would have it."""
    return _read(yaml_files.parse_mapping(text, path, "SWEEP", SHAPE), text, path, check=False)


SHAPE = "a mapping with name, base, space, ..."


def _read(
    raw: Dict[str, Any],
    text: str,
    path: Path,
    check: bool,
    sections: Mapping[str, Section] = {},
    kind_rules: Optional[Callable[[Sweep], Sequence[Rule]]] = None,
) -> Sweep:
    named = {**raw, "name": path.stem if raw.get("name") is None else raw["name"]}  # the stem too names a folder
    own = {key: named.pop(key) for key in sections if key in named}
    read = table_reader.read(Sweep, named, FIELDS, only=None if check else READ_UNCHECKED)
    base = read.get("base") or BaseConfig()
    read["space"] = {k: _spec(v) for k, v in (read.get("space") or {}).items()}
    sweep = Sweep(
        **read,
        path=path,
        base_config=(path.parent / base.config).resolve() if base.config else None,
        base_overrides=yaml_files.dotlist(base.overrides or {}),
        sections={key: _section(sections[key], value) for key, value in own.items()},
        text=text,
        written=config_lib.flatten({k: v for k, v in raw.items() if k != "description"}),
    )
    if check:
        for rule in RULES + tuple(kind_rules(sweep) if kind_rules else ()):
            rule(sweep)
    sweep.space.update(lr_space(sweep.lr_scaling))
    return sweep


def _section(section: Section, value: Any) -> Any:
    """A registered kind's section, read by its own rows."""
    return section.schema(**table_reader.read(section.schema, value, section.rows, prefix=section.key + "."))


def lr_space(lr_scaling: Optional[LrScalingConfig]) -> Dict[str, Dict[str, Any]]:
    """lr_scaling's sampled keys (LR_KEYS) as space holds them, a preset as its number."""
    if lr_scaling is None:
        return {}
    return dict(zip(LR_KEYS, (_spec(lr_scaling.base_lr), _spec(_alpha(lr_scaling.alpha)))))
