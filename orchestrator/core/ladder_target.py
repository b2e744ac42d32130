"""The N of a ladder's model (its `model.params`, as the workload's costs count it) and the target a
ladder recommends for, read from the sweep file. In the core because both the sweep (which lays
the rungs out, studies/ladder_plan.py) and the report (which recommends for the target) read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from orchestrator.core import config as config_lib
from orchestrator.core import workload_paths, yaml_files
from orchestrator.core.errors import ConfigError
from orchestrator.core.sweep_schema import Sweep

MAX_RUNGS = 1000
"""The most rungs (model sizes x budgets) a ladder may have, in a sweep file or a table: published
ladders have tens; past this many the laid-out trials or the laws' fits run for minutes and the
ladder is a typo or hostile."""


def check_rung_count(count: int, key: str) -> None:
    """`count` rungs, at most MAX_RUNGS: else one line naming `key`."""
    if count > MAX_RUNGS:
        raise ConfigError(key, f"{count:,} rungs (model sizes x budgets); a ladder has at most {MAX_RUNGS:,}")


@dataclass(frozen=True)
class Target:
    """The run a ladder recommends for."""

    params: float
    """N, as model.params counts it."""
    tokens: float
    """D, its budget."""
    model: Optional[Dict[str, Any]] = None
    """The train-config keys of its model when the sweep file gave them; None: the recommended
    config keeps the largest rung's model, which the user replaces by one of N parameters."""


def model_params(sweep: Sweep, model: Dict[str, Any], key: str) -> int:
    """model.params of the base config with `model` set; `key` names the sweep file's entry."""
    cfg = config_lib.load(sweep.base_config, sweep.base_overrides + yaml_files.dotlist(model))
    n = workload_paths.compute_params(cfg)
    if not n:
        raise ConfigError(key, f"workload {cfg.model.name!r} states no costs(cfg), so its model.params is unknown")
    return n


def target(sweep: Optional[Sweep], params_of: Optional[Callable[[Dict[str, Any]], int]] = None) -> Optional[Target]:
    """The sweep file's ladder.target; None without one (or without its tokens). params_of: N of
    the target's model keys, when the base config's file is not where the sweep file says (the
    copy a sweep's parent run recorded names it relative to where the sweep ran)."""
    t = sweep.ladder.target if sweep is not None and sweep.ladder else None
    if t is None or t.tokens is None:
        return None
    if t.overrides:
        on_disk = sweep.base_config is not None and Path(sweep.base_config).is_file()
        n = params_of(t.overrides) if params_of and not on_disk else None
        n = n or model_params(sweep, t.overrides, "ladder.target.overrides")
        return Target(float(n), float(t.tokens), dict(t.overrides))
    return Target(float(t.params), float(t.tokens)) if t.params else None


def with_options(
    found: Optional[Target], params: Optional[float] = None, tokens: Optional[float] = None
) -> Optional[Target]:
    """The target with the command line's --target-params / --target-tokens over the sweep file's:
    a new N drops the file's model (it no longer has N parameters). Only one of the two, and no
    target in the file to complete it: ConfigError."""
    if params is None and tokens is None:
        return found
    for flag, value in (("--target-params", params), ("--target-tokens", tokens)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(flag, f"got {value}; valid: a finite number > 0")
    n = params if params is not None else (found.params if found else None)
    d = tokens if tokens is not None else (found.tokens if found else None)
    if n is None or d is None:
        missing = "--target-params" if n is None else "--target-tokens"
        raise ConfigError(missing, "missing: a ladder's target needs both N and D (or ladder.target in the sweep file)")
    model = found.model if found is not None and params is None else None
    return Target(float(n), float(d), model)
