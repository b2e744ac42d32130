"""The sweep file: its typed schema and its one reader, used by `sweep`, `report` and `submit`
(pure: no Ray, no MLflow). Expanding it into trials is orchestrator.sweeps.search_space.

A sweep file (conf/sweep/*.yaml):

    name: demo
    base:
      config: ../train/tiny.yaml        # relative to the sweep file
      overrides: {train.total_tokens: 393216}
    space:                              # train-config keys with a distribution
      batch.tokens_per_update: {grid: [2048, 4096, 8192]}
      optim.lr: {loguniform: [1.0e-4, 3.0e-3]}
      schedule.warmup_share: {choice: [0.02, 0.1]}   # warmup as a share of the budget
    lr_scaling:                         # optional: optim.lr = base_lr x (B / reference_tokens)^alpha
      reference_tokens: 4096
      base_lr: {grid: [1.0e-3, 3.0e-3]} # swept or fixed
      alpha: sqrt                       # sqrt (0.5), linear (1), a number, or a distribution
    constraints:                        # joint constraints, no eval: KEY <= / >= factor x OF
      - {key: schedule.warmup_tokens, max: 0.1, of: train.total_tokens}
    infeasible: error                   # or skip: drop combinations with no exact S x b x D x A
    search: {algorithm: grid, num_samples: 1, max_concurrent: 2, seed: 0}
    # or {algorithm: bracket, criterion: final_loss, lr_step: 2.0, max_lrs_per_batch: 7}: the lr
    # found per batch size (and group of the other grid axes), from optim.lr's grid or lr_scaling
    scheduler: {type: asha, grace_period_tokens: 65536, reduction_factor: 2}

Distributions: grid (every value), choice, uniform [low, high], loguniform [low, high],
randint [low, high] (inclusive). Grid keys form a product; the other keys are drawn
`num_samples` times per grid point (seeded, so the list of trials is reproducible).
Every trial shares the base's `train.total_tokens`, so curves compare at equal tokens.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from orchestrator.core import config as config_lib
from orchestrator.core import validation, yaml_files
from orchestrator.core.errors import ConfigError
from orchestrator.core.sweep_schema import (
    ALGORITHMS,
    ALPHA_PRESETS,
    COMPARES,
    CRITERIA,
    DISTRIBUTIONS,
    OPTUNA_STORAGE_SCHEMES,
    SCHEDULERS,
    SHARE_KEYS,
    TOLERANCE_KINDS,
    TOP_KEYS,
    BranchConfig,
    SchedulerConfig,
    SearchConfig,
    Sweep,
)


def is_number(x: Any) -> bool:
    """A finite number (no NaN, no infinity anywhere in a sweep file)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


SEARCH_FIELDS = {
    "algorithm": validation.one_of(*ALGORITHMS),
    "num_samples": validation.count(),
    "max_concurrent": validation.count(),
    "seed": validation.count(0),
    "metric": validation.one_of("eval_loss", "loss"),  # what the trials report to Tune
    "seeds": validation.count(),
    "criterion": validation.one_of(*CRITERIA),
    "target_loss": validation.number(0, low_open=True, optional=True),
    "max_lrs_per_batch": validation.count(3),  # a lower, a best and a higher lr at least
    "lr_step": validation.number(1, low_open=True),
    "optuna_storage": validation.Field("str", optional=True, check=lambda k, v: _database_url(k, v)),
}


def _database_url(key: str, value: str) -> None:
    dialect = value.partition("://")[0].partition("+")[0].lower()
    if "://" not in value or dialect not in OPTUNA_STORAGE_SCHEMES:
        valid = ", ".join(f"{s}://" for s in OPTUNA_STORAGE_SCHEMES)
        raise ConfigError(key, f"got {value!r}; use a database URL ({valid}), e.g. sqlite:///optuna.db")


NAME_FIELD = validation.Field("str", check=validation.plain_name)
"""The sweep's `name` (default: the file's stem), a folder under train.storage_path/sweeps/ and reports/."""

BRANCH_FIELDS = {
    "at_tokens": validation.Field("list", check=validation.token_counts),
    "factors": validation.Field("list", check=validation.token_counts),
    "tokens": validation.count(),
    "lr_scaling": validation.LR_SCALING,
    "tolerance": validation.number(0, low_open=True),
    "tolerance_kind": validation.one_of(*TOLERANCE_KINDS),
    "compare": validation.one_of(*COMPARES),
    "from_run": validation.Field("str", optional=True),
    "compare_with": validation.Field("str", optional=True),
}
SCHEDULER_FIELDS = {
    "type": validation.one_of(*SCHEDULERS),
    "grace_period_tokens": validation.count(0),
    "reduction_factor": validation.count(2),
}
"""The rules of the typed sections, one per field (orchestrator/core/validation.py's Field)."""


