"""What a sweep file holds (docs/sweeps.md): its sections as dataclasses, with a docstring
under every field, and the words its keys take. Reading and checking a file is sweep_file.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from orchestrator.formulas import batching

DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform", "randint")
ALGORITHMS = ("grid", "random", "optuna", "bracket")
OPTUNA_STORAGE_SCHEMES = ("sqlite", "postgresql", "mysql")  # SQLAlchemy dialects Optuna's RDBStorage takes
CRITERIA = ("final_loss", "stable_loss", "steps", "both")  # orchestrator/analysis/lr_bracket.py reads them
SCHEDULERS = ("none", "asha")
ALPHA_PRESETS = batching.ALPHA_WORDS
SHARE_KEYS = {"schedule.warmup_share": "schedule.warmup_tokens"}  # share of train.total_tokens
LR_KEYS = ("lr_scaling.base_lr", "lr_scaling.alpha")
TOP_KEYS = (
    "name",
    "description",
    "base",
    "space",
    "lr_scaling",
    "constraints",
    "infeasible",
    "search",
    "scheduler",
    "max_failures",
    "local_mode",
    "branch",
)


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
    criterion: str = "final_loss"
    """bracket: what an lr is scored by (mean over seeds): final_loss (the last eval_loss),
    stable_loss (the eval loss where the schedule's decay starts), steps (to search.target_loss,
    read as the report reads them), or both (final_loss and steps)."""
    target_loss: Optional[float] = None
    """bracket with criterion steps or both: the train loss whose steps-to-reach score an lr."""
    max_lrs_per_batch: int = 7
    """bracket: learning rates tried per batch size and group, the first round included."""
    lr_step: float = 2.0
    """bracket: the factor past the edge of the tried lrs (and the lr_scaling guess's spread)."""
    optuna_storage: Optional[str] = None
    """optuna: a database URL (sqlite:///optuna.db, postgresql://...) that keeps the study, named
    after the sweep and its MLflow parent run, so `optuna-dashboard URL` opens it; None: in memory."""


@dataclass
class SchedulerConfig:
    type: str = "none"
    """none or asha."""
    grace_period_tokens: int = 0
    """asha: the first rung, in tokens."""
    reduction_factor: int = 2
    """asha: rungs grow by this factor and keep the best 1 / factor of their group."""


TOLERANCE_KINDS = ("relative", "absolute")
COMPARES = ("reference", "every_smaller")
"""branch.tolerance_kind and branch.compare (orchestrator/analysis/branch_cbs.Tolerance)."""


@dataclass
class BranchConfig:
    """A branch study (docs/branches.md): short continuations of one
    base run from its checkpoints, at multiples of its batch size."""

    at_tokens: List[int] = field(default_factory=list)
    """The branch points: checkpoints of the base run (taken there if it trains here)."""
    factors: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    """Branch batch = factor x the base's tokens per update; 1 (the base's own continuation) is needed."""
    tokens: int = 0
    """Tokens each branch trains."""
    lr_scaling: Any = "sqrt"
    """The base's lr x factor^alpha: sqrt (0.5), linear (1), a number, 0 for none."""
    tolerance: float = 0.01
    """A branch batch is within the critical batch size while its end loss exceeds factor 1's by
    at most this: a share of that loss (tolerance_kind relative), or a loss difference (absolute)."""
    tolerance_kind: str = "relative"
    """relative (a share of the loss: the same number means the same on any task) or absolute
    (in loss units, as Merrill et al. 2025; independent of the irreducible loss)."""
    compare: str = "reference"
    """reference: each branch against the factor-1 branch; every_smaller (Merrill et al.'s rule):
    within the tolerance of every smaller branch."""
    from_run: Optional[str] = None
    """`from` in the file: an existing run (id or name) to branch from instead of training the base here."""
    compare_with: Optional[str] = None
    """A from-scratch sweep's name in the same store: `report` gives its B_crit at the base's loss
    at each branch point, beside the branched critical batch size."""


@dataclass
class Sweep:
    name: str
    path: Path
    raw: Dict[str, Any]
    base_config: Optional[Path]
    """The train config every trial starts from (relative to the sweep file); None only when read
    with check=False from a file that names none."""
    base_overrides: List[str]
    space: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    search: SearchConfig = field(default_factory=SearchConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    lr_scaling: Dict[str, Any] = field(default_factory=dict)
    constraints: List[Dict[str, Any]] = field(default_factory=list)
    infeasible: str = "error"
    max_failures: int = 1
    local_mode: bool = True
    """Single-worker trials run in Ray Train's local mode, in the Tune trial's own process."""
    text: str = ""
    """The file as written (submit scans it for the `${oc.env:NAME}` it needs)."""
    branch: Optional[BranchConfig] = None
