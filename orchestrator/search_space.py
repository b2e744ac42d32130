"""Sweep files -> the list of trials to run (pure: no Ray, no MLflow).

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
    scheduler: {type: asha, grace_period_tokens: 65536, reduction_factor: 2}

Distributions: grid (every value), choice, uniform [low, high], loguniform [low, high],
randint [low, high] (inclusive). Grid keys form a product; the other keys are drawn
`num_samples` times per grid point (seeded, so the list of trials is reproducible).
Every trial shares the base's `train.total_tokens`, so curves compare at equal tokens.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from orchestrator import config as config_lib
from orchestrator.config import Config
from orchestrator.errors import ConfigError

DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform", "randint")
ALGORITHMS = ("grid", "random", "optuna")
SCHEDULERS = ("none", "asha")
ALPHA_PRESETS = {"sqrt": 0.5, "linear": 1.0}
SHARE_KEYS = {"schedule.warmup_share": "schedule.warmup_tokens"}  # share of train.total_tokens
LR_KEYS = ("lr_scaling.base_lr", "lr_scaling.alpha")
TOP_KEYS = ("name", "description", "base", "space", "lr_scaling", "constraints", "infeasible", "search", "scheduler", "max_failures",
            "local_mode")


@dataclass
class SearchConfig:
    algorithm: str = "grid"
    """grid, random or optuna."""
    num_samples: int = 1
    """random/optuna: configurations drawn (per grid point for random)."""
    max_concurrent: int = 2
    """Trials running at once."""
    seed: int = 0
    """Seed of the random draws (not of training)."""
    metric: str = "eval_loss"
    """What schedulers and Optuna minimise."""
    seeds: int = 1
    """Replicates: every configuration runs with train.seed = base seed + 0 .. seeds - 1 (model
    init and data order). Two or more give the critical batch size an interval."""


@dataclass
class SchedulerConfig:
    type: str = "none"
    """none or asha."""
    grace_period_tokens: int = 0
    """asha: the first rung, in tokens."""
    reduction_factor: int = 2
    """asha: rungs grow by this factor and keep the best 1 / factor of their group."""


@dataclass
class Trial:
    overrides: Dict[str, Any]
    """Dotlist overrides of the base config, incl. derived keys (warmup_tokens, lr)."""
    cfg: Optional[Config] = None
    """The validated config; None when infeasible."""
    problem: str = ""
    """Why it is infeasible."""
    values: Dict[str, Any] = field(default_factory=dict)
    """The sampled values as the sweep file names them (what Tune's param space carries)."""

    @property
    def name(self) -> str:
        """Short, config-revealing run name, e.g. `B=64Ki lr=3e-4 wu=2%`."""
        if self.cfg is None:
            return " ".join(f"{k}={v}" for k, v in self.overrides.items())
        c = self.cfg
        parts = [f"B={_binary(c.batch.tokens_per_update)}", f"lr={_short(c.optim.lr)}"]
        parts.append(f"wu={100 * c.schedule.warmup_tokens / c.train.total_tokens:.0f}%")
        if any(k.startswith("schedule.decay") for k in self.overrides):
            parts.append(c.schedule.decay)
        if "train.seed" in self.values:
            parts.append(f"seed={c.train.seed}")
        return " ".join(parts)


@dataclass
class Sweep:
    name: str
    path: Path
    raw: Dict[str, Any]
    base_config: Path
    base_overrides: List[str]
    space: Dict[str, Dict[str, Any]]
    search: SearchConfig
    scheduler: SchedulerConfig
    lr_scaling: Dict[str, Any] = field(default_factory=dict)
    constraints: List[Dict[str, Any]] = field(default_factory=list)
    infeasible: str = "error"
    max_failures: int = 1
    local_mode: bool = True
    """Single-worker trials run in Ray Train's local mode, in the Tune trial's own process."""


def _binary(n: int) -> str:
    for unit, size in (("Mi", 2**20), ("Ki", 2**10)):
        if n >= size and n % (size // 16) == 0:
            value = n / size
            return f"{value:g}{unit}"
    return str(n)


def _short(x: float) -> str:
    """3e-4 style: 0.0003 -> 3e-4, 0.00087 -> 8.7e-4, 0.01 -> 1e-2."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}" if x else "0"


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _distribution(key: str, spec: Any, numeric: bool = False) -> Dict[str, Any]:
    """Check one `{kind: args}` entry (a bare value means fixed). `numeric`: keys that only the
    sweep computes with (shares, lr scaling), so their values must be numbers."""
    if not isinstance(spec, dict) or len(spec) != 1:
        spec = {"grid": [spec]}
    (kind, args), = spec.items()
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"space.{key}", f"unknown distribution {kind!r}; valid: {', '.join(DISTRIBUTIONS)}")
    if kind in ("grid", "choice"):
        if not isinstance(args, list) or not args:
            raise ConfigError(f"space.{key}", f"{kind} needs a non-empty list of values, got {args!r}")
        if numeric and not all(_is_number(a) for a in args):
            raise ConfigError(f"space.{key}", f"values must be numbers, got {args!r}")
    else:
        if not (isinstance(args, list) and len(args) == 2 and all(_is_number(a) for a in args)):
            raise ConfigError(f"space.{key}", f"{kind} needs [low, high], got {args!r}")
        low, high = args
        if low > high:
            raise ConfigError(f"space.{key}", f"{kind} range has low {low} > high {high}")
        if kind == "loguniform" and low <= 0:
            raise ConfigError(f"space.{key}", f"loguniform needs low > 0, got {low}")
    return {kind: args}


def _draw(spec: Dict[str, Any], rng: np.random.Generator) -> Any:
    (kind, args), = spec.items()
    if kind == "choice":
        return args[int(rng.integers(len(args)))]
    if kind == "uniform":
        return float(rng.uniform(*args))
    if kind == "loguniform":
        return float(math.exp(rng.uniform(math.log(args[0]), math.log(args[1]))))
    return int(rng.integers(args[0], args[1] + 1))  # randint, inclusive


def load(path: str | Path) -> Sweep:
    """Read and check a sweep file; every error is a one-line ConfigError (exit 2)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("SWEEP", f"sweep file {str(path)!r} not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError("SWEEP", f"YAML syntax error in {path}" + (f" at line {mark.line + 1}" if mark else "")) from None
    if not isinstance(raw, dict):
        raise ConfigError("SWEEP", f"{path} must be a mapping with name, base, space, ...")
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(key, f"unknown sweep key; valid: {', '.join(TOP_KEYS)}")
    base = raw.get("base") or {}
    if not isinstance(base, dict) or "config" not in base:
        raise ConfigError("base.config", "missing: the train config every trial starts from")
    overrides = base.get("overrides") or {}
    if isinstance(overrides, dict):
        overrides = [f"{k}={_dotlist_value(v)}" for k, v in overrides.items()]
    if not isinstance(raw.get("space") or {}, dict):
        raise ConfigError("space", "must be a mapping of train-config keys to distributions, e.g. optim.lr: {grid: [1e-3, 3e-3]}")
    space = {k: _distribution(k, v, numeric=k in SHARE_KEYS) for k, v in (raw.get("space") or {}).items()}
    valid_keys = set(config_lib.schema_keys()) | set(SHARE_KEYS)
    for key in space:
        if key not in valid_keys:
            raise ConfigError(f"space.{key}", f"not a train-config key{config_lib._did_you_mean(key)}")
    search = _section(SearchConfig, raw.get("search"), "search")
    if search.algorithm not in ALGORITHMS:
        raise ConfigError("search.algorithm", f"got {search.algorithm!r}; valid: {', '.join(ALGORITHMS)}")
    if search.num_samples < 1 or search.max_concurrent < 1:
        raise ConfigError("search", "num_samples and max_concurrent must be >= 1")
    if search.seeds < 1:
        raise ConfigError("search.seeds", f"got {search.seeds}; valid: 1 (no replicates) or more")
    if search.seeds > 1 and search.algorithm == "optuna":
        raise ConfigError("search.seeds", f"got {search.seeds}; replicates need search.algorithm grid or random "
                          "(optuna proposes one configuration at a time)")
    if search.seeds > 1 and "train.seed" in space:
        raise ConfigError("search.seeds", "train.seed is also in space; sweep seeds either way, not both")
    if search.algorithm == "grid" and any(next(iter(s)) != "grid" for s in space.values()):
        raise ConfigError("search.algorithm", "grid search needs every space key to be a grid; use random or optuna")
    scheduler = _section(SchedulerConfig, raw.get("scheduler"), "scheduler")
    if scheduler.type not in SCHEDULERS:
        raise ConfigError("scheduler.type", f"got {scheduler.type!r}; valid: {', '.join(SCHEDULERS)}")
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
            raise ConfigError("lr_scaling", "needs reference_tokens and base_lr (and optional alpha: sqrt, linear or a number)")
        if not _is_number(lr_scaling["reference_tokens"]) or lr_scaling["reference_tokens"] <= 0:
            raise ConfigError("lr_scaling.reference_tokens", f"got {lr_scaling['reference_tokens']!r}; valid: tokens per update > 0")
        alpha = lr_scaling.get("alpha", "sqrt")
        lr_scaling["alpha"] = ALPHA_PRESETS.get(alpha, alpha) if isinstance(alpha, str) else alpha
        if isinstance(lr_scaling["alpha"], str):
            raise ConfigError("lr_scaling.alpha", f"got {alpha!r}; valid presets: {', '.join(ALPHA_PRESETS)} or a number")
        for key in ("base_lr", "alpha"):
            space[f"lr_scaling.{key}"] = _distribution(f"lr_scaling.{key}", lr_scaling[key], numeric=True)
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
        raise ConfigError("local_mode", f"got {local_mode!r}; valid: true (single-worker trials in the trial's process) or false")
    max_failures = raw.get("max_failures", 1)
    if not isinstance(max_failures, int) or isinstance(max_failures, bool) or max_failures < 0:
        raise ConfigError("max_failures", f"got {max_failures!r}; valid: an integer >= 0 (Tune retries of a failed trial)")
    name = str(raw.get("name") or path.stem)
    return Sweep(name, path, raw, (path.parent / base["config"]).resolve(), list(overrides), space, search, scheduler,
                 lr_scaling, constraints, infeasible, max_failures, local_mode)


def _dotlist_value(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip() if isinstance(value, (list, dict)) else str(value)


def _section(cls, data: Any, name: str):
    """A typed section of the sweep file (OmegaConf checks keys and value types)."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(name, f"must be a mapping with keys {', '.join(cls.__dataclass_fields__)}")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), data or {}))
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
    if not _is_number(bound):
        raise ConfigError(f"{where}.{'max' if 'max' in c else 'min'}", f"got {bound!r}; valid: a number (the factor of `of`)")
    for field_name in ("key", "of"):
        if field_name in c and c[field_name] not in valid_keys:
            raise ConfigError(f"{where}.{field_name}", f"unknown key {c[field_name]!r}{config_lib._did_you_mean(str(c[field_name]))}")


def _violated(constraint: Dict[str, Any], cfg: Config) -> Optional[str]:
    value = _get(cfg, constraint["key"])
    other = _get(cfg, constraint["of"]) if "of" in constraint else 1
    bound_kind = "max" if "max" in constraint else "min"
    bound = constraint[bound_kind] * other
    ok = value <= bound if bound_kind == "max" else value >= bound
    if ok:
        return None
    of = f" x {constraint['of']}" if "of" in constraint else ""
    return f"{constraint['key']}={value} {'>' if bound_kind == 'max' else '<'} {constraint[bound_kind]}{of} = {bound:g}"


def _get(cfg: Config, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = node[int(part)] if isinstance(node, list) else getattr(node, part)
    return node


def _grid_points(space: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    grid = {k: v["grid"] for k, v in space.items() if "grid" in v}
    return [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())] if grid else [{}]


def expand(sweep: Sweep) -> List[Trial]:
    """Every trial of a grid or random sweep, in a reproducible order, validated."""
    rng = np.random.default_rng(sweep.search.seed)
    sampled = {k: v for k, v in sweep.space.items() if "grid" not in v}
    values = []
    for point in _grid_points(sweep.space):
        for _ in range(sweep.search.num_samples if sampled or sweep.search.algorithm != "grid" else 1):
            values.append({**point, **{k: _draw(spec, rng) for k, spec in sampled.items()}})
    if sweep.search.seeds > 1:  # replicates of every configuration, side by side
        first = config_lib.load(sweep.base_config, sweep.base_overrides, validate_config=False).train.seed
        values = [{**v, "train.seed": first + i} for v in values for i in range(sweep.search.seeds)]
    return [resolve(sweep, v) for v in values]


def resolve(sweep: Sweep, values: Dict[str, Any]) -> Trial:
    """Sampled values -> train-config overrides (shares -> tokens, scaling rule -> lr) -> config."""
    base = config_lib.load(sweep.base_config, sweep.base_overrides, validate_config=False)
    overrides = {k: v for k, v in values.items() if k not in SHARE_KEYS and k not in LR_KEYS}
    for share_key, tokens_key in SHARE_KEYS.items():
        if share_key in values:
            overrides[tokens_key] = int(round(values[share_key] * base.train.total_tokens))
    if sweep.lr_scaling:
        tokens = overrides.get("batch.tokens_per_update", base.batch.tokens_per_update)
        lr = values["lr_scaling.base_lr"] * (tokens / sweep.lr_scaling["reference_tokens"]) ** values["lr_scaling.alpha"]
        overrides["optim.lr"] = float(f"{lr:.6g}")
    trial = Trial(overrides, values=dict(values))
    try:
        trial.cfg = config_lib.load(sweep.base_config, sweep.base_overrides + [f"{k}={_dotlist_value(v)}" for k, v in overrides.items()])
    except ConfigError as exc:
        trial.problem = str(exc)
        return trial
    for c in sweep.constraints:
        problem = _violated(c, trial.cfg)
        if problem:
            trial.cfg, trial.problem = None, f"constraint {problem}"
            break
    return trial


def split_feasible(sweep: Sweep, trials: List[Trial]) -> Tuple[List[Trial], List[Trial]]:
    """(feasible, infeasible); raises unless the sweep says to skip infeasible ones."""
    good = [t for t in trials if t.cfg is not None]
    bad = [t for t in trials if t.cfg is None]
    if bad and sweep.infeasible == "error":
        listing = "; ".join(f"[{t.name}] {t.problem}" for t in bad[:5]) + (f"; ... {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ConfigError("space", f"{len(bad)} of {len(trials)} trials infeasible (set `infeasible: skip` to drop them): {listing}")
    if not good:
        raise ConfigError("space", "no feasible trial left")
    return good, bad


SHAPE_KEYS = ("schedule.decay", "schedule.wsd_decay_share", "schedule.min_lr_ratio")
"""Keys that change the shape of the LR schedule after warmup."""


def comparison_keys(sweep: Sweep) -> Tuple[str, ...]:
    """The sampled values two trials must share for early stopping to compare them:
    - the batch size: at equal tokens a larger batch has taken fewer steps and is expected to be
      behind early even when it ends best, so a rung shared across batch sizes would cull exactly
      the large-batch trials that pin down the critical batch size;
    - the decay shape, when swept: mid-run a cosine schedule is ahead of a stable-then-decay one
      that ends better;
    - the seed, when replicated: trials on the same data order and init compare pairwise, and no
      configuration loses a replicate to the luck of another seed."""
    keys = ("batch.tokens_per_update",) + tuple(k for k in SHAPE_KEYS if k in sweep.space)
    return keys + (("train.seed",) if sweep.search.seeds > 1 else ())


def comparison_group(keys: Tuple[str, ...], values: Dict[str, Any]) -> Tuple[Any, ...]:
    """The group of a trial from its sampled values (keys the sweep does not vary are shared)."""
    return tuple(values.get(k) for k in keys)


def lone_groups(sweep: Sweep, trials: List[Trial]) -> List[Trial]:
    """Trials that no other trial of the sweep can be compared with: early stopping never stops them."""
    keys = comparison_keys(sweep)
    groups: Dict[Tuple[Any, ...], List[Trial]] = {}
    for t in trials:
        groups.setdefault(comparison_group(keys, t.values), []).append(t)
    return [g[0] for g in groups.values() if len(g) == 1]


def check_asha_alignment(sweep: Sweep, trials: List[Trial]) -> None:
    """ASHA compares trials at equal tokens only if every trial reports at the same token counts."""
    if sweep.scheduler.type != "asha":
        return
    for t in trials:
        c = t.cfg
        every = c.train.eval_every_tokens
        if every % c.batch.tokens_per_update or sweep.scheduler.grace_period_tokens % every:
            raise ConfigError(
                "train.eval_every_tokens",
                f"{every:,} must be a multiple of every trial's batch.tokens_per_update (trial {t.name}) and divide "
                f"scheduler.grace_period_tokens={sweep.scheduler.grace_period_tokens:,}, so ASHA compares trials at equal tokens")