def _distribution(key: str, spec: Any, numeric: bool = False) -> Dict[str, Any]:
    """Check one `{kind: args}` entry (a bare value means fixed). `numeric`: keys that only the
    sweep computes with (shares, lr scaling), so their values must be numbers."""
    if not isinstance(spec, dict) or len(spec) != 1:
        spec = {"grid": [spec]}
    ((kind, args),) = spec.items()
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"space.{key}", f"unknown distribution {kind!r}; valid: {', '.join(DISTRIBUTIONS)}")
    if kind in ("grid", "choice"):
        if not isinstance(args, list) or not args:
            raise ConfigError(f"space.{key}", f"{kind} needs a non-empty list of values, got {args!r}")
        if numeric and not all(is_number(a) for a in args):
            raise ConfigError(f"space.{key}", f"values must be numbers, got {args!r}")
    else:
        if not (isinstance(args, list) and len(args) == 2 and all(is_number(a) for a in args)):
            raise ConfigError(f"space.{key}", f"{kind} needs [low, high], got {args!r}")
        low, high = args
        if low > high:
            raise ConfigError(f"space.{key}", f"{kind} range has low {low} > high {high}")
        if kind == "loguniform" and low <= 0:
            raise ConfigError(f"space.{key}", f"loguniform needs low > 0, got {low}")
    return {kind: args}


