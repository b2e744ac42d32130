"""What every kind of study (studies/study.py) lays its trials out with: a trial's values resolved
to a validated train config (shares -> tokens, lr scaling rule -> lr, joint constraints), grid
points, draws and seed replicates, the feasible trials, and how early stopping groups them.
Pure: no Ray, no MLflow.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from orchestrator.core import config as config_lib
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config
from orchestrator.core.sweep_schema import LR_KEYS, SHARE_KEYS, Constraint, Sweep

Values = Dict[str, Any]
"""A trial's sampled values by the sweep file's dotted keys (`batch.tokens_per_update`, `optim.lr`,
a share such as `schedule.warmup_share`): what Tune's param space carries as "trial"."""


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
        """Short, config-revealing run name, e.g. `B=64Ki lr=3e-4 wu=2.5%` (the warmup as a share of
        the budget, to three digits)."""
        if self.cfg is None:
            return " ".join(f"{k}={v}" for k, v in self.overrides.items())
        c = self.cfg
        if "train.stop_at_tokens" in self.values:  # a branch: where it starts, at what batch
            last = c.batch.ramp[-1]
            parts = [f"at={_binary(last.from_tokens)}", f"B={_binary(last.tokens_per_update)}"]
            return " ".join(parts + ([f"seed={c.train.seed}"] if "train.seed" in self.values else []))
        parts = ["base"] if "train.checkpoint_at_tokens" in self.values else []  # a branch study's
        if "train.total_tokens" in self.values:  # a ladder's rung: its model's keys and its budget
            parts += [f"{k.rpartition('.')[2]}={v}" for k, v in self.values.items() if k.startswith("model.")]
            parts.append(f"D={_binary(c.train.total_tokens)}")
        batch = _binary(c.batch.tokens_per_update)
        if c.batch.ramp and len(c.batch.ramp) > 1:  # B=256>512@4Ki: each change, at its tokens
            batch = ">".join(
                [_binary(c.batch.ramp[0].tokens_per_update)]
                + [f"{_binary(s.tokens_per_update)}@{_binary(s.from_tokens)}" for s in c.batch.ramp[1:]]
            )
        parts += [f"B={batch}", f"lr={_short(c.optim.lr)}"]
        parts.append(f"wu={100 * c.schedule.warmup_tokens / c.train.total_tokens:.3g}%")  # 2.5%, not 2%
        if any(k.startswith("schedule.decay") for k in self.overrides):
            parts.append(c.schedule.decay)
        if "train.seed" in self.values:
            parts.append(f"seed={c.train.seed}")
        return " ".join(parts)


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


def draw(spec: Dict[str, Any], rng: np.random.Generator) -> Any:
    ((kind, args),) = spec.items()
    if kind == "choice":
        return args[int(rng.integers(len(args)))]
    if kind == "uniform":
        return float(rng.uniform(*args))
    if kind == "loguniform":
        return float(math.exp(rng.uniform(math.log(args[0]), math.log(args[1]))))
    return int(rng.integers(args[0], args[1] + 1))  # randint, inclusive


def _violated(c: Constraint, cfg: Config) -> Optional[str]:
    value = _get(cfg, c.key)
    other = _get(cfg, c.of) if c.of else 1
    factor = c.max if c.max is not None else c.min
    bound = factor * other
    ok = value <= bound if c.max is not None else value >= bound
    if ok:
        return None
    of = f" x {c.of}" if c.of else ""
    return f"{c.key}={value} {'>' if c.max is not None else '<'} {factor}{of} = {bound:g}"


def _get(cfg: Config, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = node[int(part)] if isinstance(node, list) else getattr(node, part)
    return node


def grid_points(space: Dict[str, Dict[str, Any]]) -> List[Values]:
    grid = {k: v["grid"] for k, v in space.items() if "grid" in v}
    return [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())] if grid else [{}]


def seed_values(sweep: Sweep, base: Optional[Config] = None) -> List[Dict[str, int]]:
    """The replicates' values: [{}] for one seed, else train.seed = base seed + 0 .. seeds - 1
    (`base`: unvalidated_base(sweep), when the caller holds it)."""
    if sweep.search.seeds == 1:
        return [{}]
    first = (base or unvalidated_base(sweep)).train.seed
    return [{"train.seed": first + i} for i in range(sweep.search.seeds)]


def unvalidated_base(sweep: Sweep) -> Config:
    """The base config trials are resolved against: the file with the sweep's overrides, not
    validated (each trial's own config is)."""
    return config_lib.load(sweep.base_config, sweep.base_overrides, validate_config=False)


def resolve(
    sweep: Sweep, values: Values, base: Optional[Config] = None, held: Optional[Dict[str, Any]] = None
) -> Trial:
    """Sampled values -> train-config overrides (shares -> tokens, scaling rule -> lr) -> config.
    `base`: unvalidated_base(sweep), when the caller holds it (it is read only): the base file is then
    parsed once per trial, for the trial's own config. `held`: overrides the study's kind sets
    under the sampled values (a ladder rung's warmup and optimizer constants)."""
    base = base or unvalidated_base(sweep)
    overrides = {**(held or {}), **{k: v for k, v in values.items() if k not in SHARE_KEYS and k not in LR_KEYS}}
    budget = values.get("train.total_tokens", base.train.total_tokens)
    for share_key, tokens_key in SHARE_KEYS.items():
        if share_key in values:
            overrides[tokens_key] = int(round(values[share_key] * budget))
    if sweep.lr_scaling and "optim.lr" not in values:  # (a bracket search proposes the lr itself)
        tokens = overrides.get("batch.tokens_per_update", base.batch.tokens_per_update)
        lr = values["lr_scaling.base_lr"] * (tokens / sweep.lr_scaling.reference_tokens) ** values["lr_scaling.alpha"]
        overrides["optim.lr"] = float(f"{lr:.6g}")
    trial = Trial(overrides, values=dict(values))
    try:
        trial.cfg = config_lib.load_variant(sweep.base_config, sweep.base_overrides, overrides)
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
        listing = "; ".join(f"[{t.name}] {t.problem}" for t in bad[:5]) + (
            f"; ... {len(bad) - 5} more" if len(bad) > 5 else ""
        )
        raise ConfigError(
            "space", f"{len(bad)} of {len(trials)} trials infeasible (set `infeasible: skip` to drop them): {listing}"
        )
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
      configuration loses a replicate to the luck of another seed;
    - the batch ramp, when swept: a ramped trial takes fewer steps than a fixed one at equal
      tokens, as a larger batch does."""
    keys = ("batch.tokens_per_update",) + tuple(k for k in (*SHAPE_KEYS, "batch.ramp") if k in sweep.space)
    return keys + (("train.seed",) if sweep.search.seeds > 1 else ())


def comparison_group(keys: Tuple[str, ...], values: Dict[str, Any]) -> Tuple[Any, ...]:
    """The group of a trial from its sampled values (keys the sweep does not vary are shared; a
    list value, a ramp, by its JSON text)."""
    return tuple(_hashable(values.get(k)) for k in keys)


def _hashable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


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
                f"scheduler.grace_period_tokens={sweep.scheduler.grace_period_tokens:,}, "
                "so ASHA compares trials at equal tokens",
            )
