"""What a sweep answers, as typed records: `sweep_analysis.analyse` returns an `Answer`, and
report.json (`Answer.to_json`), the tables and the Python API (reporting/sweep_tables.py) and the printed
answer (reporting/report_render.py) all read it. The rules behind every number are stated in
sweep_analysis.py's docstring. Pure: plain Python values, no numpy, no MLflow.

A record's JSON is its fields in their order (`Record.to_json`): so a field's name and place are
report.json's contract (docs/design.md 3), and a field added here is a key added there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, Optional, Tuple

from orchestrator.analysis.launch_choice import Recommendation


def _json(value: Any) -> Any:
    """A record as its JSON, tuples as lists, dicts copied; anything else as it is."""
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


class Record:
    """A frozen dataclass whose JSON is its fields in their order."""

    def to_json(self) -> Dict[str, Any]:
        return {f.name: _json(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]


# ---------------------------------------------------------------- per batch size


@dataclass(frozen=True)
class BestRow(Record):
    """The best configuration at one batch size by final loss (sweep_analysis.best_per_batch)."""

    batch: int
    """Tokens per update."""
    settings: Dict[str, Any]
    """Its value of every swept axis, the batch size and lr included: numbers and booleans typed
    (trials.param_value), anything else as the run logged it."""
    final_loss: float
    """Its mean final loss over its seeds (Answer.loss_metric)."""
    spread: Optional[float]
    """The standard deviation of its seeds' final losses; None with one seed."""
    seeds: int
    """How many seeds it ran (replicates of one configuration)."""
    lr: Optional[float]
    """The best lr: a quadratic in log lr through the best lr tried and its neighbours; None when
    the run logged none."""
    lr_edge: Optional[str]
    """lowest | highest (the best is at an edge of the lrs tried, so a bound), one-sided | not
    interpolated (no parabola through it), or None (an interior optimum)."""
    run_id: str
    """Its best seed's run."""
    run_name: str
    """That run's name."""
    configurations: int
    """How many configurations were scored at this batch size."""
    edges: Dict[str, str]
    """Numeric swept axes whose best value is the lowest or highest tried: key -> lowest | highest."""


@dataclass(frozen=True)
class BestLr(Record):
    """The one best lr the report names at a batch size, by the answer's lr_criterion."""

    batch: int
    """Tokens per update."""
    lr: Optional[float]
    """The best lr (interpolated); None when the runs logged none."""
    edge: Optional[str]
    """As BestRow.lr_edge."""


@dataclass(frozen=True)
class LrScaling(Record):
    """The power law lr_opt ~ coef x B^alpha through the best lrs that are interior."""

    coef: Optional[float]
    """The lr at B = 1 token; None when not fitted."""
    alpha: Optional[float]
    """The exponent; None when not fitted (`note` says why)."""
    points: int
    """The batch sizes with an interior best lr."""
    note: Optional[str]
    """Why there is no law (the lr not swept, too few interior best lrs); None when fitted."""


# ---------------------------------------------------------------- per target loss


@dataclass(frozen=True)
class Point(Record):
    """One batch size's fewest steps to a target: a point of the critical-batch fit, and a row of
    the report's cost table."""

    batch: int
    """Tokens per update."""
    steps: float
    """Optimizer steps from L_a to the target at the best lr (a parabola in the lr of 1 / S)."""
    tokens: float
    """steps x batch: tokens from L_a to the target."""
    tokens_to_target: float
    """Tokens from the run's start to the target, the mean over the chosen configuration's seeds."""
    lr: Optional[float]
    """The lr of fewest steps (interpolated); None when the runs logged none."""
    lr_edge: Optional[str]
    """As BestRow.lr_edge: lowest | highest make `steps` an upper bound."""
    seeds: int
    """The seeds of the chosen configuration, whose mean log steps the point is."""
    run_id: str
    """The chosen configuration's first seed's run."""
    run_name: str
    """That run's name."""
    wall_s: Optional[float]
    """Wall time to the target: the runs' share of their duration, the mean over seeds."""
    b_simple: Optional[float]
    """gns/b_simple where the seeds reach the target, their mean; None when not measured."""
    clipped: Optional[float]
    """The share of updates clipped before the target; None when train/clipped was not logged."""