def load(path: str | Path, check: bool = True) -> Sweep:
    """Read and check a sweep file; every error is a one-line ConfigError (exit 2).
    check=False only reads it (name, base config if named, base overrides as a dotlist, and the
    search section, checked): what `submit` and `report` need without the rest of the file
    having to be valid here."""
    path = Path(path)
    raw, text = yaml_files.read_mapping(path, "SWEEP", kind="sweep", shape="a mapping with name, base, space, ...")
    base = raw.get("base") if isinstance(raw.get("base"), dict) else {}
    overrides = yaml_files.dotlist(base.get("overrides") or {})
    name = str(raw.get("name") or path.stem)
    NAME_FIELD.validate("name", name)
    if not check:
        config = (path.parent / str(base["config"])).resolve() if base.get("config") else None
        search = _section(SearchConfig, raw.get("search"), "search", SEARCH_FIELDS)
        return Sweep(name, path, raw, config, overrides, search=search, text=text)
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(key, f"unknown sweep key; valid: {', '.join(TOP_KEYS)}")
    if not isinstance(raw.get("base") or {}, dict) or "config" not in base:
        raise ConfigError("base.config", "missing: the train config every trial starts from")
    if not isinstance(raw.get("space") or {}, dict):
        raise ConfigError(
            "space", "must be a mapping of train-config keys to distributions, e.g. optim.lr: {grid: [1e-3, 3e-3]}"
        )
    space = {k: _distribution(k, v, numeric=k in SHARE_KEYS) for k, v in (raw.get("space") or {}).items()}
    valid_keys = set(config_lib.schema_keys()) | set(SHARE_KEYS)
    for key in space:
        if key not in valid_keys:
            raise ConfigError(f"space.{key}", f"not a train-config key{config_lib.did_you_mean(key)}")
    search = _section(SearchConfig, raw.get("search"), "search", SEARCH_FIELDS)
    if search.seeds > 1 and search.algorithm == "optuna":
        raise ConfigError(
            "search.seeds",
            f"got {search.seeds}; replicates need search.algorithm grid, random or bracket "
            "(optuna proposes one configuration at a time)",
        )
    if search.optuna_storage and search.algorithm != "optuna":
        raise ConfigError("search.optuna_storage", f"only with search.algorithm: optuna (got {search.algorithm})")
    if search.seeds > 1 and "train.seed" in space:
        raise ConfigError("search.seeds", "train.seed is also in space; sweep seeds either way, not both")
    if search.algorithm == "grid" and any(next(iter(s)) != "grid" for s in space.values()):
        raise ConfigError("search.algorithm", "grid search needs every space key to be a grid; use random or optuna")
    scheduler = _section(SchedulerConfig, raw.get("scheduler"), "scheduler", SCHEDULER_FIELDS)
    if scheduler.type == "asha" and scheduler.grace_period_tokens <= 0:
        raise ConfigError("scheduler.grace_period_tokens", "ASHA needs a grace period in tokens > 0")
    if not isinstance(raw.get("lr_scaling") or {}, dict):
        raise ConfigError("lr_scaling", "must be a mapping: {reference_tokens: N, base_lr: ..., alpha: ...}")
    lr_scaling = dict(raw.get("lr_scaling") or {})
    if lr_scaling:
        if "optim.lr" in space:
            raise ConfigError("lr_scaling", "sweep either optim.lr or lr_scaling, not both")
        unknown = set(lr_scaling) - {"reference_tokens", "base_lr", "alpha"}
        if unknown or "base_lr" not in lr_scaling or "reference_tokens" not in lr_scaling:
            raise ConfigError(
                "lr_scaling", "needs reference_tokens and base_lr (and optional alpha: sqrt, linear or a number)"
            )
        if not is_number(lr_scaling["reference_tokens"]) or lr_scaling["reference_tokens"] <= 0:
            raise ConfigError(
                "lr_scaling.reference_tokens", f"got {lr_scaling['reference_tokens']!r}; valid: tokens per update > 0"
            )
        alpha = lr_scaling.get("alpha", "sqrt")
        lr_scaling["alpha"] = ALPHA_PRESETS.get(alpha, alpha) if isinstance(alpha, str) else alpha
        if isinstance(lr_scaling["alpha"], str):
            raise ConfigError(
                "lr_scaling.alpha", f"got {alpha!r}; valid presets: {', '.join(ALPHA_PRESETS)} or a number"
            )
        for key in ("base_lr", "alpha"):
            space[f"lr_scaling.{key}"] = _distribution(f"lr_scaling.{key}", lr_scaling[key], numeric=True)
        for alpha in next(iter(space["lr_scaling.alpha"].values())):  # each value, or a range's two ends
            validation.LR_SCALING.validate("lr_scaling.alpha", alpha)
    if search.algorithm == "bracket":
        _check_bracket(space, raw.get("lr_scaling"), search)
    constraints = raw.get("constraints") or []
    if not isinstance(constraints, list):
        raise ConfigError("constraints", "must be a list of {key: K, max|min: factor, of: OTHER_KEY}")
    for i, c in enumerate(constraints):
        _check_constraint(i, c, valid_keys)
    infeasible = raw.get("infeasible", "error")
    if infeasible not in ("error", "skip"):
        raise ConfigError("infeasible", f"got {infeasible!r}; valid: error, skip")
    local_mode = raw.get("local_mode", True)
    if not isinstance(local_mode, bool):
        raise ConfigError(
            "local_mode", f"got {local_mode!r}; valid: true (single-worker trials in the trial's process) or false"
        )
    max_failures = raw.get("max_failures", 1)
    if not isinstance(max_failures, int) or isinstance(max_failures, bool) or max_failures < 0:
        raise ConfigError(
            "max_failures", f"got {max_failures!r}; valid: an integer >= 0 (Tune retries of a failed trial)"
        )
    branch = _check_branch(raw, space, search, scheduler) if "branch" in raw else None
    return Sweep(
        name,
        path,
        raw,
        (path.parent / base["config"]).resolve(),
        overrides,
        space,
        search,
        scheduler,
        lr_scaling,
        constraints,
        infeasible,
        max_failures,
        local_mode,
        text,
        branch,
    )


def _check_branch(raw: Dict[str, Any], space, search: SearchConfig, scheduler: SchedulerConfig) -> BranchConfig:
    """The branch section; what a branch study cannot combine with. Its batch arithmetic (each
    factor's split, whole updates) is checked with the base config (branch_study.py)."""
    section = dict(raw["branch"]) if isinstance(raw["branch"], dict) else raw["branch"]
    if isinstance(section, dict) and "from" in section:
        section["from_run"] = section.pop("from")
    branch = _section(BranchConfig, section, "branch", BRANCH_FIELDS)
    if not branch.at_tokens:
        raise ConfigError("branch.at_tokens", "missing: the token counts to branch from, e.g. [65536, 131072]")
    if 1 not in branch.factors:
        raise ConfigError("branch.factors", f"got {branch.factors}; needs 1, the base's own continuation")
    if not branch.tokens:
        raise ConfigError("branch.tokens", "missing: the tokens each branch trains, e.g. 32768")
    if branch.tolerance_kind == "relative" and not branch.tolerance < 1:
        raise ConfigError(
            "branch.tolerance",
            f"got {branch.tolerance}; a relative tolerance is a share of the loss in (0, 1), e.g. 0.01 "
            "(branch.tolerance_kind: absolute takes a loss difference)",
        )
    if space:
        raise ConfigError("space", f"a branch study sweeps branch.factors at branch.at_tokens, not {', '.join(space)}")
    if search.algorithm != "grid" or scheduler.type != "none":
        raise ConfigError("branch", "a branch study runs every branch: search.algorithm grid, no scheduler")
    return branch


