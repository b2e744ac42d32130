"""What a sweep file holds (docs/sweeps.md): its keys as dataclasses, with a type, a default and a
docstring under every field, and the words its keys take. The rule of each key's values is a row
of sweep_file.FIELDS; reading and checking a file is sweep_file.load."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from orchestrator.core.table_reader import DERIVED, KEY
from orchestrator.formulas import batching

DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform", "randint")
ALGORITHMS = ("grid", "random", "optuna", "bracket")
OPTUNA_STORAGE_SCHEMES = ("sqlite", "postgresql", "mysql")  # SQLAlchemy dialects Optuna's RDBStorage takes
CRITERIA = ("final_loss", "stable_loss", "steps", "both")  # orchestrator/analysis/lr_bracket.py reads them
SCHEDULERS = ("none", "asha")
INFEASIBLE = ("error", "skip")
ALPHA_PRESETS = batching.ALPHA_WORDS
SHARE_KEYS = {"schedule.warmup_share": "schedule.warmup_tokens"}  # share of train.total_tokens
LR_KEYS = ("lr_scaling.base_lr", "lr_scaling.alpha")
TOLERANCE_KINDS = ("relative", "absolute")
COMPARES = ("reference", "every_smaller")
"""branch.tolerance_kind and branch.compare (orchestrator/analysis/branch_cbs.Tolerance)."""


@dataclass(frozen=True)
class Section:
    """A top-level section a kind of study adds to the sweep file (orchestrator/studies/study.py):
    its key, its dataclass (fields with defaults and docstrings, as the sections below) and one row
    per key, named as the file has it (`toy.lrs`), as sweep_file.FIELDS has them."""

    key: str
    schema: type
    rows: Mapping[str, Any]


@dataclass(frozen=True)
class BaseConfig:
    config: Optional[str] = None
    """The train config every trial starts from, as written: a path relative to the sweep file."""
    overrides: Any = None
    """Train-config keys every trial's base sets, {key: value} (or a list of key=value), as written."""


@dataclass(frozen=True)
class LrScalingConfig:
    """optim.lr = base_lr x (tokens per update / reference_tokens) ** alpha, instead of optim.lr in space."""

    reference_tokens: Optional[float] = None
    """The tokens per update at which the lr is base_lr."""
    base_lr: Any = None
    """A learning rate, or a distribution of them (swept)."""
    alpha: Any = "sqrt"
    """sqrt (0.5), linear (1), a number up to 2, or a distribution of numbers, as written."""


@dataclass(frozen=True)
class Constraint:
    """A joint constraint, checked on each trial's config: key <= max x of, or key >= min x of."""

    key: Optional[str] = None
    """The train-config key bounded."""
    max: Optional[float] = None
    """Upper bound, a factor of `of` (exactly one of max and min)."""
    min: Optional[float] = None
    """Lower bound, a factor of `of`."""
    of: Optional[str] = None
    """The train-config key the bound is a factor of; None: the bound is the number itself."""


@dataclass(frozen=True)
class SearchConfig:
    algorithm: str = "grid"
    """grid, random, optuna or bracket."""
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


@dataclass(frozen=True)
class SchedulerConfig:
    type: str = "none"
    """none or asha."""
    grace_period_tokens: int = 0
    """asha: the first rung, in tokens."""
    reduction_factor: int = 2
    """asha: rungs grow by this factor and keep the best 1 / factor of their group."""


@dataclass(frozen=True)
class BranchConfig:
    """A branch study (docs/branches.md): short continuations of one
    base run from its checkpoints, at multiples of its batch size."""

    at_tokens: List[int] = field(default_factory=list)
    """The branch points: checkpoints of the base run (taken there if it trains here)."""
    factors: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    """Branch batch = factor x the base's tokens per update; 1 (the base's own continuation) is needed."""
    tokens: int = 0
    """Tokens each branch trains (needed): whole updates of every branch batch and, under AdamW, at
    least 1 / (1 - beta2) updates of the largest (20 at beta2 0.95; docs/branches.md)."""
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
    from_run: Optional[str] = field(default=None, metadata={KEY: "from"})
    """`from` in the file: an existing run (id or name) to branch from instead of training the base here."""
    compare_with: Optional[str] = None
    """A from-scratch sweep's name in the same store: `report` gives its B_crit at the base's loss
    at each branch point, beside the branched critical batch size, and measures the fixed batches
    it trained to the study's budget in place of their predictions (docs/branches.md)."""


@dataclass(frozen=True)
class ReplayConfig:
    """A replay sweep (docs/sweeps.md, "Replaying recorded runs"): every trial serves a recorded
    run from tables instead of training, so a searcher can be judged on real runs at the cost of
    logging them."""

    tables: str = ""
    """A folder holding trials.csv and curves.csv (as `report --out` writes them), relative to the
    sweep file."""
    params: Optional[float] = None
    """The model size replayed (the tables' model.params), where they hold several."""


@dataclass(frozen=True)
class Rung:
    """One rung of a ladder given as it is: a model (overrides of the base) and its budget."""

    overrides: Any = None
    """Train-config keys of this rung's model, {key: value}."""
    total_tokens: int = 0
    """Its budget, train.total_tokens (needed)."""


@dataclass(frozen=True)
class LadderTarget:
    """The run a ladder recommends for: its model's size and its budget."""

    params: Optional[float] = None
    """N, the model's parameters as model.params counts them; or given by `overrides`."""
    tokens: Optional[float] = None
    """D, its budget in tokens (needed)."""
    overrides: Any = None
    """Train-config keys of the target's model, {key: value}: N is then its model.params, and the
    recommended config has this model (without it, the largest rung's model, which the user
    replaces)."""