@dataclass(frozen=True)
class LackOfFit(Record):
    """The F test of the fit's weighted residuals against the seeds' own spread."""

    p: Optional[float] = None
    """None without replicates or with two points (nothing to test)."""
    flagged: bool = False
    """p < steps_to_target.LACK_OF_FIT_P: the hyperbola describes the points poorly."""
    dof: Optional[int] = None
    """The seeds' degrees of freedom (pure error); None when the fit is unweighted."""


@dataclass(frozen=True)
class TargetFit(Record):
    """The critical batch size at one target loss: S = S_min (1 + B_crit / B) fitted to `points`.
    What a target has none of defaults to None (or empty)."""

    target_loss: float
    """The loss level the steps are counted to."""
    status: str
    """resolved | below (B_crit under the smallest batch size that reaches the target) | above (over
    the largest) | not resolved (fewer than steps_to_target.MIN_BATCH_SIZES reach it; `notes` say why)."""
    b_crit: Optional[float] = None
    """Tokens; only when resolved."""
    b_crit_bound: Optional[int] = None
    """below: B_crit is under it; above: over it; else None."""
    b_crit_fit: Optional[float] = None
    """The fit's B_crit whatever the status (None without two batch sizes)."""
    b_crit_interval: Optional[Tuple[float, float]] = None
    """The 90% seed bootstrap (resolved, with two or more seeds per configuration)."""
    s_min: Optional[float] = None
    """The fit's S_min: the fewest steps, at an infinite batch."""
    e_min: Optional[float] = None
    """The fit's E_min = S_min B_crit: the fewest tokens, at a batch of one token."""
    b_simple: Optional[float] = None
    """The measured noise scale where the points reach the target, the median over batch sizes."""
    lack_of_fit: LackOfFit = LackOfFit()
    """Whether the hyperbola describes the points (the F test)."""
    flags: Tuple[str, ...] = ()
    """For machines: lack_of_fit, lr_bound, lr_not_interpolated (diagnostics.flags)."""
    points: Tuple[Point, ...] = ()
    """One per batch size that reaches the target, smallest first."""
    missing: Tuple[int, ...] = ()
    """The batch sizes that do not reach it."""
    notes: Tuple[str, ...] = ()
    """For people: why it is not resolved, what makes it less trustworthy (diagnostics.notes)."""


@dataclass(frozen=True)
class Trend(Record):
    """How B_crit and B_simple move as the target loss falls (diagnostics.trend): slopes of their
    logs on log target loss, so negative slopes mean they rise as training goes on."""

    targets: Tuple[float, ...]
    """The resolved targets the slopes run over."""
    b_crit_slope: Optional[float]
    """None with fewer than two resolved targets (`note` says so)."""
    b_crit_slope_interval: Optional[Tuple[float, float]]
    """Its 90% bootstrap interval (with the seeds' bootstrap)."""
    b_simple_slope: Optional[float]
    """B_simple's slope over the same targets; None with fewer than two measured."""
    agree: Optional[bool]
    """False when the two move in opposite directions (B_crit's direction settled)."""
    note: Optional[str]
    """Why there is no trend, or why to distrust it; None otherwise."""


