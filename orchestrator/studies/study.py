"""A kind of study: one class per kind of sweep file (grid, random, Optuna, bracket, branch study,
ladder), each in its own module, behind the interface below. The driver, the dry run and the
trials ask the sweep's kind (studies/kinds.kind_of) and never test which one they have: a new kind
is a new module (or a class in a test) registered with kinds.register.

What a kind says:
- when it applies: a section of its own in the sweep file (`branch:`, `ladder:`, a registered
  kind's `section`), else `search.algorithm` naming it;
- the rules of the sweep file that hold for it alone (`rules`, run after sweep_file.RULES);
- the trials it plans (`values` x the seed replicates, resolved and checked: `plan`), and how
  one is resolved (`resolve`) and tagged (`run_tags`) in its trial's process;
- Tune's param space, searcher and number of samples (`search`);
- its words: the sweep's opening line (`describe`), the dry run's lines (`dry_run`);
- a phase before Tune (`before_ray`, `before_tune`: a branch study's base run).

The base class is a study whose trials are all listed before it starts and run as Tune's grid.
Pure but for what Tune's searchers need (Ray Tune is imported by `search` only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Tuple

from orchestrator.core import config as config_lib
from orchestrator.core.schema import Config
from orchestrator.core.sweep_schema import Section, Sweep
from orchestrator.studies import search_space
from orchestrator.studies.search_space import Trial, Values

Rule = Callable[[Sweep], None]


@dataclass(frozen=True)
class Search:
    """How Tune runs a study's trials."""

    space: Dict[str, Any]
    """Tune's param space: every trial's values under "trial" (a grid of them, or a distribution)."""
    searcher: Any = None
    """A Tune Searcher that proposes the trials (None: the param space lists them)."""
    samples: int = 1
    """Tune's num_samples: 1 for a listed grid, the most a searcher proposes otherwise."""


@dataclass
class Prepared:
    """A sweep file read with the command line's overrides and planned by its kind, as `sweep`,
    `sweep --dry-run` and `submit` all need it before anything starts."""

    study: "StudyKind"
    sweep: Sweep
    base: Config
    """The base config, with the overrides (they apply to every trial's base), validated."""
    unvalidated: Config
    """The same base, not validated, which every trial's values are resolved against
    (search_space.resolve): read once here, and carried to the trials' processes."""
    trials: Optional[List[Trial]]
    """The feasible trials, in order; None when a searcher proposes them as it runs (Optuna)."""
    skipped: List[Trial] = field(default_factory=list)
    """Infeasible trials left out (`infeasible: skip`)."""
    base_trial: Optional[Trial] = None
    """A trial trained in a phase of its own before the others (a branch study's base run)."""
    base_run: Optional[str] = None
    """The MLflow run of that phase, once it is known (found, or trained)."""
    parent_run: Optional[str] = None
    """The sweep's MLflow parent run, once the driver has opened it."""

    def all_trials(self) -> List[Trial]:
        """Every trial that runs first: the base trial, then the trials (the base config for a
        searcher that proposes them)."""
        if self.trials is None:
            return [Trial({}, self.base)]
        return ([self.base_trial] if self.base_trial else []) + self.trials


class DryRunLines(Protocol):
    """What the dry run (driver/dry_run.py) gives a kind to say its cost in: three layouts."""

    def listed(self, prepared: Prepared, title: str) -> List[str]:
        """Every trial with its cost, then the totals."""

    def bounded(self, prepared: Prepared, title: Callable[[int], str], repeats: int) -> List[str]:
        """The first round with its cost, then the range up to `repeats` trials of each group
        (`title` of the bound on trials)."""

    def ranged(self, prepared: Prepared, title: str, keys: List[str], corners: List[Trial], n: int) -> List[str]:
        """The cost of the corners of the space (`keys` change cost), then the range over `n` trials."""


class TunePhase(Protocol):
    """The driver's Tune run of a list of trials as a phase of its own (a branch study's base)."""

    def __call__(self, trials: List[Trial], tags: Dict[str, str], phase: str) -> None: ...


