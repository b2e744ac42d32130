"""The corners of a search space that `--dry-run` prices an Optuna sweep at: every combination of
the ends of the keys that change what a trial costs, the other keys at a middle value. The
cheapest and the dearest trial a sampler could propose lie among them."""

from __future__ import annotations

import itertools
import math
from typing import Any, Dict, List, Tuple

from orchestrator.core import sweep_file, sweep_schema
from orchestrator.core.errors import ConfigError
from orchestrator.studies import search_space

NO_COST_PREFIXES = ("optim.", "schedule.", "lr_scaling.", "gns.", "tracking.")
"""Space keys that change what a trial learns but not what it costs."""
NO_COST_KEYS = ("train.seed",)
COST_KEYS = ("gns.enabled",)
"""Exceptions to the prefixes: measuring the noise scale splits an update in two (derived.min_micro_batches)."""
MAX_CORNERS = 4096


def _changes_cost(key: str) -> bool:
    return key in COST_KEYS or (key not in NO_COST_KEYS and not key.startswith(NO_COST_PREFIXES))


def _corner_values(spec: Dict[str, Any]) -> List[Any]:
    """The ends of a numeric range or list; every value of a list of other things."""
    ((kind, args),) = spec.items()
    if kind in ("grid", "choice"):
        return sorted({min(args), max(args)}) if all(sweep_file.is_number(a) for a in args) else list(args)
    return sorted({args[0], args[1]})


def _middle(spec: Dict[str, Any]) -> Any:
    """A value for a key that does not change cost: the first listed, or the middle of a range."""
    ((kind, args),) = spec.items()
    if kind in ("grid", "choice"):
        return args[0]
    if kind == "loguniform":
        return math.sqrt(args[0] * args[1])
    middle = (args[0] + args[1]) / 2
    return int(round(middle)) if kind == "randint" else middle


def corners(sweep: sweep_schema.Sweep) -> Tuple[List[str], List[search_space.Trial]]:
    """(keys that change cost, the trials at every corner of them, feasible or not)."""
    keys = [k for k in sweep.space if _changes_cost(k)]
    fixed = {k: _middle(s) for k, s in sweep.space.items() if k not in keys}
    values = [_corner_values(sweep.space[k]) for k in keys]
    if math.prod(len(v) for v in values) > MAX_CORNERS:
        raise ConfigError("space", f"more than {MAX_CORNERS:,} corners of {', '.join(keys)}; no cost range")
    trials = [search_space.resolve(sweep, {**fixed, **dict(zip(keys, combo))}) for combo in itertools.product(*values)]
    return keys, trials