# ---------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class Counts(Record):
    """How the usable trials ended (Trial.outcome); final-loss comparisons use the finished ones."""

    finished: int
    """Ended FINISHED with the whole budget seen: the only ones final losses compare."""
    stopped: int
    """Stopped early by the scheduler (or killed)."""
    stopped_rungs: Dict[int, int]
    """Rung (tokens) -> how many the scheduler stopped there, by tokens."""
    failed: int
    """Ended FAILED (diverged, crashed)."""
    incomplete: int
    """Still running (or left RUNNING by a crash): neither counted nor compared."""

    def to_json(self) -> Dict[str, Any]:
        """report.json's four top-level counts."""
        return {
            "finished": self.finished,
            "stopped": {"count": self.stopped, "rungs": dict(self.stopped_rungs)},
            "failed": self.failed,
            "incomplete": self.incomplete,
        }


@dataclass(frozen=True)
class TrialRow(Record):
    """One usable trial as the report's table of all trials lists it."""

    run_id: str
    """Its MLflow run (or trials.csv row) id."""
    run_name: str
    """Its name."""
    status: str
    """As MLflow (or trials.csv) has it: FINISHED, KILLED, FAILED, RUNNING."""
    outcome: str
    """finished | stopped | failed | incomplete (Trial.outcome)."""
    batch: int
    """Tokens per update."""
    lr: Optional[float]
    """Its peak lr; None when not logged."""
    seed: Optional[str]
    """train.seed as logged (text)."""
    warmup_tokens: Optional[str]
    """schedule.warmup_tokens as logged (text)."""
    decay: Optional[str]
    """schedule.decay as logged (text)."""
    final_loss: Optional[float]
    """On Answer.loss_metric."""
    final_train: Optional[float]
    """The end of the monotone fit of its train/loss."""
    final_eval: Optional[float]
    """Its last eval/loss; None without one."""
    tokens: int
    """Tokens seen."""
    stopped_at: Optional[int]
    """The scheduler's rung (tokens) it was stopped at; None when not stopped."""
    wall_s: Optional[float]
    """Its wall time; None when unknown."""


@dataclass(frozen=True)
class ScheduleArm(Record):
    """One schedule a branch study can advise and what its branches predict of it at the budget
    (analysis/branch_schedule.py)."""

    name: str
    """`fixed <B>` or `suggested ramp`."""
    ramp: Tuple[Tuple[int, int], ...]
    """(from_tokens, tokens_per_update) from 0; one pair for a fixed batch."""
    updates: int
    excess: Optional[float]
    """Predicted final loss over the base fixed batch's, relative; None where nothing measured
    reaches (a factor past the largest branched, or a diverged branch on its way)."""
    excess_high: Optional[float]
    """The same with every gap at its upper 95 % bound (trained: 1.645 standard errors above)."""
    lr: Optional[float] = None
    """A trained arm's peak lr; None where the arm starts at the base's x k^alpha."""
    trained: bool = False
    """Measured, not predicted: a fixed batch of branch.compare_with's sweep trained to the budget
    (its best run there), its final eval loss over the base run's."""


@dataclass(frozen=True)
class ScheduleChoice(Record):
    """The schedule to train with: the arm with the fewest updates whose upper end is within the
    tolerance of the best fixed batch's prediction, or the best fixed batch itself."""

    arms: Tuple[ScheduleArm, ...]
    """The base first, then each branch factor as a fixed batch from the start (trained ones beside,
    or in place of, the prediction at their batch), by batch, then the ramp."""
    best_fixed: str
    """The fixed arm with the lowest predicted loss."""
    chosen: str
    chosen_ramp: Tuple[Tuple[int, int], ...]
    chosen_lr: Optional[float]
    """The peak lr the chosen schedule starts at (the base's x its first factor^alpha, or a trained
    arm's own); None when the base's lr is not known."""
    tolerance: float
    why: str
    """The choice in words: what it saves, or what the closest alternative would have cost."""

    @property
    def advice(self) -> str:
        """`ramp`, `fixed` (a fixed batch other than the base run's) or `base`."""
        if len(self.chosen_ramp) > 1:
            return "ramp"
        return "base" if self.chosen == self.arms[0].name else "fixed"