def _check_bracket(space: Dict[str, Dict[str, Any]], lr_scaling: Any, search: SearchConfig) -> None:
    """bracket: a grid of batch sizes, grids elsewhere (the groups), and fixed initial lrs."""
    batch = space.get("batch.tokens_per_update", {})
    if "grid" not in batch:
        raise ConfigError(
            "space.batch.tokens_per_update",
            f"got {batch or 'nothing'}; search.algorithm bracket finds the lr per batch size: "
            "valid: a grid, e.g. {grid: [2048, 4096]}",
        )
    lrs = space.get("optim.lr")
    if lrs is None and not lr_scaling:
        raise ConfigError(
            "space.optim.lr", "missing; search.algorithm bracket starts from {grid: [...]} here or from lr_scaling"
        )
    if lrs is not None and ("grid" not in lrs or not all(is_number(x) and x > 0 for x in lrs["grid"])):
        raise ConfigError(
            "space.optim.lr", f"got {lrs}; search.algorithm bracket starts from a grid of learning rates > 0"
        )
    for key in ("base_lr", "alpha") if lr_scaling else ():
        values = space[f"lr_scaling.{key}"].get("grid", [])
        if len(values) != 1 or (key == "base_lr" and not values[0] > 0):
            raise ConfigError(
                f"lr_scaling.{key}",
                f"got {lr_scaling.get(key, 'sqrt')!r}; search.algorithm bracket needs a fixed number"
                + (" > 0" if key == "base_lr" else "")
                + " (it brackets the lr around the rule's guess)",
            )
    for key, spec in space.items():
        if "grid" not in spec:
            raise ConfigError(f"space.{key}", f"got {spec}; search.algorithm bracket needs a grid (the groups)")
    if search.criterion in ("steps", "both") and search.target_loss is None:
        raise ConfigError(
            "search.target_loss",
            f"missing; search.criterion {search.criterion} scores an lr by its steps to this train loss "
            "(e.g. a loss every batch size reaches before its decay)",
        )
    first = len(set(lrs["grid"])) if lrs is not None else 3
    if search.max_lrs_per_batch < first:
        raise ConfigError(
            "search.max_lrs_per_batch",
            f"got {search.max_lrs_per_batch}; must be at least the {first} learning rates of the first round",
        )


def _section(cls, data: Any, name: str, rules: Dict[str, Any]):
    """A typed section of the sweep file: OmegaConf checks keys and value types, then each field
    its rule."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(name, f"must be a mapping with keys {', '.join(cls.__dataclass_fields__)}")
    for key, value in (data or {}).items():
        if key in rules and rules[key].kind == "int" and isinstance(value, (bool, float)):
            rules[key].validate(f"{name}.{key}", value)  # before OmegaConf reads 2.0 or true as a count
    try:
        section = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), data or {}))
        for key, rule in rules.items():
            rule.validate(f"{name}.{key}", getattr(section, key))
        return section
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or ""
        if isinstance(exc, ConfigKeyError):
            raise ConfigError(f"{name}.{key}", f"unknown key; valid: {', '.join(cls.__dataclass_fields__)}") from None
        raise ConfigError(f"{name}.{key}", str(exc).splitlines()[0]) from None


def _check_constraint(i: int, c: Any, valid_keys: set) -> None:
    where = f"constraints.{i}"
    if not isinstance(c, dict) or "key" not in c or len({"max", "min"} & set(c)) != 1:
        raise ConfigError(where, "a constraint is {key: K, max|min: factor, of: OTHER_KEY} (of is optional)")
    bound = c.get("max", c.get("min"))
    if not is_number(bound):
        raise ConfigError(
            f"{where}.{'max' if 'max' in c else 'min'}", f"got {bound!r}; valid: a number (the factor of `of`)"
        )
    for field_name in ("key", "of"):
        if field_name in c and c[field_name] not in valid_keys:
            raise ConfigError(
                f"{where}.{field_name}", f"unknown key {c[field_name]!r}{config_lib.did_you_mean(str(c[field_name]))}"
            )