@dataclass(frozen=True)
class LadderConfig:
    """A ladder of model sizes and budgets (docs/ladders.md): every rung a study over batch size and
    learning rate by the bracket search, all in one sweep; laws in N and D fitted across the rungs
    and extrapolated to `target`."""

    models: List[Dict[str, Any]] = field(default_factory=list)
    """Model sizes, each a mapping of train-config overrides of the base (e.g. {model.d_model: 64,
    model.n_layers: 2}); every one trains at every tokens_per_param."""
    tokens_per_param: List[float] = field(default_factory=list)
    """Budgets per model as tokens per model.params: vary the D/N ratio between rungs, or N and D
    cannot be told apart (arXiv 2605.08541)."""
    rungs: List[Rung] = field(default_factory=list)
    """Or the rungs one by one, instead of models x tokens_per_param."""
    target: LadderTarget = field(default_factory=LadderTarget)
    """What to recommend for (`report --target-params N --target-tokens D` overrides it)."""
    tolerance: float = 0.005
    """The share of the final loss traded for a larger batch: the recommendation at the target is the
    largest batch whose predicted penalty against the loss-optimal batch B* is within it (each rung's
    B_opt too; analysis/tradeoff.py, optimal_batch.py where no rung has a B*)."""
    hold: str = "tokens"
    """What every rung and batch size keeps of the base's optimizer: `tokens` (the default) turns
    AdamW's beta2 and weight decay, given per step, into their token forms at the base's batch
    size and budget (optim.beta2_half_life_tokens, optim.weight_decay_timescale_share), so the
    rungs differ in B and lr only (Marek et al. 2025, Bergsma et al. 2025: with per-step constants
    a larger batch averages over more tokens and decays weights more per token, which moves B_opt
    and lr_opt with the constants rather than with N and D); `steps` keeps the per-step values.
    The warmup is held as the base's share of the budget either way."""
    predict: bool = True
    """Place a rung's first round from what the finished rungs predict (its batch sizes around the
    predicted B_opt and B_crit, its lrs around the predicted lr); False: every rung from space."""


@dataclass
class Sweep:
    """A sweep file, read and checked by sweep_file.load: one field per top-level key (name ..
    branch), then what the reader derives. Not frozen: `studies.kinds.prepare` adds the
    command line's overrides to base_overrides."""

    name: str = ""
    """A folder under train.storage_path/sweeps/ and reports/, and the parent run's tag (default:
    the file's stem)."""
    description: Any = None
    """What the study is for, in words (prose: read as written, checked by no rule)."""
    base: BaseConfig = field(default_factory=BaseConfig)
    """The base config and its overrides, as written (base_config and base_overrides: as used)."""
    space: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    """The sampled keys, each {distribution: args} (a bare value in the file is a one-value grid):
    the file's space, then lr_scaling's base_lr and alpha (presets as numbers) when it is given."""
    lr_scaling: Optional[LrScalingConfig] = None
    """The lr as a rule in the batch size; None: optim.lr is the base's or swept in space."""
    constraints: List[Constraint] = field(default_factory=list)
    """Joint constraints; a trial that breaks one is infeasible."""
    infeasible: str = "error"
    """error: an infeasible trial (no exact S x b x D x A, a constraint) stops the sweep before it
    starts; skip: it is left out and listed."""
    search: SearchConfig = field(default_factory=SearchConfig)
    """How the space is searched, how many trials run at once, replicates over seeds."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Early stopping (within a batch size: studies.grouped_asha)."""
    max_failures: int = 1
    """Tune's retries of a failed trial, from its latest checkpoint."""
    local_mode: bool = True
    """Single-worker trials run in Ray Train's local mode, in the Tune trial's own process."""
    branch: Optional[BranchConfig] = None
    """A branch study instead of a space; None: a sweep from scratch."""
    ladder: Optional[LadderConfig] = None
    """A ladder of model sizes and budgets, each rung a bracket search over space; None: one study."""
    replay: Optional[ReplayConfig] = None
    """Serve every trial from recorded runs instead of training it; None: trials train."""
    loss_tolerance: float = 0.005
    """The share of the final loss the recommendation trades for a larger batch: it is the largest
    batch whose predicted penalty against the loss-optimal batch is within this (docs/critical-batch.md;
    a ladder's is ladder.tolerance, `report --loss-tolerance` overrides either)."""

    path: Path = field(default=Path(), metadata=DERIVED)
    """The file read."""
    base_config: Optional[Path] = field(default=None, metadata=DERIVED)
    """base.config resolved where the file is read (a trial's process runs in another folder);
    None only when read with check=False from a file that names none."""
    base_overrides: List[str] = field(default_factory=list, metadata=DERIVED)
    """base.overrides as key=value strings, then the command line's (prepare adds them)."""
    text: str = field(default="", metadata=DERIVED)
    """The file as written: the parent run's artifact, and what submit scans for the
    `${oc.env:NAME}` it needs."""
    sections: Dict[str, Any] = field(default_factory=dict, metadata=DERIVED)
    """The sections of study kinds registered beside the built-in ones (studies/kinds.register), by
    their key, each read into its kind's dataclass; {} for every built-in kind."""
    written: Dict[str, Any] = field(default_factory=dict, metadata=DERIVED)
    """Every key the file sets, by its dotted name, with its value as written (the description,
    prose, left out): the parent run's params `sweep.<key>`. Not the typed fields above, which
    read the file (a preset as its number, a bare value as a grid, `${oc.env:X}` resolved): the
    params record the study as its author wrote it, and never a secret a reference resolves to."""

    @property
    def named(self) -> bool:
        """Whether the file names the sweep (`name:`) rather than leaving it to the file's stem."""
        return bool(self.written.get("name"))