@dataclass(frozen=True)
class BranchStudy(Record):
    """The critical batch size along training from a branch study's runs (branch_analysis.study).
    Its points and power law are branch_cbs's and branch_ramp's records, as report.json holds them."""

    loss: str
    """What a branch's end loss is."""
    tolerance: float
    """branch.tolerance: how far a branch's end loss may exceed the batch it is compared with."""
    tolerance_kind: str
    """branch.tolerance_kind: relative (a share of that loss) | absolute (in loss)."""
    compare: str
    """branch.compare: reference (each batch against the factor-1 branch) | every_smaller."""
    rule: str
    """The rule in words ("within 1.00% of the factor-1 branch's")."""
    base_batch: int
    """The base run's tokens per update, the factor-1 branch's."""
    base_run: Optional[str]
    """The base run's name; None when the study branched from a run outside it (branch.from)."""
    points: Tuple[Dict[str, Any], ...]
    """Per branch point (branch_cbs.critical_batch_at): tokens, cbs, cbs_interval, status, ...; with
    branch.compare_with, b_crit_scratch."""
    fit: Optional[Dict[str, Any]]
    """The power law in tokens through the resolved points (branch_ramp.power_law_fit); None with
    fewer than two."""
    ramp: Tuple[Dict[str, int], ...]
    """The suggested batch.ramp: {from_tokens, tokens_per_update} steps."""
    lr_scaling: float
    """The branches' batch.ramp_lr_scaling (the lr x k^alpha)."""
    ramp_yaml: str
    """The ramp as YAML to paste into a train config."""
    ramp_override: str
    """The ramp as one command-line override."""
    ramp_overrides: Tuple[str, ...]
    """Every key of ramp_yaml as command-line overrides (batch.ramp, batch.ramp_lr_scaling)."""
    compared_with: Optional[str]
    """The from-scratch sweep of branch.compare_with, when named."""
    notes: Tuple[str, ...]
    """What makes the study less trustworthy (an eval set too small for the tolerance, ...)."""
    schedule_choice: Optional[ScheduleChoice] = None
    """The ramp against the fixed batches, each predicted from the branches' gaps, and the one to
    train with (branch_schedule.compare); None without the base run's curve."""

    @property
    def advice(self) -> str:
        """What the study advises training with: `ramp`, `fixed` (a fixed batch larger than the base)
        or `base`; without a comparison (no base run's curve), the ramp as measured."""
        if self.schedule_choice is None:
            return "ramp" if len(self.ramp) > 1 else "base"
        return self.schedule_choice.advice


@dataclass(frozen=True)
class Source(Record):
    """Where the trials were read from (report.json's `source`)."""

    uri: str
    """The MLflow store (its password redacted: report.json is shared) or the table folder."""
    run_id: Optional[str]
    """The sweep's parent run or the single run; None for tables."""
    kind: str
    """sweep | single | tables."""
    settings: Dict[str, str] = field(default_factory=dict)
    """Where each analysis setting came from: {lr_criterion | primary_target | branch_tolerance |
    target_losses: the command line | the sweep file (path) | the parent run's recorded sweep file
    | default}."""