class StudyKind:
    """A kind of study; the base class: every trial listed up front, run as Tune's grid."""

    name: str = ""
    """The kind in words (`grid search`, `branch study`)."""
    algorithm: Optional[str] = None
    """The `search.algorithm` that asks for this kind (kinds without a section)."""
    section: Optional[Section] = None
    """A section of the sweep file of the kind's own: its key asks for the kind."""
    needs: Tuple[str, str] = ("", "")
    """(key, message) of the refusal when a kind with a section meets a `search.algorithm` other
    than its search_tag, a second kind's section, or a scheduler it does not take."""
    takes_scheduler: bool = True
    """Whether early stopping (`scheduler:`) may stop its trials."""
    search_tag: str = "grid"
    """The parent run's orchestrator.search tag: the search algorithm the kind runs."""
    rules: Tuple[Rule, ...] = ()
    """The sweep file's rules that hold for this kind alone, in the order they run."""
    own_keys: Tuple[str, ...] = ()
    """Keys of the file only this kind reads: another kind refuses them."""
    refused_keys: Mapping[str, str] = {}
    """Keys of the file this kind refuses when they are written, each with its reason."""
    bounded: bool = False
    """The number of trials is an upper bound (a searcher that stops early), not a count."""
    lone_trials: str = "trials have no such peer and are never stopped early"
    """What early stopping does to a trial with no peer in its group (the start line's words)."""

    def present(self, sweep: Sweep) -> bool:
        """Whether the file has this kind's section."""
        return self.section is not None and self.section.key in sweep.sections

    def values(self, sweep: Sweep) -> List[Values]:
        """The sampled values of every configuration the study trains, before seed replicates."""
        raise NotImplementedError(f"{type(self).__name__} lists no trials")

    def trials(self, sweep: Sweep, unvalidated: Optional[Config] = None) -> Optional[List[Trial]]:
        """Every trial, in a reproducible order, resolved (None: a searcher proposes them)."""
        base = unvalidated or search_space.unvalidated_base(sweep)
        seeds = search_space.seed_values(sweep, base)
        return [self.resolve(sweep, {**v, **s}, base) for v in self.values(sweep) for s in seeds]

    def plan(self, sweep: Sweep, base: Config) -> Prepared:
        """The trials split into feasible and skipped, checked for ASHA's alignment."""
        unvalidated = search_space.unvalidated_base(sweep)
        trials, skipped = search_space.split_feasible(sweep, self.trials(sweep, unvalidated))
        search_space.check_asha_alignment(sweep, trials)
        return Prepared(self, sweep, base, unvalidated, trials, skipped)

    def resolve(self, sweep: Sweep, values: Values, base: Optional[Config] = None) -> Trial:
        """A trial's values -> its validated config (what the trial's process runs)."""
        return search_space.resolve(sweep, values, base)

    def start_of(self, trial: Trial) -> int:
        """The tokens a trial starts training from (a branch: its branch point)."""
        return 0

    def run_tags(self, sweep: Sweep, cfg: Config) -> Dict[str, str]:
        """Tags of a trial's MLflow run that the kind adds (a ladder's rung)."""
        return {}

    def search(self, sweep: Sweep, trials: Optional[List[Trial]], runs: Dict[str, Any]) -> Search:
        """Tune's param space and searcher. `runs`: where the trials' MLflow runs are."""
        from ray import tune

        return Search({"trial": tune.grid_search([t.values for t in trials or []])})

    def describe(self, sweep: Sweep, trials: Optional[List[Trial]]) -> str:
        """How many trials, in the sweep's opening line."""
        return f"{len(trials or [])} trials"

    def dry_run(self, prepared: Prepared, lines: DryRunLines) -> List[str]:
        """The dry run's lines: every trial with its cost."""
        trials = counted(len(prepared.all_trials()), "trial")
        return lines.listed(
            prepared, f"sweep {prepared.sweep.name!r}: {trials} ({self.search_tag} search); nothing started"
        )

    def before_ray(self, prepared: Prepared) -> None:
        """Work on the plan before Ray starts (a branch study finds the run it branches from)."""

    def before_tune(self, prepared: Prepared, tune_phase: TunePhase) -> Dict[str, str]:
        """Phases before the study's Tune run (a branch study's base run), whose trials Tune runs
        as the kind's `search` lays them out; the tags every trial of that run gets."""
        return {}


def counted(n: float, noun: str) -> str:
    """`1 trial`, `3 trials`: a count in the dry run's and the sweep's words."""
    return f"{n:g} {noun}" + ("" if n == 1 else "s")


def validated_base(sweep: Sweep) -> Config:
    """The base config with the sweep's overrides, validated (a bad one fails here)."""
    return config_lib.load(sweep.base_config, sweep.base_overrides)