@dataclass(frozen=True)
class Answer(Record):
    """The report's numbers (sweep_analysis.analyse)."""

    branch: Optional[BranchStudy]
    """A branch study's answer; None unless the trials hold branches."""
    loss_metric: str
    """What a final loss is: eval/loss when every finished trial has one, else train/loss."""
    axes: Tuple[str, ...]
    """The swept axes: config keys whose values differ between trials, the batch size first."""
    targets_chosen: bool
    """True when the analysis chose the target losses, False when they were given."""
    primary_target: Optional[float]
    """The loss the sweep named (search.target_loss), reported at and made the primary."""
    start_level: Optional[float]
    """L_a, where steps are counted from: the lowest loss any run had at the end of its warmup."""
    smoothing_tokens: float
    """The pre-smoothing window of the curves, in tokens (0: none; a sensitivity check)."""
    lr_criterion: str
    """What `best_lr` minimises: final_loss, or steps (to the primary target)."""
    counts: Counts
    """How the usable trials ended."""
    best_per_batch: Tuple[BestRow, ...]
    """Per batch size its best configuration by final loss, smallest batch first."""
    best_lr: Tuple[BestLr, ...]
    """Per batch size the one best lr the report names (by lr_criterion)."""
    lr_scaling: LrScaling
    """Through `best_lr`."""
    critical_batch: Tuple[TargetFit, ...]
    """One per target loss, lowest first."""
    primary: Optional[TargetFit]
    """The one of critical_batch the answer states: the named target, else the lowest resolved, else
    the first; None without targets."""
    trend: Trend
    """How B_crit moves across the resolved targets."""
    optimizer: Dict[str, Dict[str, int]]
    """How many runs gave beta2 and weight decay per step or in tokens: {beta2|weight_decay: {form: n}}."""
    trials: Tuple[TrialRow, ...]
    """Every usable trial (a batch size and a train/loss curve), in the order read."""
    skipped: Tuple[str, ...]
    """The names of the trials left out (no batch.tokens_per_update or no train/loss), a branch
    study's branches aside (read as branches: `branch`)."""
    recommendation: Optional[Recommendation] = None
    """What to run at the sweep's budget (analysis/launch_choice.py); None for a branch study or
    without final losses."""
    source: Optional[Source] = None
    """Where the trials were read from; None for an answer computed from trials in memory."""

    @property
    def best(self) -> Optional[BestRow]:
        """The best configuration of all: best_per_batch's lowest final loss."""
        return min(self.best_per_batch, key=lambda r: r.final_loss) if self.best_per_batch else None

    def lrs_by(self, criterion: str) -> Dict[int, BestLr]:
        """Batch size -> its one best interpolated lr by `criterion`: final_loss (best_per_batch's)
        or steps (the fewest steps to the primary target, its points'). Every text and figure that
        names a best lr reads it here, so one criterion names one lr per batch size."""
        if criterion == "final_loss":
            return {r.batch: BestLr(r.batch, r.lr, r.lr_edge) for r in self.best_per_batch}
        if criterion == "steps":
            return {p.batch: BestLr(p.batch, p.lr, p.lr_edge) for p in (self.primary.points if self.primary else ())}
        raise ValueError(f"criterion {criterion!r}: final_loss or steps")

    def to_json(self) -> Dict[str, Any]:
        """report.json's keys (docs/design.md 3) but `name`, in report.json's order; `source` only
        when known."""
        best = self.best
        out = {
            "branch": self.branch.to_json() if self.branch else None,
            "branch_cbs": list(self.branch.points) if self.branch else [],
            "branch_fit": self.branch.fit if self.branch else None,
            "loss_metric": self.loss_metric,
            "axes": list(self.axes),
            "targets_chosen": self.targets_chosen,
            "primary_target": self.primary_target,
            "start_level": self.start_level,
            "smoothing_tokens": self.smoothing_tokens,
            "lr_criterion": self.lr_criterion,
            **self.counts.to_json(),
            "best": best.to_json() if best else None,
            "best_per_batch": [r.to_json() for r in self.best_per_batch],
            "best_lr": [r.to_json() for r in self.best_lr],
            "lr_scaling": self.lr_scaling.to_json(),
            "critical_batch": [f.to_json() for f in self.critical_batch],
            "primary": self.primary.to_json() if self.primary else None,
            "trend": self.trend.to_json(),
            "optimizer": {name: dict(forms) for name, forms in self.optimizer.items()},
            "trials": [t.to_json() for t in self.trials],
            "skipped": list(self.skipped),
            "recommendation": self.recommendation.to_json() if self.recommendation else None,
        }
        return {**out, "source": self.source.to_json()} if self.source else out
